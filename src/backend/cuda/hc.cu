// Manifold-constrained hyper-connections: mHC pre with Sinkhorn, mHC post, and the HC head (twin
// of cpu/hc.cpp; architecture.md §3.2.1–§3.2.3). All fp32; only the collapsed input u, the head
// output y and the new HC state are rounded (to bf16 in deepseek numerics).
//
// Parallelisation: the mix projection x·fnᵀ is the shared GEMM (fp32 path). Then blocks per
// token: the stream RMS is a block-wide double reduction (each block its own), every thread
// computes the hc pre gates it needs, the Sinkhorn iterations take one lane per hc×hc element in
// warp 0 of the token's last block (a serial loop in one thread took most of the op's time in
// decode), and the other warps write u. At decode (few tokens) the Sinkhorn's block does only
// that, while a few more blocks of 1024 threads write u over slices of D; each keeps several
// loads in flight per thread (with 256 threads each waiting on one load at a time, hc_pre took
// 50 µs per token on an H200). In prefill one block of 256 threads per token does everything, so
// its state is read once, and the many blocks per SM hide the Sinkhorn's latency (two blocks per
// token, the Sinkhorn's holding 1024 threads: 1.17 ms per call at 8 192 tokens).
// hc_pre_norm in prefill, the sublayer's input norm joined: the norm needs a token's whole u, so
// its one block per token does it, the norm's mean a block reduction after the collapse (at
// decode it stays hc_pre then rms_norm: see hc_pre_norm).
// hc_post: a thread per 4 d of a token, all hc streams (in place: the engine passes X_out = X).
// hc_post_pre_norm at decode: one launch for hc_post, the mix product, hc_pre and the norm, whose
// blocks meet at grid barriers (hc_step_kernel); an H100 ran them as four launches of ≈ 32 µs in
// all per sublayer boundary (a decoded token at 4K: 5.2 + 7.0 + 14 + 5.9 µs).
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/grid_barrier.cuh"
#include "backend/cuda/launch.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kTokenThreads = 1024, kPrefillThreads = 256;
constexpr int64_t kMaxPreSlices = 4;  // hc_pre's blocks over D per token
constexpr int kMaxHc = 5;  // hc·hc ≤ 32: the Sinkhorn runs in one warp (hc_mult is 4 in every V4 config)

// rsqrt(mean(x²) + eps) over the flattened hc·D state of one token (a block-wide reduction).
__device__ float stream_rms_inverse(const float* x, int64_t n, float eps, double* scratch) {
  double sum = 0.0;
  for_each_element(x, n, [&](float v, int64_t) { sum += double(v) * double(v); });
  sum = block_sum(sum, scratch);
  return rms_inverse(sum, n, eps);
}

// Sinkhorn projection of the hc×hc comb logits in one warp's registers: lane j·hc + k holds
// M[j, k] and gets back its projected value (lanes past hc·hc compute garbage that is not used).
// A row softmax + eps, a column normalisation, then (iters − 1) row/column normalisation pairs;
// each element sees the serial loop's arithmetic (its row or column summed in double in index
// order, then one division). (In shared memory with two block barriers per step, the 40 steps
// took 17 µs per token.)
__device__ float sinkhorn(float m, int hc, int64_t iters, float eps) {
  const int q = threadIdx.x % 32, j = q / hc, k = q % hc;
  auto element = [&](float v, int r, int c) { return __shfl_sync(kFullMask, v, r * hc + c); };
  auto row_sum = [&](float v) {
    double sum = 0.0;
    for (int i = 0; i < hc; ++i) sum += element(v, j, i);
    return sum;
  };
  auto col_sum = [&](float v) {
    double sum = 0.0;
    for (int i = 0; i < hc; ++i) sum += element(v, i, k);
    return sum;
  };
  float mx = element(m, j, 0);
  for (int i = 1; i < hc; ++i) mx = fmaxf(mx, element(m, j, i));
  m = exp_f(m - mx);
  m = m / float(row_sum(m)) + eps;
  m /= float(col_sum(m)) + eps;
  for (int64_t it = 1; it < iters; ++it) {
    m /= float(row_sum(m)) + eps;
    m /= float(col_sum(m)) + eps;
  }
  return m;
}

// u[d] = Σ_h pre_h · x[h·stride + d] for d < n (sequential over h, in double, rounded once), by
// `workers` threads of which this is number `worker`. Returns the sum of the written u² (in
// double), this thread's share of the input norm's mean.
__device__ double collapse(const float* x, int64_t stride, const double (&pre)[kMaxHc], int hc, int64_t n, int worker,
                           int workers, bool bf16, float* u) {
  double squares = 0.0;
#pragma unroll 4
  for (int64_t d = worker; d < n; d += workers) {
    double acc = 0.0;
#pragma unroll
    for (int h = 0; h < kMaxHc; ++h)
      if (h < hc) acc += pre[h] * double(x[h * stride + d]);
    const float v = round_if(bf16, float(acc));
    u[d] = v;
    squares += double(v) * double(v);
  }
  return squares;
}

struct HcArgs {
  const float* base;
  float scale0, scale1, scale2;
  int hc;
  int64_t D, mix_n, sinkhorn_iters;
  float hc_eps, norm_eps;
  bool bf16;
};

// The pre gates of a token (mix row m, stream RMS inverse rs) as doubles: every thread its own.
__device__ inline void pre_gates(const HcArgs& a, const float* m, float rs, double (&pre)[kMaxHc]) {
#pragma unroll
  for (int h = 0; h < kMaxHc; ++h)
    pre[h] = h < a.hc ? double(sigmoid_f(m[h] * rs * a.scale0 + a.base[h]) + a.hc_eps) : 0.0;
}

// The post gates and the Sinkhorn-projected comb of token t (mix row m, stream RMS inverse rs),
// written by the 32 lanes of one warp.
__device__ inline void post_and_comb(const HcArgs& a, const float* m, float rs, int64_t t, float* post, float* comb) {
  const int hc = a.hc, e = threadIdx.x % 32;
  if (e < hc) post[t * hc + e] = 2.0f * sigmoid_f(m[hc + e] * rs * a.scale1 + a.base[hc + e]);
  const float logit = e < hc * hc ? m[2 * hc + e] * rs * a.scale2 + a.base[2 * hc + e] : 0.0f;
  const float projected = sinkhorn(logit, hc, a.sinkhorn_iters, a.hc_eps);
  if (e < hc * hc) comb[t * hc * hc + e] = projected;
}

// Grid (T, parts). parts > 1: block (t, s < parts − 1) writes u over the s-th slice of D, block
// (t, parts − 1) the post gates and the Sinkhorn in its warp 0. parts = 1: the one block does both,
// u by its warps after the first. Each block finds the stream RMS itself. With a norm weight w
// (parts = 1: the norm needs all of u), the block then writes x = RMSNorm(u) as rms_norm_kernel
// does: the mean of u² in double, inv = rsqrt(fp32(mean) + eps), x = w · (u · inv) rounded; each
// thread rereads the u it wrote (in prefill this saves the separate norm's pass over the rows).
__global__ void __launch_bounds__(kTokenThreads) hc_pre_kernel(HcArgs a, const float* X, const float* mix,
                                                               const float* w, float* u, float* post, float* comb,
                                                               float* x_norm) {
  await_previous_kernel();
  __shared__ double scratch[32];
  const int64_t t = blockIdx.x;
  const int hc = a.hc, e = threadIdx.x, parts = int(gridDim.y);
  const float* x = X + t * hc * a.D;
  const float rs = stream_rms_inverse(x, hc * a.D, a.norm_eps, scratch);
  const float* m = mix + t * a.mix_n;  // scaled by rs where used
  const bool gates_block = int(blockIdx.y) == parts - 1, sinkhorn_warp = gates_block && e < 32;
  double squares = 0.0;
  if (sinkhorn_warp) {
    post_and_comb(a, m, rs, t, post, comb);
    if (!w) return;
  } else {
    if (gates_block && parts > 1) return;
    double pre[kMaxHc];
    pre_gates(a, m, rs, pre);
    const int slices = parts > 1 ? parts - 1 : 1, first = gates_block ? 32 : 0;  // (threads before first: the Sinkhorn)
    const int64_t per = (a.D + slices - 1) / slices, d_begin = blockIdx.y * per;
    squares = collapse(x + d_begin, a.D, pre, hc, min(a.D, d_begin + per) - d_begin, e - first,
                       int(blockDim.x) - first, a.bf16, u + t * a.D + d_begin);
    if (!w) return;
  }
  // The norm (parts = 1, every thread of the block here): the collapse's threads reread their d.
  const float inv = rms_inverse(block_sum(squares, scratch), a.D, a.norm_eps);
  if (sinkhorn_warp) return;
  const float* ut = u + t * a.D;
  float* xt = x_norm + t * a.D;
  for (int64_t d = e - 32; d < a.D; d += int(blockDim.x) - 32) xt[d] = round_if(a.bf16, w[d] * (ut[d] * inv));
}

__global__ void __launch_bounds__(kTokenThreads) hc_head_kernel(HcArgs a, const float* X, const float* mix, float* y) {
  await_previous_kernel();
  __shared__ double scratch[32];
  const int64_t t = blockIdx.x;
  const int hc = a.hc;
  const float* x = X + t * hc * a.D;
  const float rs = stream_rms_inverse(x, hc * a.D, a.norm_eps, scratch);
  double pre[kMaxHc];
  pre_gates(a, mix + t * hc, rs, pre);
  collapse(x, a.D, pre, hc, a.D, int(threadIdx.x), int(blockDim.x), a.bf16, y + t * a.D);
}

// X'[t, k, d] = post_k · a[t, d] + Σ_j comb[j, k] · X[t, j, d]. Grid (T, groups of D): a thread
// takes 4 consecutive d of token t (float4 loads where D allows) and reads all their inputs before
// writing their outputs (so X_out may be X). (One thread per (t, d), each fetching the token's 20
// gates and splitting its flat index in int64: 789 µs per call at 8 192 tokens on an H200, 1.5 TB/s.)
constexpr int kPostThreads = 256;
__global__ void __launch_bounds__(kPostThreads) hc_post_kernel(const float* a, const float* X, const float* post,
                                                                const float* comb, int hc, int64_t D, bool bf16,
                                                                float* X_out) {
  await_previous_kernel();
  const int64_t t = blockIdx.x, d0 = (int64_t(blockIdx.y) * kPostThreads + threadIdx.x) * kRowGroup;
  if (d0 >= D) return;
  const bool whole = D % kRowGroup == 0;  // then every group is whole and 16-byte aligned
  float in[kMaxHc][kRowGroup], act[kRowGroup];
#pragma unroll
  for (int j = 0; j < kMaxHc; ++j)
    if (j < hc) load4(X + (t * hc + j) * D, d0, D, whole, in[j]);
  load4(a + t * D, d0, D, whole, act);
  const float* M = comb + t * hc * hc;
#pragma unroll
  for (int k = 0; k < kMaxHc; ++k) {
    if (k >= hc) break;
    double w[kMaxHc];
#pragma unroll
    for (int j = 0; j < kMaxHc; ++j) w[j] = j < hc ? double(M[j * hc + k]) : 0.0;
    const double p = double(post[t * hc + k]);
    float out[kRowGroup];
#pragma unroll
    for (int u = 0; u < kRowGroup; ++u) {
      double acc = p * double(act[u]);
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j)
        if (j < hc) acc += w[j] * double(in[j][u]);
      out[u] = round_if(bf16, float(acc));
    }
    store4(X_out + (t * hc + k) * D, d0, D, whole, out);
  }
}

// From one sublayer to the next at decode (hc_post_pre_norm): hc_post, the next sublayer's mix
// product, hc_pre and its input norm in one launch, across two grid barriers (grid_barrier.cuh).
// Grid (slices + 1, T): block (s < slices, t) owns dims [s·per, s·per + per) of token t on every
// stream; block (slices, t) makes the token's post gates and comb.
//   1. Slice blocks: X' = hc_post over the slice, kept in shared memory and written over X; the
//      slice's partial sums of the mix product x·fnᵀ and of X'² (doubles) into `partials`.
//   2. After the barrier, every block: the token's mix and stream RMS from the partials, summed in
//      slice order. The gates block: post and comb (then it is done). Slice blocks: u over the
//      slice (collapse), its partial Σu².
//   3. After the second barrier (the gates block arrives at it without waiting), slice blocks:
//      the norm's mean from the partials in slice order, x = w·(u·inv) over the slice.
// Each value is computed as hc_post_kernel, the GEMV's double path (an exact sum of exact products,
// rounded once), hc_pre_kernel and rms_norm_kernel compute it: only the order of the double sums
// differs (device_math.cuh). The slice's rows of fn, a weight, are fetched into L2 before the
// previous kernel is awaited.
constexpr int kStepThreads = 256;
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;
constexpr int kMixLoads = 8;  // loads in flight a lane: a V4-Flash slice's 512 values of a mix row in two rounds (16 spilled)
struct HcStepArgs {
  HcArgs pre;  // the next sublayer's mHC pre
  const float* fn;  // its mix weights, fp32 [mix_n, hc·D]
  const float* w;   // its input norm's weight
  const float *a, *post, *comb;  // the output of the sublayer left and its gates
  float *X, *u, *post_out, *comb_out, *x;
  double* partials;  // [T, slices, mix_n + 1] for step 1, then [T, slices] for step 2
  unsigned* barrier;
  int64_t per;  // dims per slice
};

// Asks for the lines of [p, p + bytes) in L2 without waiting (every address it names is inside the
// range).
__device__ inline void prefetch_l2(const float* p, int64_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + uintptr_t(bytes);
  for (uintptr_t line = begin & ~uintptr_t(127); line < end; line += 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line < begin ? begin : line));
}

// Σ_q p[q·stride] over q < n, written by other blocks before a grid barrier, by one warp: each lane
// sums its q ≡ lane (mod 32), then the warp (the same order in every launch). A lane at a time
// took ≈ n dependent L2 round trips.
__device__ inline double slice_sum(const double* p, int64_t stride, int n) {
  double sum = 0.0;
  for (int q = threadIdx.x % 32; q < n; q += 32) sum += __ldcg(p + q * stride);
  return warp_sum(sum);
}

__global__ void __launch_bounds__(kStepThreads) hc_step_kernel(HcStepArgs s) {
  extern __shared__ float xs[];  // [hc][per]: X' over the block's slice
  __shared__ double scratch[32];
  __shared__ float mix[kMaxMix], norm_inv[2];  // the token's mix row; 1/RMS of its streams, of u
  const HcArgs& a = s.pre;
  const int hc = a.hc, e = threadIdx.x, warp = e / 32, lane = e % 32, warps = int(blockDim.x) / 32;
  const int slices = int(gridDim.x) - 1, slice = int(blockIdx.x);
  const unsigned block = blockIdx.y * gridDim.x + blockIdx.x, blocks = gridDim.x * gridDim.y;
  const bool gates = slice == slices;
  const int64_t t = blockIdx.y, D = a.D, mix_n = a.mix_n, d0 = slice * s.per;
  const int64_t nd = gates ? 0 : min(s.per, D - d0);  // dims of the slice
  const int n = int(hc * nd);                           // its values on every stream
  for (int64_t r = e; r < mix_n * hc; r += blockDim.x) prefetch_l2(s.fn + r * D + d0, nd * int64_t(sizeof(float)));
  await_previous_kernel();
  double* part = s.partials + t * slices * (mix_n + 1);                    // [slices][mix_n + 1]
  double* part_u = s.partials + int64_t(gridDim.y) * slices * (mix_n + 1) + t * slices;  // [slices]

  if (!gates) {
    const float *post = s.post + t * hc, *comb = s.comb + t * hc * hc, *act = s.a + t * D + d0;
    float* X = s.X + t * hc * D + d0;
    for (int i = e; i < n; i += blockDim.x) {
      const int k = i / int(nd), d = i - k * int(nd);
      double acc = double(post[k]) * double(act[d]);
      for (int j = 0; j < hc; ++j) acc += double(comb[j * hc + k]) * double(X[j * D + d]);
      xs[k * s.per + d] = round_if(a.bf16, float(acc));
    }
    __syncthreads();  // every read of X is done: X' may go over it
    double squares = 0.0;
    for (int i = e; i < n; i += blockDim.x) {
      const int k = i / int(nd), d = i - k * int(nd);
      const float v = xs[k * s.per + d];
      X[k * D + d] = v;
      squares += double(v) * double(v);
    }
    squares = block_sum(squares, scratch);
    if (e == 0) part[slice * (mix_n + 1) + mix_n] = squares;
    for (int64_t m = warp; m < mix_n; m += warps) {  // a warp per mix row, kMixLoads loads in flight a lane
      const float* fn = s.fn + m * hc * D + d0;
      double acc = 0.0;
      for (int i0 = lane; i0 < n; i0 += 32 * kMixLoads) {
        float wv[kMixLoads], xv[kMixLoads];
#pragma unroll
        for (int j = 0; j < kMixLoads; ++j) {
          const int i = i0 + 32 * j, k = i / int(nd), d = i - k * int(nd);
          wv[j] = i < n ? fn[k * D + d] : 0.0f;
          xv[j] = i < n ? xs[k * s.per + d] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kMixLoads; ++j) acc += double(wv[j]) * double(xv[j]);
      }
      acc = warp_sum(acc);
      if (lane == 0) part[slice * (mix_n + 1) + m] = acc;
    }
  }
  grid_sync(s.barrier, block, blocks);

  for (int64_t c = warp; c <= mix_n; c += warps) {  // a warp per column of the partials
    const double sum = slice_sum(part + c, mix_n + 1, slices);
    if (lane == 0 && c < mix_n) mix[c] = float(sum);
    if (lane == 0 && c == mix_n) norm_inv[0] = rms_inverse(sum, hc * D, a.norm_eps);
  }
  __syncthreads();
  const float rs = norm_inv[0];
  if (gates) {
    if (e == 0) grid_arrive(s.barrier, block, blocks);  // nothing after this block's gates waits for them
    if (warp == 0) post_and_comb(a, mix, rs, t, s.post_out, s.comb_out);
    return;
  }
  double pre[kMaxHc];
  pre_gates(a, mix, rs, pre);
  float* u = s.u + t * D + d0;
  const double squares = block_sum(collapse(xs, s.per, pre, hc, nd, e, blockDim.x, a.bf16, u), scratch);
  if (e == 0) part_u[slice] = squares;
  grid_sync(s.barrier, block, blocks);

  if (warp == 0) {
    const double sum = slice_sum(part_u, 1, slices);
    if (lane == 0) norm_inv[1] = rms_inverse(sum, D, a.norm_eps);
  }
  __syncthreads();
  const float inv = norm_inv[1];
  for (int64_t d = e; d < nd; d += blockDim.x) s.x[t * D + d0 + d] = round_if(a.bf16, s.w[d0 + d] * (u[d] * inv));
}

}  // namespace

void CudaBackend::hc_pre(const model::HcParams& p, const float* X, int64_t T, int64_t hc, int64_t D,
                         int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post, float* comb) {
  Timed timed(*this, "hc_pre");
  launch_hc_pre(p, nullptr, X, T, hc, D, sinkhorn_iters, hc_eps, norm_eps, u, post, comb, nullptr);
}

void CudaBackend::hc_pre_norm(const model::HcParams& p, const float* w, const float* X, int64_t T, int64_t hc,
                              int64_t D, int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post,
                              float* comb, float* x) {
  // At decode the slices of D beside the Sinkhorn's block, then the norm's launch, are faster than
  // one block per token doing all three (H100, 4 layers: 17.5 µs a call against 13.9 + 5.8, and
  // decode 0.6–1% slower); in prefill the joined norm saves a pass over the rows.
  if (2 * T <= sm_count_) return Backend::hc_pre_norm(p, w, X, T, hc, D, sinkhorn_iters, hc_eps, norm_eps, u, post,
                                                      comb, x);
  Timed timed(*this, "hc_pre_norm");
  DSV4_CUDA_REQUIRE(w != nullptr, "hc_pre_norm: no norm weight");
  // w is a model weight (host memory): its device copy, uploaded once.
  const float* dw = static_cast<const float*>(upload(w, size_t(D) * sizeof(float)));
  launch_hc_pre(p, dw, X, T, hc, D, sinkhorn_iters, hc_eps, norm_eps, u, post, comb, x);
}

void CudaBackend::hc_post_pre_norm(const float* a, float* X, const float* post, const float* comb,
                                   const model::HcParams& p, const float* w, int64_t T, int64_t hc, int64_t D,
                                   int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u, float* post_out,
                                   float* comb_out, float* x) {
  // One launch for a few tokens (each block reads its slice of fn once per token); else hc_post,
  // then hc_pre_norm. Slices of at least kMinSliceDims dims, one block per SM at most in all (see
  // grid_barrier.cuh), X' of a slice in shared memory.
  constexpr int64_t kMaxTokens = 8, kMinSliceDims = 128;
  const int64_t mix_n = p.fn.out;
  const int64_t slices = std::min<int64_t>(sm_count_ / std::max<int64_t>(T, 1) - 1, (D + kMinSliceDims - 1) / kMinSliceDims);
  const int64_t per = slices > 0 ? (D + slices - 1) / slices : 0;
  const size_t smem = size_t(hc * per) * sizeof(float);
  if (T > kMaxTokens || slices < 1 || p.fn.format != model::WeightFormat::f32 || hc > kMaxHc ||
      mix_n != (2 + hc) * hc || smem > 96 * 1024)
    return Backend::hc_post_pre_norm(a, X, post, comb, p, w, T, hc, D, sinkhorn_iters, hc_eps, norm_eps, u, post_out,
                                     comb_out, x);
  Timed timed(*this, "hc_post_pre_norm");
  if (T == 0) return;
  DSV4_CUDA_REQUIRE(w != nullptr && p.scale.size() >= 3 && int64_t(p.base.size()) >= mix_n && post_out != post &&
                        comb_out != comb,
                    "hc_post_pre_norm: hc ", hc, ", fn rows ", mix_n, ", base ", p.base.size(), ", scale ",
                    p.scale.size(), w ? "" : ", no norm weight", post_out == post || comb_out == comb ? ", gates in place" : "");
  const int64_t slices_used = (D + per - 1) / per;  // (rounding per up may leave the last slice empty)
  DeviceArray<double> partials(memory_, size_t(T * slices_used * (mix_n + 2)));
  HcStepArgs s{};
  s.pre = HcArgs{device_floats(p.base), p.scale[0], p.scale[1], p.scale[2], int(hc), D, mix_n, sinkhorn_iters,
                 float(hc_eps), float(norm_eps), deepseek()};
  s.fn = reinterpret_cast<const float*>(device_linear(p.fn).data);
  s.w = static_cast<const float*>(upload(w, size_t(D) * sizeof(float)));  // a model weight: uploaded once
  s.a = a, s.post = post, s.comb = comb;
  s.X = X, s.u = u, s.post_out = post_out, s.comb_out = comb_out, s.x = x;
  s.partials = partials.get();
  s.barrier = grid_barrier_;
  s.per = per;
  allow_shared_memory(reinterpret_cast<const void*>(hc_step_kernel), smem, "hc_post_pre_norm");
  launch(hc_step_kernel, dim3(unsigned(slices_used + 1), unsigned(T)), kStepThreads, smem, stream_, s);
  DSV4_CUDA_LAUNCHED("hc_post_pre_norm");
}

void CudaBackend::launch_hc_pre(const model::HcParams& p, const float* w, const float* X, int64_t T, int64_t hc,
                                int64_t D, int64_t sinkhorn_iters, double hc_eps, double norm_eps, float* u,
                                float* post, float* comb, float* x) {
  if (T == 0) return;
  const int64_t mix_n = p.fn.out;  // (2 + hc)·hc
  DSV4_CUDA_REQUIRE(hc <= kMaxHc && mix_n == (2 + hc) * hc && p.scale.size() >= 3 &&
                        int64_t(p.base.size()) >= mix_n,
                    "hc_pre: hc ", hc, ", fn rows ", mix_n, ", base ", p.base.size(), ", scale ", p.scale.size());
  DeviceArray<float> mix(memory_, size_t(T * mix_n));
  // x·fnᵀ first, then the rms scale (§3.2.1); the HC state holds bf16 values (§3.2.2)
  linear(p.fn, Compute::f32_bf16_in, X, T, mix.get());
  const HcArgs a{device_floats(p.base), p.scale[0], p.scale[1], p.scale[2], int(hc), D, mix_n, sinkhorn_iters,
                 float(hc_eps), float(norm_eps), deepseek()};
  // At decode, slices of D for u while another block runs the Sinkhorn: as many as leave one block
  // per SM (the op is these few blocks; one block doing it all took 16 µs on an H200). With a block
  // per SM or more, or with the norm (it needs all of u in one block), one block per token.
  const bool few = 2 * T <= sm_count_;
  const int parts = few && !w ? int(std::clamp<int64_t>(sm_count_ / T - 1, 1, kMaxPreSlices)) + 1 : 1;
  launch(hc_pre_kernel, dim3(unsigned(T), unsigned(parts)), few ? kTokenThreads : kPrefillThreads, 0, stream_, a, X,
         mix.get(), w, u, post, comb, x);
  DSV4_CUDA_LAUNCHED("hc_pre");
}

void CudaBackend::hc_post(const float* a, const float* X, const float* post, const float* comb, int64_t T,
                          int64_t hc, int64_t D, float* X_out) {
  Timed timed(*this, "hc_post");
  if (T * D == 0) return;
  DSV4_CUDA_REQUIRE(hc <= kMaxHc, "hc_post: hc ", hc, " above ", kMaxHc);
  launch(hc_post_kernel, row_group_grid(T, D, kPostThreads), kPostThreads, 0, stream_, a, X, post, comb, int(hc), D, deepseek(), X_out);
  DSV4_CUDA_LAUNCHED("hc_post");
}

void CudaBackend::hc_head(const model::HcParams& p, const float* X, int64_t T, int64_t hc, int64_t D, double hc_eps,
                          double norm_eps, float* y) {
  Timed timed(*this, "hc_head");
  if (T == 0) return;
  DSV4_CUDA_REQUIRE(hc <= kMaxHc && p.fn.out == hc && !p.scale.empty() && int64_t(p.base.size()) >= hc,
                    "hc_head: hc ", hc, ", fn rows ", p.fn.out);
  DeviceArray<float> mix(memory_, size_t(T * hc));
  linear(p.fn, Compute::f32_bf16_in, X, T, mix.get());
  const HcArgs a{device_floats(p.base), p.scale[0], 0.0f, 0.0f, int(hc), D, hc, 0, float(hc_eps), float(norm_eps),
                 deepseek()};
  launch(hc_head_kernel, unsigned(T), kTokenThreads, 0, stream_, a, X, mix.get(), y);
  DSV4_CUDA_LAUNCHED("hc_head");
}

}  // namespace dsv4::cuda
