// Sparse attention with sinks over the sliding window plus compressed rows, and the
// sliding-window ring that feeds it (twin of cpu/attention.cpp; architecture.md §3.3, §3.4,
// §4.1).
//
// Softmax is exact two-pass per (query, head), as on the CPU: logits, their max, then the
// weighted sum. The sink joins the denominator but not the max; in deepseek numerics the
// probabilities are rounded to bf16 before P·V while the denominator sums the unrounded
// exponentials (§3.3). Every product (fp32 query × stored row value, bf16 or fp32 probability ×
// row value) is exact in double and every sum is a double sum, so results differ from the CPU's
// only where a double sum in another order straddles a float rounding tie (device_math.cuh).
//
// The rows of query t, in order: window rows [lo, pos], then the compressed rows (the visible ones,
// or the indexer's selection, whose −1 entries stay in place as rows that are skipped: logit −∞,
// no share of P·V). Compressed rows are read in their stored format (core/row_format.h): the
// kernels are compiled per row kind, and a lane reads groups of 4 dims (one 4-byte load of e4m3
// codes, or 16 bytes of floats from the window).
//
// Few queries (decode): the heads of a query share its rows (one KV head), so logits = Q·Kᵀ and
// the output P·V are matrix products with the heads as M, and they run on the FP64 tensor cores
// (mma.m16n8k4.f64), each decoded row value serving every head of a block. Four kernels:
//   logits: grid (row tiles, dim parts of 128, query × head groups of 64); the block's queries
//     (its dims of them) in shared memory as doubles. The 8 warps are (8/S row groups of 16 rows) ×
//     (S splits of the part's dims); each warp takes its 16 rows against all 64 heads, so each row
//     value it decodes serves 64 heads (16 dmma per 2 values). The K order within 16 dims is
//     permuted (k-step u of lane i is dim 4i + u), so a lane reads 4 consecutive dims of a row with
//     one load and uses them for 4 steps. The splits' sums are added in split order through shared
//     memory; each part's go to global memory, and softmax adds the parts in part order.
//   softmax: one block per (query, head): the logits from the parts' sums, their max, the
//     exponentials (rounded for P·V) in place of the logits, the denominator with the sink.
//   values: grid (row slices of R, dim groups of 32·C, query × head groups of 64); the slice's
//     probabilities in shared memory as doubles. The 8 warps are (4/C row groups) × (2 warp rows of
//     32 heads) × (C warp columns of 32 dims); row group k takes the slice's rows 8k … 8k + 7, then
//     those 32/C further on, and so on, and the groups' sums are added in group order through shared
//     memory (C = 4: stored straight from the fragments). One partial sum per slice.
//   combine: the slices' partial sums (in a fixed order), divided by the denominator.
// The host picks S, and C and R (C = 4, R = 128; else C = 1, R = 128, 64 or 32), from the rows and
// the SM count: the most work per block that still gives every SM a block (logits) or two
// (values). The shape with most work per block (each warp walking 16 rows × all dims of logits,
// or 128 rows of values) ran 4 blocks of logits and of values for the 128-row sliding window of
// V4-Flash (64 heads of 512: 18.6 and 24.2 µs on an H200), 20 of each for a CSA layer's 640 rows
// (49 and 30 µs) and 260 for an HCA layer's ~8 300 rows at 1M context (0.16 ms for the four
// kernels): too few blocks, each warp a long chain of loads waiting on memory. Split over dim
// parts and row groups (ncu, 85d4276; logits then in blocks of 16 heads): 128 rows ran 32 blocks
// of logits and 64 of values (R = 32), 5.9 and 6.7 µs; 640 rows 160 and 320 (R = 32), 11.4 and
// 13.8 µs; 8 320 rows 520 and 1 040 (C = 1), 53 and 49 µs (117 µs for the four kernels). With
// every head per warp and m16n8k4 (acf4135, ncu at 1M): 8 320 rows 31.0 µs of logits (S = 1, 260
// blocks) and 40.6 of values, 640 rows 11.0 and 13.2, 128 rows ≈ 7.8 µs of logits (S = 8).
// Splitting the rows inside a block rather than into more slices keeps the partial sums (H·hd
// doubles per slice, written and read again by combine) from outgrowing the rows read. Every split
// only regroups double sums of exact products (see above).
// (One block per (query, head) with one warp per row, as before, re-decoded every row once per
// head in double: 1.2 ms per HCA layer at 1M context on an H200.)
//
// Many queries over many rows (prefill past the window, more than kOneBlockMaxRows rows): groups of
// kFewQueries queries through the four kernels above, so that a decoded row serves many heads.
// Many queries over few rows (prefill within the window): one block of 256 threads per (query,
// head); the grid is full. The query and the logits of every row it attends live in shared
// memory. Phase 1 has one warp per row for the dot product (double,
// shuffle reduction); phase 2 the max and exponentials block-wide; phase 3 sums P·V in double:
// warp w takes every 8th row, each lane the groups of 4 dims at 128·i + 4·lane (so each row is
// one coalesced read with many loads in flight), and the 8 partial sums are added in warp order.
#include <algorithm>
#include <cmath>

#include "backend/cuda/attention_rows.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kAttnThreads = 256;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kMaxHeadDim = 512;  // many queries: phase 3 keeps hd/32 double sums per lane in registers
constexpr int64_t kFewQueries = 8;
// Many queries attending at most this many rows run one block per (query, head); more rows, in
// groups of kFewQueries on the tensor-core kernels. (A prefill chunk of 2 048 queries over a CSA
// layer's 640 rows took 116 ms in the one-block kernel on an H200.)
constexpr int64_t kOneBlockMaxRows = 256;

// The most rows any of queries [p0, p0 + T) attends: the window, plus the selection or the
// visible compressed rows.
int64_t rows_attended(int64_t p0, int64_t T, const SwaRows& swa, const CompressedRows& comp) {
  int64_t n_comp_max = 0;
  if (comp.idx)
    n_comp_max = comp.k;
  else if (comp.ratio > 0)
    n_comp_max = std::min(comp.n, (p0 + T) / comp.ratio);
  return std::min(swa.window, p0 + T) + n_comp_max;
}

__global__ void swa_gather_kernel(const float* ring, int64_t window, int64_t width, int64_t pos_begin, float* dst) {
  await_previous_kernel();
  const int64_t p = pos_begin + blockIdx.x;
  const float* src = ring + (p % window) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[blockIdx.x * width + c] = src[c];
}

// Row i of `rows` (i ≥ first) to ring slot (pos0 + i) mod window; only the last `window` rows are
// written, so no two blocks share a slot.
__global__ void swa_store_kernel(float* ring, int64_t window, int64_t width, const float* rows, int64_t pos0,
                                 int64_t first) {
  await_previous_kernel();
  const int64_t i = first + blockIdx.x;
  float* dst = ring + ((pos0 + i) % window) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[c] = rows[i * width + c];
}

// Values d0 … d0+3 of row r (which must exist), compressed rows of kind K.
template <RowFormat::Kind K>
__device__ inline void row_floats4(const AttnArgs& a, RowRef r, int32_t d0, float v[4]) {
  if (r.window)
    row_values4<RowFormat::f32>(a.comp.format, r.p, d0, v);  // (f32 rows ignore the format)
  else
    row_values4<K>(a.comp.format, r.p, d0, v);
}

// The same as doubles, zeros for a missing row or dims at or past hd (fragment padding). The e4m3
// dims of compressed rows go straight to doubles by bit placement and one exact multiplication by
// their block's exponent (quant.cuh), the same values as code · scale in fp32 (exact: the scale is
// at least 2^-127) converted, for a third of the instructions.
template <RowFormat::Kind K>
__device__ inline void row_doubles4(const AttnArgs& a, RowRef r, int32_t d0, double (&v)[4]) {
  if constexpr (K == RowFormat::fp8_bf16) {
    if (r.p && !r.window && d0 < a.comp.format.quant_dims) {
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(r.p);
      const uint32_t codes = *reinterpret_cast<const uint32_t*>(bytes + d0);
      const double scale = e8m0_placed_scale(bytes[a.comp.format.quant_dims + (d0 >> 6)]);
      e4m3x4_placed(codes, v);
#pragma unroll
      for (int c = 0; c < 4; ++c) v[c] *= scale;
      return;
    }
  }
  float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (r.p && d0 < a.hd) row_floats4<K>(a, r, d0, f);
#pragma unroll
  for (int c = 0; c < 4; ++c) v[c] = double(f[c]);
}

// ---- many queries (prefill) ---------------------------------------------------------------------

// A lane's share of a row: the groups of 4 dims starting at 128·i + 4·lane.
constexpr int kGroups = kMaxHeadDim / 128;

// Row r's dot with the query (kept in double: one conversion less per product), this lane's part.
template <RowFormat::Kind K>
__device__ inline double dot_part(const AttnArgs& a, RowRef r, const double* qs, int lane) {
  double acc = 0.0;
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    const int32_t d0 = 128 * i + 4 * lane;
    if (d0 >= a.hd) break;
    float v[4];
    row_floats4<K>(a, r, d0, v);
#pragma unroll
    for (int c = 0; c < 4; ++c) acc += qs[d0 + c] * double(v[c]);
  }
  return acc;
}

// acc += p · row r, this lane's dims (acc[4·i + c] holds dim 128·i + 4·lane + c).
template <RowFormat::Kind K>
__device__ inline void add_part(const AttnArgs& a, RowRef r, double p, int lane, double (&acc)[4 * kGroups]) {
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    const int32_t d0 = 128 * i + 4 * lane;
    if (d0 >= a.hd) break;
    float v[4];
    row_floats4<K>(a, r, d0, v);
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[4 * i + c] += p * double(v[c]);
  }
}

template <RowFormat::Kind K>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttnArgs a) {
  await_previous_kernel();
  extern __shared__ double smem[];
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const int64_t t = blockIdx.x, h = blockIdx.y, hd = a.hd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double* part = smem;                           // [warps][hd] phase 3 partial sums
  double* qs = part + kAttnWarps * hd;           // [hd]
  float* p = reinterpret_cast<float*>(qs + hd);  // [n_max] logits, then probabilities
  const QueryRows rows(a, t);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = a.q[(t * a.H + h) * hd + d];
  __syncthreads();

  // Phase 1: logits, one warp per row.
  for (int64_t j = warp; j < rows.n; j += kAttnWarps) {
    const RowRef r = rows.row(a, t, j);
    if (!r.p) {  // a skipped selection entry (uniform over the warp)
      if (lane == 0) p[j] = -INFINITY;
      continue;
    }
    const double acc = warp_sum(dot_part<K>(a, r, qs, lane));
    if (lane == 0) p[j] = float(acc) * a.softmax_scale;
  }
  __syncthreads();

  // Phase 2: the max (without the sink), exponentials, the denominator with the sink.
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x) mx = fmaxf(mx, p[j]);
  mx = block_max(mx, fscratch);
  double den = 0.0;
  for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x) {
    const float e = exp_f(p[j] - mx);
    den += e;
    p[j] = round_if(a.bf16, e);
  }
  den = block_sum(den, dscratch) + exp_f(a.sinks[h] - mx);

  // Phase 3: P·V (see the top).
  double acc[4 * kGroups] = {};
  for (int64_t j = warp; j < rows.n; j += kAttnWarps) {
    const RowRef r = rows.row(a, t, j);
    if (r.p) add_part<K>(a, r, double(p[j]), lane, acc);
  }
#pragma unroll
  for (int i = 0; i < kGroups; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (128 * i + 4 * lane < hd) part[warp * hd + 128 * i + 4 * lane + c] = acc[4 * i + c];
  __syncthreads();
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    double sum = 0.0;
    for (int w = 0; w < kAttnWarps; ++w) sum += part[w * hd + d];
    a.out[(t * a.H + h) * hd + d] = round_if(a.bf16, float(sum) / float(den));
  }
}

// ---- few queries (decode): the FP64 tensor cores ------------------------------------------------

constexpr int64_t kDecodeBlocksPerSm = 2;           // launch shapes: the fewest blocks per SM wanted
constexpr int kLogitHeads = 64;                      // per block and per warp: 8 fragments of 8
constexpr int kLogitRows = 16;                       // per warp (2 fragments of 8)
constexpr int kLogitDims = 128;                      // per block: one part of the product's K
constexpr int kLogitPitch = kLogitDims + 1;          // doubles per head in shared memory (odd: see the kernel)
constexpr int kValueRows = 128;                      // the most rows of a slice (the product's K per block)
constexpr int kValueHeads = 64;                      // 2 warp rows of 4 fragments of 8
constexpr int kValueWarpDims = 32;                   // one warp column: 4 fragments of 8 dims
constexpr int kValueSplit = 4;                       // warp columns × row groups of a block
constexpr int kValuePitch = kValueRows + 4;          // doubles; spreads a fragment read over all banks
constexpr int kValueSumPitch = 34;                   // doubles per fragment element of a warp's sums (≡ 2 mod 16)

struct DecodeArgs {
  AttnArgs a;
  int32_t logit_parts;  // logits: parts of kLogitDims dims, each summed by its own blocks
  int32_t logit_split;  // logits: a block's warps are (8 / split row groups of 16) × (split dim parts)
  int32_t value_cols;   // values: warp columns of 32 dims (1, 2 or 4); kValueSplit / value_cols row groups
  int64_t value_rows;   // rows per slice: a multiple of 8 · row groups, at most kValueRows
  int64_t slices;       // of value_rows rows
  double* logit_sums;   // [T, logit_parts, H, n_max]: the parts' sums of the logits
  float* logits;        // [T, H, n_max]: logits, then probabilities
  double* den;          // [T, H]
  double* partial;      // [T, slices, H, hd]
};

// Block (row tile, dim part of kLogitDims, query × head group of 64): the part's dims of the
// group's queries in shared memory as doubles. The 8 warps are (8/S row groups of 16 rows) × (S
// dim splits): warp (r, p) takes rows 16r … 16r + 15 of the tile against every head of the group,
// over the p-th 1/S of the part's dims, 16 dims per iteration, so each row value it decodes serves
// 64 heads. The K order within 16 dims is permuted (k-step u of lane i is dim 4i + u), so a lane
// reads 4 consecutive dims of a row with one load and uses them for 4 steps. The S splits' sums
// are added in split order through shared memory (S = 1: stored straight from the fragments);
// each part's go to logit_sums, and softmax adds the parts in order.
// (Before: blocks of 16 heads, 4 per query, each decoding every row again and converting every
// value from float: 47.8 µs for an HCA layer's 8 320 rows at 1M context on an H200, IPC 1.9.)
template <RowFormat::Kind K>
__global__ void __launch_bounds__(kAttnThreads, 2) decode_logits_kernel(DecodeArgs s) {
  await_previous_kernel();
  extern __shared__ double qs[];  // [kLogitHeads][kLogitPitch], zero past H and hd; then the splits' sums
  const AttnArgs& a = s.a;
  const int split = s.logit_split, groups = kAttnWarps / split;
  const int64_t head_groups = (a.H + kLogitHeads - 1) / kLogitHeads, hd = a.hd;
  const int64_t t = blockIdx.z / head_groups, h0 = blockIdx.z % head_groups * kLogitHeads;
  const int32_t d_first = int32_t(blockIdx.y) * kLogitDims;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, i = lane % 4;
  const QueryRows rows(a, t);
  const int64_t j0 = int64_t(blockIdx.x) * kLogitRows * groups;
  if (j0 >= rows.n) return;  // (uniform over the block)
  // The queries: a thread per dim, 8 heads' loads in flight.
  static_assert(kLogitDims * kLogitHeads % (8 * kAttnThreads) == 0 && kAttnThreads % kLogitDims == 0);
  for (int base = 0; base < kLogitHeads * kLogitDims; base += 8 * kAttnThreads) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int e = base + u * kAttnThreads + threadIdx.x;
      const int64_t h = h0 + e / kLogitDims, d = d_first + e % kLogitDims;
      v[u] = h < a.H && d < hd ? a.q[(t * a.H + h) * hd + d] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int e = base + u * kAttnThreads + threadIdx.x;
      qs[e / kLogitDims * kLogitPitch + e % kLogitDims] = double(v[u]);
    }
  }
  __syncthreads();
  const int64_t jw = j0 + kLogitRows * (warp / split);  // this warp's rows
  const int32_t split_dims = kLogitDims / split, d_lo = split_dims * (warp % split);
  const int32_t d_hi = int32_t(min(int64_t(d_lo + split_dims), hd - d_first));
  double acc[8][2][2] = {};  // [head fragment][row fragment][element]
  if (jw < rows.n) {
    const RowRef r[2] = {rows.row(a, t, jw + g), rows.row(a, t, jw + 8 + g)};
    for (int32_t d16 = d_lo; d16 < d_hi; d16 += 16) {
      double b[2][4];  // [row fragment][step]
#pragma unroll
      for (int f = 0; f < 2; ++f) row_doubles4<K>(a, r[f], d_first + d16 + 4 * i, b[f]);
      // Head g + 8m's query at dim d16 + 4i + u: rows of an odd pitch, so a fragment's 32 reads
      // fall on every bank pair twice (two wavefronts, the fewest for 256 bytes).
      const double* qrow = qs + g * kLogitPitch + d16 + 4 * i;
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int m = 0; m < 8; m += 2) {
          const double q0 = qrow[8 * m * kLogitPitch + u], q1 = qrow[8 * (m + 1) * kLogitPitch + u];
          dmma(acc[m][0], acc[m + 1][0], q0, q1, b[0][u]);
          dmma(acc[m][1], acc[m + 1][1], q0, q1, b[1][u]);
        }
    }
  }
  // acc[m][f][c]: head h0 + 8m + g, row jw + 8f + 2i + c; element (m, f, c) is e = 4m + 2f + c.
  double* sums = s.logit_sums + (t * s.logit_parts + blockIdx.y) * a.H * a.n_max;
  auto store = [&](int64_t jg, int e, int l, double v) {  // row group's first row jg, element e of lane l
    const int64_t h = h0 + 8 * (e / 4) + l / 4, j = jg + 8 * (e / 2 % 2) + 2 * (l % 4) + e % 2;
    if (h < a.H && j < rows.n) sums[h * a.n_max + j] = v;
  };
  if (split == 1) {  // (uniform over the block)
#pragma unroll
    for (int e = 0; e < 32; ++e) store(jw, e, lane, acc[e / 4][e / 2 % 2][e % 2]);
    return;
  }
  __syncthreads();  // every warp is done with the queries: their memory takes the sums
  double* part = qs;  // [warp][element][lane]
#pragma unroll
  for (int e = 0; e < 32; ++e) part[(warp * 32 + e) * 32 + lane] = acc[e / 4][e / 2 % 2][e % 2];
  __syncthreads();
  for (int idx = threadIdx.x; idx < groups * 32 * 32; idx += kAttnThreads) {
    const int rg = idx / 1024, e = idx / 32 % 32, l = idx % 32;
    const double* src = part + (rg * split * 32 + e) * 32 + l;
    double sum = src[0];
    for (int p = 1; p < split; ++p) sum += src[p * 32 * 32];
    store(j0 + kLogitRows * rg, e, l, sum);
  }
}

// (1024 threads: one block per (query, head) is few blocks, and each row costs a double exp.)
constexpr int kSoftmaxThreads = 1024;

__global__ void __launch_bounds__(kSoftmaxThreads) decode_softmax_kernel(DecodeArgs s) {
  await_previous_kernel();
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const AttnArgs& a = s.a;
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const QueryRows rows(a, t);
  float* p = s.logits + (t * a.H + h) * a.n_max;
  // The logits: the dim parts' sums added in part order, scaled; −∞ for a skipped selection entry.
  const double* sums = s.logit_sums + (t * s.logit_parts * a.H + h) * a.n_max;
  const int64_t part_stride = a.H * a.n_max;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x) {
    double sum = sums[j];
    for (int part = 1; part < s.logit_parts; ++part) sum += sums[part * part_stride + j];
    const float logit = rows.row(a, t, j).p ? float(sum) * a.softmax_scale : -INFINITY;
    p[j] = logit;
    mx = fmaxf(mx, logit);
  }
  mx = block_max(mx, fscratch);
  double den = 0.0;
  for (int64_t j = threadIdx.x; j < rows.n; j += blockDim.x) {
    const float e = exp_f(p[j] - mx);
    den += e;
    p[j] = round_if(a.bf16, e);
  }
  den = block_sum(den, dscratch) + exp_f(a.sinks[h] - mx);
  if (threadIdx.x == 0) s.den[t * a.H + h] = den;
}

// Block (slice, dim group of 32·cols, query × head group of 64): warp w is warp row wm (32 heads),
// warp column wn (32 dims) of row group k, w = (2k + wm)·cols + wn; row group k takes the slice's
// rows 8k … 8k + 7, then 8 · kValueSplit / cols further on, and so on.
template <RowFormat::Kind K>
__global__ void __launch_bounds__(kAttnThreads) decode_values_kernel(DecodeArgs s) {
  await_previous_kernel();
  extern __shared__ double ps[];          // [kValueHeads][kValuePitch] the slice's probabilities; then the warps' sums
  __shared__ RowRef slice_rows[kValueRows];
  const AttnArgs& a = s.a;
  const int cols = s.value_cols, groups = kValueSplit / cols;
  const int64_t head_groups = (a.H + kValueHeads - 1) / kValueHeads, slice_rows_n = s.value_rows;
  const int64_t t = blockIdx.z / head_groups, h0 = blockIdx.z % head_groups * kValueHeads;
  const int64_t slice = blockIdx.x, j0 = slice * slice_rows_n;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, i = lane % 4;
  const QueryRows rows(a, t);
  if (j0 >= rows.n) return;  // (uniform over the block)
  // The probabilities: warp w the heads w, w + 8, …, all loads in flight together.
  static_assert(kValueRows == 4 * 32 && kValueHeads == 8 * kAttnWarps);
  {
    float v[8][4];
#pragma unroll
    for (int m = 0; m < 8; ++m)
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t h = h0 + warp + 8 * m, jj = lane + 32 * u;
        v[m][u] = h < a.H && jj < slice_rows_n && j0 + jj < rows.n ? s.logits[(t * a.H + h) * a.n_max + j0 + jj] : 0.0f;
      }
#pragma unroll
    for (int m = 0; m < 8; ++m)
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (lane + 32 * u < slice_rows_n) ps[(warp + 8 * m) * kValuePitch + lane + 32 * u] = double(v[m][u]);
  }
  for (int64_t jj = threadIdx.x; jj < slice_rows_n; jj += blockDim.x) slice_rows[jj] = rows.row(a, t, j0 + jj);
  __syncthreads();
  // Warp (k, wm, wn): heads h0 + 32·wm + 8m + g, dims d_base + 4g + f for fragments m, f.
  const int wn = warp % cols, wm = warp / cols % 2, k = warp / (2 * cols);
  const int64_t d_base = int64_t(blockIdx.y) * kValueWarpDims * cols + kValueWarpDims * wn;
  const bool active = h0 + 32 * wm < a.H && d_base < a.hd;
  const int64_t n_rows = rows.n - j0 < slice_rows_n ? rows.n - j0 : slice_rows_n;
  double acc[4][4][2] = {};  // [head fragment][dim fragment][element]
  // 8 rows per iteration, as two k-steps of 4 whose row loads are in flight together.
  if (active)
    for (int64_t jj = 8 * k; jj < n_rows; jj += 8 * groups) {
      double b[2][4];  // [step][dim fragment]
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const int64_t j = jj + 4 * step + i;
        row_doubles4<K>(a, j < n_rows ? slice_rows[j] : RowRef{nullptr, false}, int32_t(d_base) + 4 * g, b[step]);
      }
#pragma unroll
      for (int step = 0; step < 2; ++step)
#pragma unroll
        for (int m = 0; m < 4; m += 2) {
          const double p0 = ps[(32 * wm + 8 * m + g) * kValuePitch + jj + 4 * step + i],
                       p1 = ps[(32 * wm + 8 * (m + 1) + g) * kValuePitch + jj + 4 * step + i];
#pragma unroll
          for (int f = 0; f < 4; ++f) dmma(acc[m][f], acc[m + 1][f], p0, p1, b[step][f]);
        }
    }
  // acc[m][f][c]: head h0 + 32·wm + 8m + g, column 2i + c of dim fragment f = dim d_base + 4(2i + c) + f.
  double* partial = s.partial + (t * s.slices + slice) * a.H * a.hd;
  if (groups == 1) {  // (uniform over the block)
    if (!active) return;
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int f = 0; f < 4; ++f)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int64_t h = h0 + 32 * wm + 8 * m + g, d = d_base + 4 * (2 * i + c) + f;
          if (h < a.H && d < a.hd) partial[h * a.hd + d] = acc[m][f][c];
        }
    return;
  }
  // The row groups' sums, added in group order through shared memory (in place of the probabilities).
  __syncthreads();
  double* sums = ps;  // [warp][fragment element (m, f, c)][kValueSumPitch]
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int f = 0; f < 4; ++f)
#pragma unroll
      for (int c = 0; c < 2; ++c) sums[(warp * 32 + (m * 4 + f) * 2 + c) * kValueSumPitch + lane] = acc[m][f][c];
  __syncthreads();
  // Warp w: heads w, w + 8, … of the group, a lane per dim of each warp column (dim 8i + 4c + f of
  // a column is lane 4g + i of its warps, element (m, f, c)).
  const int64_t d0 = int64_t(blockIdx.y) * kValueWarpDims * cols + lane;
  const int di = lane / 8, dc = lane / 4 % 2, df = lane % 4;
  for (int hh = warp; hh < kValueHeads; hh += kAttnWarps) {
    const int64_t h = h0 + hh;
    if (h >= a.H) break;
    const int hm = hh / 32, m = hh % 32 / 8, hg = hh % 8;
    for (int c32 = 0; c32 < cols; ++c32) {
      const int64_t d = d0 + kValueWarpDims * c32;
      if (d >= a.hd) break;
      const double* src = sums + ((hm * cols + c32) * 32 + (m * 4 + df) * 2 + dc) * kValueSumPitch + 4 * hg + di;
      double sum = src[0];
      for (int kk = 1; kk < groups; ++kk) sum += src[kk * 2 * cols * 32 * kValueSumPitch];
      partial[h * a.hd + d] = sum;
    }
  }
}

// Block (32 dims, head, query): warp w sums slices w, w + 8, … in order, then the 8 warp sums are
// added in warp order (a fixed order: one thread summing every slice in turn waited on memory for
// each, 31 µs over the 65 slices of an HCA layer at 1M context).
__global__ void __launch_bounds__(kAttnThreads) decode_combine_kernel(DecodeArgs s) {
  await_previous_kernel();
  __shared__ double sums[kAttnWarps][32];
  const AttnArgs& a = s.a;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t d = int64_t(blockIdx.x) * 32 + lane, h = blockIdx.y, t = blockIdx.z;
  const int64_t used = (QueryRows(a, t).n + s.value_rows - 1) / s.value_rows, stride = a.H * a.hd;
  const double* part = s.partial + (t * s.slices * a.H + h) * a.hd + d;
  double sum = 0.0;
  if (d < a.hd)
#pragma unroll 4
    for (int64_t sl = warp; sl < used; sl += kAttnWarps) sum += part[sl * stride];
  sums[warp][lane] = sum;
  __syncthreads();
  if (warp != 0 || d >= a.hd) return;
  double total = 0.0;
  for (int w = 0; w < kAttnWarps; ++w) total += sums[w][lane];
  a.out[(t * a.H + h) * a.hd + d] = round_if(a.bf16, float(total) / float(s.den[t * a.H + h]));
}

}  // namespace

void CudaBackend::swa_gather(const float* ring, int64_t window, int64_t width, int64_t pos_begin, int64_t pos_end,
                             float* dst) {
  Timed timed(*this, "swa_gather");
  if (pos_end <= pos_begin) return;
  launch(swa_gather_kernel, unsigned(pos_end - pos_begin), 128, 0, stream_, ring, window, width, pos_begin, dst);
  DSV4_CUDA_LAUNCHED("swa_gather");
}

void CudaBackend::swa_store(float* ring, int64_t window, int64_t width, const float* rows, int64_t pos0, int64_t n) {
  Timed timed(*this, "swa_store");
  const int64_t first = std::max<int64_t>(0, n - window);
  if (n <= first) return;
  launch(swa_store_kernel, unsigned(n - first), 128, 0, stream_, ring, window, width, rows, pos0, first);
  DSV4_CUDA_LAUNCHED("swa_store");
}

void CudaBackend::few_query_attention(const AttnArgs& args, int64_t T) {
  const int64_t H = args.H, hd = args.hd, n_max = args.n_max;
  const bool fp8_rows = args.comp.format.kind == RowFormat::fp8_bf16;
  // Launch shapes (see the top): the most work per block that still gives every SM two blocks.
  const auto ceil_div = [](int64_t x, int64_t y) { return (x + y - 1) / y; };
  const int64_t logit_heads = ceil_div(H, kLogitHeads), value_heads = ceil_div(H, kValueHeads);
  const int64_t logit_parts = ceil_div(hd, kLogitDims);
  // The logits' split: the fewest row groups' dim splits that still give every SM a block.
  int logit_split = 1;
  while (logit_split < kAttnWarps &&
         ceil_div(n_max, kLogitRows * (kAttnWarps / logit_split)) * logit_parts * T * logit_heads < sm_count_)
    logit_split *= 2;
  const auto value_blocks = [&](int cols, int64_t rows) {
    return ceil_div(n_max, rows) * ceil_div(hd, kValueWarpDims * cols) * T * value_heads;
  };
  const int64_t enough = kDecodeBlocksPerSm * sm_count_;
  int value_cols = kValueSplit;
  int64_t value_rows = kValueRows;
  if (value_blocks(value_cols, value_rows) < enough) {
    value_cols = 1;  // kValueSplit row groups of 8 rows
    while (value_rows > 8 * kValueSplit && value_blocks(value_cols, value_rows) < enough) value_rows /= 2;
  }
  const int64_t slices = ceil_div(n_max, value_rows);
  DeviceArray<double> logit_sums(memory_, size_t(T * logit_parts * H * n_max));
  DeviceArray<float> logits(memory_, size_t(T * H * n_max));
  DeviceArray<double> den(memory_, size_t(T * H)), partial(memory_, size_t(T * slices * H * hd));
  const DecodeArgs d{args,       int32_t(logit_parts), logit_split,   value_cols, value_rows,
                     slices,     logit_sums.get(),     logits.get(),  den.get(),  partial.get()};
  const size_t logit_smem = size_t(std::max(kLogitHeads * kLogitPitch, kAttnWarps * 32 * 32)) * sizeof(double);
  const size_t value_smem =
      size_t(std::max(kValueHeads * kValuePitch, kAttnWarps * 32 * kValueSumPitch)) * sizeof(double);
  const auto logits_kernel =
      fp8_rows ? decode_logits_kernel<RowFormat::fp8_bf16> : decode_logits_kernel<RowFormat::f32>;
  const auto values_kernel =
      fp8_rows ? decode_values_kernel<RowFormat::fp8_bf16> : decode_values_kernel<RowFormat::f32>;
  allow_shared_memory(reinterpret_cast<const void*>(logits_kernel), logit_smem, "attention logits");
  allow_shared_memory(reinterpret_cast<const void*>(values_kernel), value_smem, "attention values");
  const dim3 logit_grid(unsigned(ceil_div(n_max, kLogitRows * (kAttnWarps / logit_split))), unsigned(logit_parts),
                        unsigned(T * logit_heads));
  launch(logits_kernel, logit_grid, kAttnThreads, logit_smem, stream_, d);
  DSV4_CUDA_LAUNCHED("attention (logits)");
  launch(decode_softmax_kernel, dim3(unsigned(T), unsigned(H)), kSoftmaxThreads, 0, stream_, d);
  DSV4_CUDA_LAUNCHED("attention (softmax)");
  const dim3 value_grid(unsigned(slices), unsigned(ceil_div(hd, kValueWarpDims * value_cols)),
                        unsigned(T * value_heads));
  launch(values_kernel, value_grid, kAttnThreads, value_smem, stream_, d);
  DSV4_CUDA_LAUNCHED("attention (values)");
  launch(decode_combine_kernel, dim3(unsigned((hd + 31) / 32), unsigned(H), unsigned(T)), kAttnThreads, 0, stream_, d);
  DSV4_CUDA_LAUNCHED("attention (combine)");
}

void CudaBackend::attention(const float* q, int64_t T, int64_t H, int64_t hd, int64_t p0, const SwaRows& swa,
                            const CompressedRows& comp, const float* sinks, float softmax_scale, float* out) {
  Timed timed(*this, "attention");
  DSV4_CUDA_REQUIRE(swa.first_pos <= std::max<int64_t>(0, p0 - swa.window + 1) && swa.first_pos + swa.n >= p0 + T,
                    "window rows [", swa.first_pos, ", ", swa.first_pos + swa.n, ") do not cover queries [", p0, ", ",
                    p0 + T, ")");
  if (T == 0 || H == 0) return;
  const int64_t n_max = rows_attended(p0, T, swa, comp);
  DSV4_CUDA_REQUIRE(!comp.kv || comp.format.width == hd, "attention: compressed rows of width ", comp.format.width,
                    ", heads of ", hd);
  // Groups of 4 dims: 16-byte aligned window rows, e4m3 groups that never straddle the bf16 tail.
  DSV4_CUDA_REQUIRE(hd % 4 == 0 && comp.format.quant_dims % 4 == 0 && reinterpret_cast<uintptr_t>(swa.kv) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(comp.kv) % 16 == 0,
                    "attention: head dim ", hd, " and FP8 dims ", comp.format.quant_dims,
                    " must be multiples of 4, rows 16-byte aligned");
  DSV4_CUDA_REQUIRE(comp.format.kind != RowFormat::fp4, "attention: compressed rows cannot be FP4");
  const AttnArgs args{q, H, hd, p0, swa, comp, static_cast<const float*>(upload(sinks, size_t(H) * sizeof(float))),
                      softmax_scale, n_max, deepseek(), out};
  const bool fp8_rows = comp.format.kind == RowFormat::fp8_bf16;

  // deepseek-tc: a prefill's queries on the bf16 tensor cores; decode stays exact, as its products do.
  if (numerics() == Numerics::deepseek_tc && T > kFewQueries && fits_tensor_core_attention(args)) {
    tensor_core_attention(args, T);
    return;
  }
  if (T <= kFewQueries) {
    few_query_attention(args, T);
    return;
  }
  if (n_max > kOneBlockMaxRows) {
    // Many queries over many rows (a prefill past the window): groups of kFewQueries queries on
    // the tensor-core kernels. Each decoded row then serves 16 heads (logits) or 64 (values) of a
    // query instead of one: for an HCA layer at 1M context the one-block kernel's re-decoding
    // would cost about 1.2 ms per query. Queries are independent, so the outputs are the same.
    for (int64_t t0 = 0; t0 < T; t0 += kFewQueries) {
      const int64_t n = std::min(kFewQueries, T - t0);
      AttnArgs part = args;
      part.q += t0 * H * hd;
      part.out += t0 * H * hd;
      part.p0 = p0 + t0;
      if (part.comp.idx) part.comp.idx += t0 * comp.k;
      part.n_max = rows_attended(part.p0, n, swa, comp);
      few_query_attention(part, n);
    }
    return;
  }

  DSV4_CUDA_REQUIRE(hd <= kMaxHeadDim, "attention: head dim ", hd, " above ", kMaxHeadDim);
  const size_t smem = size_t((kAttnWarps + 1) * hd) * sizeof(double) + size_t(n_max) * sizeof(float);
  const auto kernel = fp8_rows ? attention_kernel<RowFormat::fp8_bf16> : attention_kernel<RowFormat::f32>;
  allow_shared_memory(reinterpret_cast<const void*>(kernel), smem, "attention over this many rows per query");
  launch(kernel, dim3(unsigned(T), unsigned(H)), kAttnThreads, smem, stream_, args);
  DSV4_CUDA_LAUNCHED("attention");
}

}  // namespace dsv4::cuda
