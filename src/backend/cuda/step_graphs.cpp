#include "backend/cuda/step_graphs.h"

#include <algorithm>

#include "backend/cuda/check.h"

namespace dsv4::cuda {

StepGraphs::~StepGraphs() {
  for (const std::vector<cudaGraphExec_t>& kept : execs_)
    for (cudaGraphExec_t e : kept) cudaGraphExecDestroy(e);
}

// A failed update leaves the executable graph as it was (cudaErrorGraphExecUpdateFailure, not a
// sticky error), so the next kept one can be tried.
void StepGraphs::launch(cudaGraph_t graph, size_t part, cudaStream_t stream) {
  if (part >= execs_.size()) execs_.resize(part + 1);
  std::vector<cudaGraphExec_t>& kept = execs_[part];
  auto it = kept.begin();
  for (; it != kept.end(); ++it) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(*it, graph, &info) == cudaSuccess) break;
    (void)cudaGetLastError();
  }
  if (it == kept.end()) {
    cudaGraphExec_t exec = nullptr;
    DSV4_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    ++instantiated_;
    kept.insert(kept.begin(), exec);
    if (kept.size() > kKept) {
      // Not running: a part is launched once a step, and begin_capture waited for the last step.
      cudaGraphExecDestroy(kept.back());
      kept.pop_back();
    }
  } else {
    std::rotate(kept.begin(), it, it + 1);
  }
  DSV4_CUDA_CHECK(cudaGraphLaunch(kept.front(), stream));
  ++launched_;
}

}  // namespace dsv4::cuda
