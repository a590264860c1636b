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
// all per sublayer boundary (a decoded token at 4K: 5.2 + 7.0 + 14 + 5.9 µs), and runs the one
// launch in 14.3 µs.
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

// f(Hc<hc>{}) for a run-time hc in [1, kMaxHc]: code with loops over the streams unrolled and a
// token's loads issued together (a guard per unrolled step kept each load in a basic block of its
// own, so they went one at a time).
template <int kHc>
struct Hc {
  static constexpr int value = kHc;
};
template <class F>
__device__ inline void with_hc(int hc, F f) {
  switch (hc) {
    case 1: return f(Hc<1>{});
    case 2: return f(Hc<2>{});
    case 3: return f(Hc<3>{});
    case 4: return f(Hc<4>{});
    default: return f(Hc<kMaxHc>{});
  }
}

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
// order, then one division). hc is a template argument so that a sum's shuffles are issued
// together: with hc known only at run time each took its own round trip, and the 40 steps took
// 13.5 µs of a decoded token's mHC kernel on an H100 (clock64 stamps). (In shared memory with two
// block barriers per step, they took 17 µs per token.)
template <int kHc>
__device__ float sinkhorn(float m, int64_t iters, float eps) {
  const int q = threadIdx.x % 32, j = q / kHc, k = q % kHc;
  // Σ_i of the elements at lanes first + i·step, in index order, in double
  auto sum = [&](float v, int first, int step) {
    float e[kHc];
#pragma unroll
    for (int i = 0; i < kHc; ++i) e[i] = __shfl_sync(kFullMask, v, first + i * step);
    double total = 0.0;
#pragma unroll
    for (int i = 0; i < kHc; ++i) total += e[i];
    return total;
  };
  float row[kHc];
#pragma unroll
  for (int i = 0; i < kHc; ++i) row[i] = __shfl_sync(kFullMask, m, j * kHc + i);
  float mx = row[0];
#pragma unroll
  for (int i = 1; i < kHc; ++i) mx = fmaxf(mx, row[i]);
  m = exp_f(m - mx);
  m = m / float(sum(m, j * kHc, 1)) + eps;
  m /= float(sum(m, k, kHc)) + eps;
  for (int64_t it = 1; it < iters; ++it) {
    m /= float(sum(m, j * kHc, 1)) + eps;
    m /= float(sum(m, k, kHc)) + eps;
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

// The post gates of token t (mix row m, stream RMS inverse rs), by lanes e < hc of a warp.
template <int kHc>
__device__ inline void post_gates(const HcArgs& a, const float* m, float rs, int64_t t, float* post) {
  const int e = threadIdx.x % 32;
  if (e < kHc) post[t * kHc + e] = 2.0f * sigmoid_f(m[kHc + e] * rs * a.scale1 + a.base[kHc + e]);
}

// The Sinkhorn-projected comb of token t (mix row m, stream RMS inverse rs), by the 32 lanes of one
// warp.
template <int kHc>
__device__ inline void comb_gates(const HcArgs& a, const float* m, float rs, int64_t t, float* comb) {
  const int e = threadIdx.x % 32;
  const float logit = e < kHc * kHc ? m[2 * kHc + e] * rs * a.scale2 + a.base[2 * kHc + e] : 0.0f;
  const float projected = sinkhorn<kHc>(logit, a.sinkhorn_iters, a.hc_eps);
  if (e < kHc * kHc) comb[t * kHc * kHc + e] = projected;
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
    with_hc(hc, [&](auto k) {
      post_gates<decltype(k)::value>(a, m, rs, t, post);
      comb_gates<decltype(k)::value>(a, m, rs, t, comb);
    });
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
// stream; block (slices, t) makes the token's post gates and comb (the Sinkhorn in warp 0, the
// post gates beside it in warp 1). A slice is 64 dims or more: 64 for V4-Flash's D, one value of
// each stream per thread (with 128, two in a row, the phases before the first barrier took twice
// as long).
//   1. Slice blocks: X' = hc_post over the slice, kept in shared memory and written over X; the
//      slice's partial sums of the mix product x·fnᵀ and of X'² (doubles) into `partials`: each
//      thread its values' products with every row of fn (all loads in flight), then per row a warp
//      sum and the warps' sums in order. (A warp per row, a row's loads at a time, took ≈ 8 µs.)
//   2. After the barrier, every block: the token's mix and stream RMS from the partials, summed in
//      slice order. The gates block: post and comb (then it is done). Slice blocks: u over the
//      slice (collapse), its partial Σu².
//   3. After the second barrier (the gates block arrives at it without waiting), slice blocks:
//      the norm's mean from the partials in slice order, x = w·(u·inv) over the slice.
// Each value is computed as hc_post_kernel, the GEMV's double path (an exact sum of exact products,
// rounded once), hc_pre_kernel and rms_norm_kernel compute it: only the order of the double sums
// differs (device_math.cuh). The slice's rows of fn, a weight, are fetched into L2 before the
// previous kernel is awaited. The kernel is compiled per hc (the streams' loops unrolled, no guard
// around a load) and for one block per SM: under plain __launch_bounds__(256) ptxas kept 80
// registers and issued the mix product's 24 loads one after another (SASS), and a decoded token's
// launch took 25 µs; clock64 stamps then put 8 µs in the mix product and 13.5 in the Sinkhorn.
constexpr int kStepThreads = 256, kStepWarps = kStepThreads / 32;
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

// Sums over q < n of p[q·stride + c], written by other blocks before a grid barrier, for the warp's
// columns c = c0 + j·dc < n_cols (j < kCols): each lane sums its q ≡ lane (mod 32) in order, then
// the warp (the same order in every launch). The loads of all columns, and of two q a lane, are in
// flight together (a column at a time, each waited on an L2 round trip: 2.8 µs for the 25 of a
// V4-Flash token in 8 warps). At 64 slices they still take ≈ 3.2 µs (clock64; two q a lane in
// flight gained only 0.2): what is left is the reads' wait after the barrier.
template <int kCols>
__device__ inline void slice_sums(const double* p, int64_t stride, int n, int c0, int dc, int n_cols,
                                  double (&sums)[kCols]) {
  constexpr int kBatch = 2;
#pragma unroll
  for (int j = 0; j < kCols; ++j) sums[j] = 0.0;
  for (int q0 = threadIdx.x % 32; q0 < n; q0 += 32 * kBatch) {
    double v[kBatch][kCols];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int q = q0 + 32 * b, c = c0 + j * dc;
        v[b][j] = q < n && c < n_cols ? __ldcg(p + q * stride + c) : 0.0;
      }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int j = 0; j < kCols; ++j)
        if (q0 + 32 * b < n) sums[j] += v[b][j];
  }
#pragma unroll
  for (int j = 0; j < kCols; ++j) sums[j] = warp_sum(sums[j]);
}

template <int kHc>
__global__ void __launch_bounds__(kStepThreads, 1) hc_step_kernel(HcStepArgs s) {  // (1: see above)
  constexpr int hc = kHc, mix_n = (2 + kHc) * kHc;
  extern __shared__ float xs[];  // [hc][per]: X' over the block's slice
  __shared__ double scratch[32];
  __shared__ float mix[mix_n], norm_inv[2];  // the token's mix row; 1/RMS of its streams, of u
  const HcArgs& a = s.pre;
  const int e = threadIdx.x, warp = e / 32, lane = e % 32;
  const int slices = int(gridDim.x) - 1, slice = int(blockIdx.x);
  const unsigned block = blockIdx.y * gridDim.x + blockIdx.x, blocks = gridDim.x * gridDim.y;
  const bool gates = slice == slices;
  const int64_t t = blockIdx.y, D = a.D, d0 = slice * s.per;
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
#pragma unroll
      for (int j = 0; j < hc; ++j) acc += double(comb[j * hc + k]) * double(X[j * D + d]);
      xs[k * s.per + d] = round_if(a.bf16, float(acc));
    }
    __syncthreads();  // every read of X is done: X' may go over it
    double acc[mix_n + 1] = {};  // the mix rows' products, then Σ X'²
    for (int i = e; i < n; i += blockDim.x) {
      const int k = i / int(nd), d = i - k * int(nd);
      const float v = xs[k * s.per + d];
      X[k * D + d] = v;
      const float* fn = s.fn + k * D + d0 + d;  // a weight: never written by a kernel
      float w[mix_n];  // loaded before any is used: in flight together
#pragma unroll
      for (int m = 0; m < mix_n; ++m) w[m] = __ldg(fn + m * hc * D);
#pragma unroll
      for (int m = 0; m < mix_n; ++m) acc[m] += double(w[m]) * double(v);
      acc[mix_n] += double(v) * double(v);
    }
    __shared__ double warp_sums[kStepWarps][mix_n + 1];
#pragma unroll
    for (int m = 0; m <= mix_n; ++m) {
      const double w = warp_sum(acc[m]);
      if (lane == 0) warp_sums[warp][m] = w;
    }
    __syncthreads();
    for (int c = e; c <= mix_n; c += blockDim.x) {  // column mix_n: Σ X'²
      double sum = 0.0;
#pragma unroll
      for (int w = 0; w < kStepWarps; ++w) sum += warp_sums[w][c];
      part[slice * (mix_n + 1) + c] = sum;
    }
  }
  grid_sync(s.barrier, block, blocks);

  {  // the token's mix row and stream RMS: warp w sums columns w, w + 8, … of the partials
    constexpr int kCols = (mix_n + kStepWarps) / kStepWarps;
    double sums[kCols];
    slice_sums<kCols>(part, mix_n + 1, slices, warp, kStepWarps, mix_n + 1, sums);
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int c = warp + j * kStepWarps;
      if (lane == 0 && c < mix_n) mix[c] = float(sums[j]);
      if (lane == 0 && c == mix_n) norm_inv[0] = rms_inverse(sums[j], hc * D, a.norm_eps);
    }
  }
  __syncthreads();
  const float rs = norm_inv[0];
  if (gates) {
    if (e == 0) grid_arrive(s.barrier, block, blocks);  // nothing after this block's gates waits for them
    if (warp == 0) comb_gates<kHc>(a, mix, rs, t, s.comb_out);  // the Sinkhorn: the kernel's tail
    if (warp == 1) post_gates<kHc>(a, mix, rs, t, s.post_out);
    return;
  }
  double pre[kMaxHc];
  pre_gates(a, mix, rs, pre);
  float* u = s.u + t * D + d0;
  const double squares = block_sum(collapse(xs, s.per, pre, hc, nd, e, blockDim.x, a.bf16, u), scratch);
  if (e == 0) part_u[slice] = squares;
  grid_sync(s.barrier, block, blocks);

  if (warp == 0) {
    double sum[1];
    slice_sums<1>(part_u, 1, slices, 0, 1, 1, sum);
    if (lane == 0) norm_inv[1] = rms_inverse(sum[0], D, a.norm_eps);
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
  constexpr int64_t kMaxTokens = 8, kMinSliceDims = 64;
  const int64_t mix_n = p.fn.out;
  const int64_t slices = std::min<int64_t>(sm_count_ / std::max<int64_t>(T, 1) - 1, (D + kMinSliceDims - 1) / kMinSliceDims);
  const int64_t per = slices > 0 ? (D + slices - 1) / slices : 0;
  const size_t smem = size_t(hc * per) * sizeof(float);
  if (T > kMaxTokens || slices < 1 || p.fn.format != model::WeightFormat::f32 || hc < 1 || hc > kMaxHc ||
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
  void (*const kernels[kMaxHc])(HcStepArgs) = {hc_step_kernel<1>, hc_step_kernel<2>, hc_step_kernel<3>,
                                                 hc_step_kernel<4>, hc_step_kernel<5>};
  allow_shared_memory(reinterpret_cast<const void*>(kernels[hc - 1]), smem, "hc_post_pre_norm");
  launch(kernels[hc - 1], dim3(unsigned(slices_used + 1), unsigned(T)), kStepThreads, smem, stream_, s);
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
