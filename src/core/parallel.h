// parallel_for: the CPU backend's only threading primitive (OpenMP underneath).
#pragma once

#include <cstdint>

namespace dsv4 {

// Calls body(i) for i in [0, n) across the worker threads; static schedule, so a given i always
// runs the same arithmetic regardless of the thread count (results never depend on threads).
template <class Body>
void parallel_for(int64_t n, Body&& body) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// As parallel_for, with dynamic scheduling for uneven work items (experts, heads).
template <class Body>
void parallel_for_dynamic(int64_t n, Body&& body) {
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) body(i);
}

int n_threads();

}  // namespace dsv4
