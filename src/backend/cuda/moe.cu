// Mixture of experts: routing and the expert FFNs (twin of cpu/moe.cpp; architecture.md §3.6).
//
// Routing is fp32: s_e = sqrt(softplus(x·gateᵀ)); hash layers take tid2eid[token] (token ids read
// on the device), the others the top-k of s + bias (ties to the lower id). Weights are
// s_sel / Σ s_sel · routed_scale.
// Experts: g = min(x·w1ᵀ, L), u = clamp(x·w3ᵀ, ±L), h = round(silu(g)·u·w) (the routing weight is
// applied before w2), y = h·w2ᵀ. A token's output sums its experts in ascending id order, then
// the shared expert, in double, rounded once.
//
// Parallelisation: no host round trip for the routing. The routed experts run as one GEMM per
// projection over all (token, slot) rows, each row reading the matrix of its selected expert
// (GemmRequest.table), so decode reads only the selected experts' weights. Each row's arithmetic
// is the CPU's for that token alone (the CPU batches an expert's tokens, which changes nothing
// per row). In deepseek-tc decode, gate and up are one launch whose epilogue is the SwiGLU
// (tc_gemv), and the shared expert's products reuse the routed ones' quantized x where its form is
// the same (x_as_before). route: one block per token, the top-k as k block-wide argmax passes.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kRouteThreads = 128;
constexpr int kMaxExpertsPerToken = 32;
// Tokens per pass through the experts: bounds the [tokens, k, F] intermediates. A whole prefill
// chunk of 8 192 puts ≈ 192 rows on each expert (6 of 256 per token): the grouped products read
// each expert's weights once per 64 or 128 rows, so tiles are the fuller the more tokens pass at
// once (2 048 filled deepseek-tc's 128-row tiles three eighths).
constexpr int64_t kMoeTokenChunk = Backend::kMaxMoeTokenChunk;

// The better of two candidates (value, expert id): the higher value, ties to the lower id; -1 = none.
__device__ inline void better(float& v, int32_t& e, float v2, int32_t e2) {
  if (e2 >= 0 && (e < 0 || v2 > v || (v2 == v && e2 < e))) v = v2, e = e2;
}

__global__ void route_kernel(const float* logits, int64_t E, const float* bias, const int32_t* tid2eid,
                             int64_t n_vocab, const int32_t* tokens, int64_t k, float routed_scale, int32_t* sel,
                             float* weights) {
  await_previous_kernel();
  extern __shared__ float score[];  // [E] scores, then [E] taken flags
  int* taken = reinterpret_cast<int*>(score + E);
  __shared__ float warp_v[32];
  __shared__ int32_t warp_e[32];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) score[e] = sqrt_f(softplus_f(logits[t * E + e])), taken[e] = 0;
  __syncthreads();
  int32_t* st = sel + t * k;
  if (tid2eid) {
    if (threadIdx.x == 0) {
      const int64_t token = tokens[t];
      for (int64_t i = 0; i < k; ++i)
        st[i] = token >= 0 && token < n_vocab ? tid2eid[token * k + i] : -1;  // ids are checked by embed
    }
  } else {
    // k passes of a block-wide argmax over the experts not yet taken, by score + bias.
    for (int64_t i = 0; i < k; ++i) {
      float v = 0.0f;
      int32_t best = -1;
      for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
        if (!taken[e]) better(v, best, score[e] + bias[e], int32_t(e));
      for (int off = 16; off > 0; off >>= 1)
        better(v, best, __shfl_xor_sync(kFullMask, v, off), __shfl_xor_sync(kFullMask, best, off));
      if (lane == 0) warp_v[warp] = v, warp_e[warp] = best;
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int w = 1; w < int(blockDim.x / 32); ++w) better(v, best, warp_v[w], warp_e[w]);
        st[i] = best;
        if (best >= 0) taken[best] = 1;
      }
      __syncthreads();
    }
  }
  if (threadIdx.x != 0) return;
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) sum += st[i] >= 0 && st[i] < E ? score[st[i]] : 0.0f;
  for (int64_t i = 0; i < k; ++i)
    weights[t * k + i] = (st[i] >= 0 && st[i] < E ? score[st[i]] : 0.0f) / float(sum) * routed_scale;
}

// h = round(silu(min(g, L)) · clamp(u, ±L) · w), in place of g: grid (rows, groups of F), a thread
// per 4 consecutive elements of a row (float4 where F allows). (One thread per element, its row by
// an int64 division: 0.80 ms per call for the 49 152 routed rows of an 8 192-token chunk of
// V4-Flash on an H200, 1.5 TB/s.)
constexpr int kSwigluThreads = 256;
__global__ void __launch_bounds__(kSwigluThreads)
    swiglu_kernel(float* g, const float* u, int64_t F, const float* w, float limit, bool bf16) {
  await_previous_kernel();
  const int64_t row = blockIdx.x, f0 = (int64_t(blockIdx.y) * kSwigluThreads + threadIdx.x) * kRowGroup;
  if (f0 >= F) return;
  const bool whole = F % kRowGroup == 0;  // then every group is whole and 16-byte aligned
  float gv[kRowGroup], uv[kRowGroup];
  load4(g + row * F, f0, F, whole, gv);
  load4(u + row * F, f0, F, whole, uv);
#pragma unroll
  for (int k = 0; k < kRowGroup; ++k) gv[k] = swiglu_f(gv[k], uv[k], w ? w + row : nullptr, limit, bf16);
  store4(g + row * F, f0, F, whole, gv);
}

// out[t, d] = Σ_{slots by ascending expert id} expert_out[t, slot, d] (+ shared[t, d]), in double.
// Grid (T, groups of D): thread 0 orders the token's slots once, then a thread takes 4 consecutive
// d (float4 where D allows). (One thread per (t, d), each sorting the slots and splitting its flat
// index in int64: 0.84 ms per call at 8 192 tokens of V4-Flash on an H200, 1.3 TB/s; the 12
// launches of an 8K prefill of 4 layers, decode's included, 3.41 → 1.08 ms.)
constexpr int kCombineThreads = 256;
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_kernel(const float* expert_out, const float* shared, const int32_t* sel, int64_t k, int64_t D,
                       bool bf16, float* out) {
  await_previous_kernel();
  __shared__ int order[kMaxExpertsPerToken];
  const int64_t t = blockIdx.x, d0 = (int64_t(blockIdx.y) * kCombineThreads + threadIdx.x) * kRowGroup;
  if (threadIdx.x == 0) {
    const int32_t* s = sel + t * k;
    for (int i = 0; i < k; ++i) order[i] = i;
    for (int i = 1; i < k; ++i)  // insertion sort of the slots by expert id (k is small)
      for (int j = i; j > 0 && s[order[j]] < s[order[j - 1]]; --j) {
        const int tmp = order[j];
        order[j] = order[j - 1], order[j - 1] = tmp;
      }
  }
  __syncthreads();
  if (d0 >= D) return;
  const bool whole = D % kRowGroup == 0;  // then every group is whole and 16-byte aligned
  double acc[kRowGroup] = {};
  float v[kRowGroup];
#pragma unroll 2
  for (int i = 0; i < k; ++i) {
    load4(expert_out + (t * k + order[i]) * D, d0, D, whole, v);
#pragma unroll
    for (int u = 0; u < kRowGroup; ++u) acc[u] += v[u];
  }
  if (shared) {
    load4(shared + t * D, d0, D, whole, v);
#pragma unroll
    for (int u = 0; u < kRowGroup; ++u) acc[u] += v[u];
  }
#pragma unroll
  for (int u = 0; u < kRowGroup; ++u) v[u] = round_if(bf16, float(acc[u]));
  store4(out + t * D, d0, D, whole, v);
}

}  // namespace

void CudaBackend::route(const model::MoeWeights& m, const float* x, const int32_t* tokens, int64_t T, int64_t D,
                        int64_t k, double routed_scale, int32_t* sel, float* weights) {
  Timed timed(*this, "route");
  if (T == 0) return;
  const int64_t E = m.gate.out;
  const bool hash = !m.tid2eid.empty();
  DSV4_CUDA_REQUIRE(k > 0 && k <= E && (hash || int64_t(m.bias.size()) == E), "route: k ", k, " of ", E,
                    " experts, bias ", m.bias.size());
  DeviceArray<float> logits(memory_, size_t(T * E));
  linear(m.gate, Compute::f32, x, T, logits.get());
  launch(route_kernel, unsigned(T), kRouteThreads, size_t(E) * (sizeof(float) + sizeof(int)), stream_,
      logits.get(), E, hash ? nullptr : device_floats(m.bias), hash ? device_ints(m.tid2eid) : nullptr,
      hash ? int64_t(m.tid2eid.size()) / k : 0, tokens, k, float(routed_scale), sel, weights);
  DSV4_CUDA_LAUNCHED("route");
}

void CudaBackend::swiglu_hidden(GemmRequest gate, GemmRequest up, const float* row_weights, double limit, float* h) {
  const int64_t rows = gate.T, F = gate.rows;
  if (rows * F == 0) return;
  gate.y = h, gate.y_stride = F;
  if (on_tc_gemv(gate)) {  // decode: one launch reads both matrices and writes h
    const SwigluUp pair{up.W, up.table, row_weights, float(limit)};
    gemm(gate, &pair);
    return;
  }
  DeviceArray<float> u(memory_, size_t(rows * F));
  up.y = u.get(), up.y_stride = F;
  up.x_as_before = true;  // the same x as gate's: quantized once (two launches fewer per layer)
  gemm(gate);
  gemm(up);
  launch(swiglu_kernel, row_group_grid(rows, F, kSwigluThreads), kSwigluThreads, 0, stream_, h, u.get(), F, row_weights, float(limit), deepseek());
  DSV4_CUDA_LAUNCHED("moe (swiglu)");
}

void CudaBackend::moe(const model::MoeWeights& m, const float* x, const int32_t* sel, const float* weights,
                      int64_t T, int64_t D, int64_t k, double limit, float* out) {
  if (T == 0) return;
  const int64_t E = int64_t(m.experts.size());
  DSV4_CUDA_REQUIRE(E > 0 && k > 0 && k <= kMaxExpertsPerToken, "moe: ", E, " experts, k ", k);
  const int64_t F = m.experts[0].w1.out;
  auto ffn_bytes = [](const model::ExpertWeights& e) { return double(e.w1.bytes() + e.w2.bytes() + e.w3.bytes()); };
  // Weights read: the selected experts (all distinct when T·k ≤ E, as in decode) and the shared one.
  // Multiply-adds: three D × F products per routed (token, slot) row and per token for the shared expert.
  Timed timed(*this, "moe", {},
              double(std::min(T * k, E)) * ffn_bytes(m.experts[0]) + (m.shared ? ffn_bytes(*m.shared) : 0.0),
              6.0 * double(T) * double(k + (m.shared ? 1 : 0)) * double(D) * double(F));
  for (const model::ExpertWeights& e : m.experts)
    DSV4_CUDA_REQUIRE(e.w1.out == F && e.w3.out == F && e.w2.out == D && e.w1.in == D && e.w2.in == F,
                      "moe: expert ", e.w1.name, " shapes differ from the first expert's");
  const LinearView* w1 = device_expert_table(m, 1);
  const LinearView* w3 = device_expert_table(m, 3);
  const LinearView* w2 = device_expert_table(m, 2);

  for (int64_t c0 = 0; c0 < T; c0 += kMoeTokenChunk) {
    const int64_t nt = std::min(kMoeTokenChunk, T - c0);
    // Routed experts: rows (token, slot), each through the matrices of its selected expert.
    GemmRequest gate, up, down;
    for (GemmRequest* r : {&gate, &up, &down}) {
      r->W = device_linear(m.experts[0].w1);  // format/shape template; rows read their own view
      r->view_of_row = sel + c0 * k, r->n_views = E, r->compute = Compute::quantized, r->T = nt * k;
    }
    gate.table = w1, up.table = w3, down.table = w2;
    down.W = device_linear(m.experts[0].w2);
    gate.x = up.x = x + c0 * D, gate.x_stride = up.x_stride = D, gate.x_div = up.x_div = k;
    gate.rows = up.rows = F;
    DeviceArray<float> h(memory_, size_t(nt * k * F));
    swiglu_hidden(gate, up, weights + c0 * k, limit, h.get());

    // The shared expert's hidden rows next, while the routed products' quantized x (the same
    // rows) is still in the scratch.
    const int64_t Fs = m.shared ? m.shared->w1.out : 0;
    DeviceArray<float> hs(memory_, size_t(nt * Fs));
    GemmRequest sg, su, sd;
    if (m.shared) {
      sg.W = device_linear(m.shared->w1), su.W = device_linear(m.shared->w3), sd.W = device_linear(m.shared->w2);
      for (GemmRequest* r : {&sg, &su, &sd}) r->compute = Compute::quantized, r->T = nt;
      sg.x = su.x = x + c0 * D, sg.x_stride = su.x_stride = D;
      sg.rows = su.rows = Fs;
      sg.x_as_before = true;
      swiglu_hidden(sg, su, nullptr, limit, hs.get());
    }

    DeviceArray<float> expert_out(memory_, size_t(nt * k * D));
    down.x = h.get(), down.x_stride = F, down.rows = D, down.y = expert_out.get(), down.y_stride = D;
    gemm(down);
    DeviceArray<float> shared(memory_, size_t(nt * (m.shared ? D : 0)));
    if (m.shared) {
      sd.x = hs.get(), sd.x_stride = Fs, sd.rows = D, sd.y = shared.get(), sd.y_stride = D;
      gemm(sd);
    }
    launch(moe_combine_kernel, row_group_grid(nt, D, kCombineThreads), kCombineThreads, 0, stream_, expert_out.get(), shared.get(), sel + c0 * k, k, D,
           deepseek(), out + c0 * D);
    DSV4_CUDA_LAUNCHED("moe (combine)");
  }
}

}  // namespace dsv4::cuda
