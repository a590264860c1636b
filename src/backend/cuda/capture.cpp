// Decode steps as CUDA graphs (backend.h "captured steps"; stream_memory.h, step_graphs.h). A
// 4-layer V4-Flash step launches ≈ 250 kernels: at 2.7 µs of host time each, launched one by one,
// the host took longer to queue a step than the GPU to run it (bench/cuda_decode.md). Recorded
// whole, though, a step's recording and its run add up; so each sublayer is launched as soon as it
// is recorded, and the GPU runs it while the host records the next. Prefill chunks, of many rows,
// are few long kernels and stay eager.
#include "backend/cuda/cuda_backend.h"

namespace dsv4::cuda {

bool CudaBackend::begin_capture(int64_t rows) {
  if (!graphs_enabled_ || profile_ || rows > kMaxCapturedRows) return false;
  memory_.begin_capture();
  part_ = 0;
  return true;
}

void CudaBackend::launch_part() {
  memory_.end_capture([this](cudaGraph_t graph) { graphs_.launch(graph, part_++, stream_); });
}

void CudaBackend::flush_capture() {
  launch_part();
  memory_.resume_capture();
}

void CudaBackend::end_capture(bool run) {
  if (run) {
    launch_part();
    ++captured_steps_;
    return;
  }
  memory_.end_capture({});
  // What the dropped work would have left: the cyclic ids it filled, the activations it quantized.
  cyclic_period_ = 0, cyclic_n_ = 0;
  quantized_x_ = {};
}

}  // namespace dsv4::cuda
