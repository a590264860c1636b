#include "backend/cuda/step_graphs.h"

#include <algorithm>

#include "backend/cuda/check.h"

namespace dsv4::cuda {

StepGraphs::~StepGraphs() {
  for (cudaGraphExec_t e : execs_) cudaGraphExecDestroy(e);
}

// A failed update leaves the executable graph as it was (cudaErrorGraphExecUpdateFailure, not a
// sticky error), so the next kept one can be tried.
void StepGraphs::launch(cudaGraph_t graph, cudaStream_t stream) {
  auto it = execs_.begin();
  for (; it != execs_.end(); ++it) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(*it, graph, &info) == cudaSuccess) break;
    (void)cudaGetLastError();
  }
  if (it == execs_.end()) {
    cudaGraphExec_t exec = nullptr;
    DSV4_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    ++instantiated_;
    execs_.insert(execs_.begin(), exec);
    if (execs_.size() > kKept) {
      cudaGraphExecDestroy(execs_.back());  // not running: begin_capture waited for the last step
      execs_.pop_back();
    }
  } else {
    std::rotate(execs_.begin(), it, it + 1);
  }
  DSV4_CUDA_CHECK(cudaGraphLaunch(execs_.front(), stream));
  ++launched_;
}

}  // namespace dsv4::cuda
