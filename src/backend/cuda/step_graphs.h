// Launching captured steps (capture.cpp). Each decode step is captured afresh, since its kernels
// take positions, row counts and grid sizes by value, and then launched through an executable graph
// of the same shape, updated to it: cudaGraphExecUpdate costs a fraction of an instantiation, and a
// captured, updated and launched kernel costs the host about a third of a kernel launched directly
// (bench/cuda/graph_launch_cost.cu). A step comes in parts (one per sublayer), each with executable
// graphs of its own. A part differs in shape from step to step (a compressor completing a window
// runs more kernels), so the few shapes each part used last are kept.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace dsv4::cuda {

class StepGraphs {
 public:
  StepGraphs() = default;
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;
  // Runs `graph`, the part'th of a step, on `stream` through a kept executable graph of that
  // part updated to it, or a new one.
  void launch(cudaGraph_t graph, size_t part, cudaStream_t stream);
  int64_t launched() const { return launched_; }
  int64_t instantiated() const { return instantiated_; }

 private:
  static constexpr size_t kKept = 4;
  std::vector<std::vector<cudaGraphExec_t>> execs_;  // by part; most recently used first
  int64_t launched_ = 0, instantiated_ = 0;
};

}  // namespace dsv4::cuda
