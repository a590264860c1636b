// Sparse attention with sinks over the sliding window plus compressed rows, and the
// sliding-window ring that feeds it (twin of cpu/attention.cpp; architecture.md §3.3, §3.4,
// §4.1).
//
// Softmax is exact two-pass per (query, head), as on the CPU: logits, their max, then the
// weighted sum. The sink joins the denominator but not the max; in deepseek numerics the
// probabilities are rounded to bf16 before P·V while the denominator sums the unrounded
// exponentials (§3.3).
//
// Compressed rows are read in their stored format (core/row_format.h): the kernel is compiled per
// row kind, and a lane reads groups of 4 dims (one 4-byte load of e4m3 codes, or 16 bytes of
// floats from the window).
//
// Parallelisation, many queries (prefill): one block of 256 threads per (query, head). (Few
// queries, i.e. decode, take the split kernels further down: the same softmax over slices of
// rows, so the whole GPU works on one token.) The query and the logits of every
// row it attends live in shared memory (so the row count is bounded by shared memory: ~50K rows
// on Hopper). Phase 1 lists the compressed rows (a warp compacts the indexer's selection with
// ballots, keeping its order); phase 2 has one warp per row for the dot product (double, shuffle
// reduction); phase 3 the max and exponentials block-wide; phase 4 sums P·V in double: warp w
// takes every 8th row, each lane the groups of 4 dims at 128·i + 4·lane (so each row is one
// coalesced read with many loads in flight; one thread per dim walking all rows was
// latency-bound), and the 8 partial sums are added in warp order. Double sums in another order
// than the CPU's (device_math.cuh).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kAttnThreads = 256;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kMaxHeadDim = 512;  // phase 4 keeps hd/32 double sums per lane in registers

__global__ void swa_gather_kernel(const float* ring, int64_t window, int64_t width, int64_t pos_begin, float* dst) {
  const int64_t p = pos_begin + blockIdx.x;
  const float* src = ring + (p % window) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[blockIdx.x * width + c] = src[c];
}

// Row i of `rows` (i ≥ first) to ring slot (pos0 + i) mod window; only the last `window` rows are
// written, so no two blocks share a slot.
__global__ void swa_store_kernel(float* ring, int64_t window, int64_t width, const float* rows, int64_t pos0,
                                 int64_t first) {
  const int64_t i = first + blockIdx.x;
  float* dst = ring + ((pos0 + i) % window) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[c] = rows[i * width + c];
}

struct AttnArgs {
  const float* q;
  int64_t H, hd, p0;
  SwaRows swa;
  CompressedRows comp;
  const float* sinks;
  float softmax_scale;
  int64_t n_max;
  bool bf16;
  float* out;
};

// A lane's share of a row: the groups of 4 dims starting at 128·i + 4·lane.
constexpr int kGroups = kMaxHeadDim / 128;

// Row r's dot with the query, this lane's part (rows of kind K).
template <RowFormat::Kind K>
// (The query is kept in double: one float-to-double conversion less per product.)
__device__ inline double dot_part(const RowFormat& f, const float* r, const double* qs, int64_t hd, int lane) {
  double acc = 0.0;
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    const int32_t d0 = 128 * i + 4 * lane;
    if (d0 >= hd) break;
    float v[4];
    row_values4<K>(f, r, d0, v);
#pragma unroll
    for (int c = 0; c < 4; ++c) acc += qs[d0 + c] * double(v[c]);
  }
  return acc;
}

// acc += p · row r, this lane's dims (acc[4·i + c] holds dim 128·i + 4·lane + c).
template <RowFormat::Kind K>
__device__ inline void add_part(const RowFormat& f, const float* r, double p, int64_t hd, int lane,
                                double (&acc)[4 * kGroups]) {
#pragma unroll
  for (int i = 0; i < kGroups; ++i) {
    const int32_t d0 = 128 * i + 4 * lane;
    if (d0 >= hd) break;
    float v[4];
    row_values4<K>(f, r, d0, v);
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[4 * i + c] += p * double(v[c]);
  }
}

template <RowFormat::Kind K>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttnArgs a) {
  extern __shared__ double smem[];
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  __shared__ int64_t n_comp_s;
  const int64_t t = blockIdx.x, h = blockIdx.y, hd = a.hd, pos = a.p0 + t;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  double* part = smem;                                       // [warps][hd] phase 4 partial sums
  double* qs = part + kAttnWarps * hd;                       // [hd]
  float* p = reinterpret_cast<float*>(qs + hd);              // [n_max] logits, then probabilities
  int32_t* comp_rows = reinterpret_cast<int32_t*>(p + a.n_max);  // [k] selected compressed rows

  // Phase 1: the rows this query attends: window rows [lo, pos], then compressed rows.
  const int64_t lo = pos - a.swa.window + 1 > 0 ? pos - a.swa.window + 1 : 0;
  const int64_t n_win = pos - lo + 1;
  if (warp == 0) {
    int64_t count = 0;
    if (a.comp.idx) {
      for (int64_t base = 0; base < a.comp.k; base += 32) {
        const int32_t w = base + lane < a.comp.k ? a.comp.idx[t * a.comp.k + base + lane] : -1;
        const bool valid = w >= 0 && w < a.comp.n;
        const unsigned ballot = __ballot_sync(kFullMask, valid);
        if (valid) comp_rows[count + __popc(ballot & ((1u << lane) - 1))] = w;
        count += __popc(ballot);
      }
    } else if (a.comp.ratio > 0) {
      count = (pos + 1) / a.comp.ratio < a.comp.n ? (pos + 1) / a.comp.ratio : a.comp.n;
    }
    if (lane == 0) n_comp_s = count;
  }
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = a.q[(t * a.H + h) * hd + d];
  __syncthreads();
  const int64_t n = n_win + n_comp_s;
  // Row j: a window row (fp32) or a compressed row in its stored format (kind K).
  const RowFormat window_format = RowFormat::plain(int32_t(hd));
  auto window_row = [&](int64_t j) { return a.swa.kv + (lo + j - a.swa.first_pos) * hd; };
  auto comp_row = [&](int64_t j) {
    const int64_t w = a.comp.idx ? comp_rows[j - n_win] : j - n_win;
    return a.comp.kv + w * a.comp.format.stride;
  };

  // Phase 2: logits, one warp per row.
  for (int64_t j = warp; j < n; j += n_warps) {
    double acc = j < n_win ? dot_part<RowFormat::f32>(window_format, window_row(j), qs, hd, lane)
                           : dot_part<K>(a.comp.format, comp_row(j), qs, hd, lane);
    acc = warp_sum(acc);
    if (lane == 0) p[j] = float(acc) * a.softmax_scale;
  }
  __syncthreads();

  // Phase 3: the max (without the sink), exponentials, the denominator with the sink.
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, p[j]);
  mx = block_max(mx, fscratch);
  double den = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = exp_f(p[j] - mx);
    den += e;
    p[j] = round_if(a.bf16, e);
  }
  den = block_sum(den, dscratch) + exp_f(a.sinks[h] - mx);

  // Phase 4: P·V (see the top).
  double acc[4 * kGroups] = {};
  for (int64_t j = warp; j < n; j += n_warps) {
    if (j < n_win)
      add_part<RowFormat::f32>(window_format, window_row(j), double(p[j]), hd, lane, acc);
    else
      add_part<K>(a.comp.format, comp_row(j), double(p[j]), hd, lane, acc);
  }
#pragma unroll
  for (int i = 0; i < kGroups; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (128 * i + 4 * lane < hd) part[warp * hd + 128 * i + 4 * lane + c] = acc[4 * i + c];
  __syncthreads();
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    double sum = 0.0;
    for (int w = 0; w < n_warps; ++w) sum += part[w * hd + d];
    a.out[(t * a.H + h) * hd + d] = round_if(a.bf16, float(sum) / float(den));
  }
}

// ---- split over rows: few queries (decode) ------------------------------------------------------
// One block per (query, head) leaves most of the GPU idle and waits on memory row after row. With
// few queries the same exact two-pass softmax runs in three kernels over slices of kSplitRows
// rows, grid (query, head, slice): the logits and each slice's max; the global max (over the
// slice maxima), the slice's exponentials, its share of the denominator and of P·V; and the sum
// of the slices in slice order. A selection's −1 entries stay in place as rows that are skipped
// (logit −∞, no share of P·V).
constexpr int kSplitRows = 64;

struct SplitArgs {
  AttnArgs a;
  int64_t slices;
  float* logits;     // [T, H, n_max]
  float* slice_max;  // [T, H, slices]
  double* den;       // [T, H, slices]
  double* partial;   // [T, H, slices, hd]
};

// The rows query t attends, in order: window rows, then compressed rows (the visible ones, or
// the indexer's selection with its invalid entries).
struct QueryRows {
  int64_t lo, n_win, n;
  __device__ QueryRows(const AttnArgs& a, int64_t t) {
    const int64_t pos = a.p0 + t;
    lo = pos - a.swa.window + 1 > 0 ? pos - a.swa.window + 1 : 0;
    n_win = pos - lo + 1;
    const int64_t visible = a.comp.ratio > 0 ? (pos + 1) / a.comp.ratio : 0;
    n = n_win + (a.comp.idx ? a.comp.k : (visible < a.comp.n ? visible : a.comp.n));
  }
  // Compressed row of entry j ≥ n_win, or −1 for none.
  __device__ int64_t compressed(const AttnArgs& a, int64_t t, int64_t j) const {
    if (!a.comp.idx) return j - n_win;
    const int32_t w = a.comp.idx[t * a.comp.k + j - n_win];
    return w >= 0 && w < a.comp.n ? w : -1;
  }
};

// Slice s of the rows: [begin, end).
__device__ inline void slice_range(const QueryRows& rows, int64_t s, int64_t& begin, int64_t& end) {
  begin = s * kSplitRows;
  end = begin + kSplitRows < rows.n ? begin + kSplitRows : rows.n;
}

template <RowFormat::Kind K>
__global__ void __launch_bounds__(kAttnThreads) split_logits_kernel(SplitArgs s) {
  __shared__ double qs[kMaxHeadDim];
  __shared__ float fscratch[32];
  const AttnArgs& a = s.a;
  const int64_t t = blockIdx.x, h = blockIdx.y, hd = a.hd, at = (t * a.H + h) * s.slices + blockIdx.z;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const QueryRows rows(a, t);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = a.q[(t * a.H + h) * hd + d];
  __syncthreads();
  const RowFormat window_format = RowFormat::plain(int32_t(hd));
  int64_t begin, end;
  slice_range(rows, blockIdx.z, begin, end);
  float* logits = s.logits + (t * a.H + h) * a.n_max;
  float mx = -INFINITY;
  for (int64_t j = begin + warp; j < end; j += kAttnWarps) {
    const int64_t w = j < rows.n_win ? 0 : rows.compressed(a, t, j);
    if (w < 0) {  // an empty selection entry (uniform over the warp)
      if (lane == 0) logits[j] = -INFINITY;
      continue;
    }
    double acc = j < rows.n_win
                     ? dot_part<RowFormat::f32>(window_format, a.swa.kv + (rows.lo + j - a.swa.first_pos) * hd, qs, hd, lane)
                     : dot_part<K>(a.comp.format, a.comp.kv + w * a.comp.format.stride, qs, hd, lane);
    acc = warp_sum(acc);
    const float l = float(acc) * a.softmax_scale;
    if (lane == 0) logits[j] = l;
    mx = fmaxf(mx, l);
  }
  mx = block_max(mx, fscratch);
  if (threadIdx.x == 0) s.slice_max[at] = mx;
}

// The max of query t, head h over every slice (fmax: exact in any order).
__device__ inline float global_max(const SplitArgs& s, const QueryRows& rows, int64_t t, int64_t h, float* scratch) {
  const int64_t used = (rows.n + kSplitRows - 1) / kSplitRows, base = (t * s.a.H + h) * s.slices;
  float mx = -INFINITY;
  for (int64_t sl = threadIdx.x; sl < used; sl += blockDim.x) mx = fmaxf(mx, s.slice_max[base + sl]);
  return block_max(mx, scratch);
}

template <RowFormat::Kind K>
__global__ void __launch_bounds__(kAttnThreads) split_values_kernel(SplitArgs s) {
  extern __shared__ double part[];  // [warps][hd]
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const AttnArgs& a = s.a;
  const int64_t t = blockIdx.x, h = blockIdx.y, hd = a.hd, at = (t * a.H + h) * s.slices + blockIdx.z;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const QueryRows rows(a, t);
  const float* logits = s.logits + (t * a.H + h) * a.n_max;
  const float mx = global_max(s, rows, t, h, fscratch);
  int64_t begin, end;
  slice_range(rows, blockIdx.z, begin, end);
  double den = 0.0;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) den += exp_f(logits[j] - mx);
  den = block_sum(den, dscratch);
  const RowFormat window_format = RowFormat::plain(int32_t(hd));
  double acc[4 * kGroups] = {};
  for (int64_t j = begin + warp; j < end; j += kAttnWarps) {
    const int64_t w = j < rows.n_win ? 0 : rows.compressed(a, t, j);
    if (w < 0) continue;
    const double pj = round_if(a.bf16, exp_f(logits[j] - mx));
    if (j < rows.n_win)
      add_part<RowFormat::f32>(window_format, a.swa.kv + (rows.lo + j - a.swa.first_pos) * hd, pj, hd, lane, acc);
    else
      add_part<K>(a.comp.format, a.comp.kv + w * a.comp.format.stride, pj, hd, lane, acc);
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
    s.partial[at * hd + d] = sum;
  }
  if (threadIdx.x == 0) s.den[at] = den;
}

__global__ void __launch_bounds__(kAttnThreads) split_combine_kernel(SplitArgs s) {
  __shared__ float fscratch[32];
  const AttnArgs& a = s.a;
  const int64_t t = blockIdx.x, h = blockIdx.y, hd = a.hd;
  const QueryRows rows(a, t);
  const float mx = global_max(s, rows, t, h, fscratch);
  const int64_t used = (rows.n + kSplitRows - 1) / kSplitRows, base = (t * a.H + h) * s.slices;
  double den = 0.0;
  for (int64_t sl = 0; sl < used; ++sl) den += s.den[base + sl];
  den += exp_f(a.sinks[h] - mx);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    double sum = 0.0;
    for (int64_t sl = 0; sl < used; ++sl) sum += s.partial[(base + sl) * hd + d];
    a.out[(t * a.H + h) * hd + d] = round_if(a.bf16, float(sum) / float(den));
  }
}

}  // namespace

void CudaBackend::swa_gather(const float* ring, int64_t window, int64_t width, int64_t pos_begin, int64_t pos_end,
                             float* dst) {
  Timed timed(*this, "swa_gather");
  if (pos_end <= pos_begin) return;
  swa_gather_kernel<<<unsigned(pos_end - pos_begin), 128, 0, stream_>>>(ring, window, width, pos_begin, dst);
  DSV4_CUDA_LAUNCHED("swa_gather");
}

void CudaBackend::swa_store(float* ring, int64_t window, int64_t width, const float* rows, int64_t pos0, int64_t n) {
  Timed timed(*this, "swa_store");
  const int64_t first = std::max<int64_t>(0, n - window);
  if (n <= first) return;
  swa_store_kernel<<<unsigned(n - first), 128, 0, stream_>>>(ring, window, width, rows, pos0, first);
  DSV4_CUDA_LAUNCHED("swa_store");
}

void CudaBackend::attention(const float* q, int64_t T, int64_t H, int64_t hd, int64_t p0, const SwaRows& swa,
                            const CompressedRows& comp, const float* sinks, float softmax_scale, float* out) {
  Timed timed(*this, "attention");
  DSV4_CUDA_REQUIRE(swa.first_pos <= std::max<int64_t>(0, p0 - swa.window + 1) && swa.first_pos + swa.n >= p0 + T,
                    "window rows [", swa.first_pos, ", ", swa.first_pos + swa.n, ") do not cover queries [", p0, ", ",
                    p0 + T, ")");
  if (T == 0 || H == 0) return;
  // The most rows any query attends: the window, plus the selection or the visible compressed rows.
  int64_t n_comp_max = 0;
  if (comp.idx)
    n_comp_max = comp.k;
  else if (comp.ratio > 0)
    n_comp_max = std::min(comp.n, (p0 + T) / comp.ratio);
  const int64_t n_max = std::min(swa.window, p0 + T) + n_comp_max;
  const int64_t slices = (n_max + kSplitRows - 1) / kSplitRows;
  DSV4_CUDA_REQUIRE(hd <= kMaxHeadDim, "attention: head dim ", hd, " above ", kMaxHeadDim);
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
  if (slices >= 2 && T * H * slices <= (int64_t(1) << 16)) {  // few queries (decode)
    DeviceArray<float> logits(stream_, size_t(T * H * n_max)), slice_max(stream_, size_t(T * H * slices));
    DeviceArray<double> den(stream_, size_t(T * H * slices)), partial(stream_, size_t(T * H * slices * hd));
    const SplitArgs split{args, slices, logits.get(), slice_max.get(), den.get(), partial.get()};
    const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(H), static_cast<unsigned>(slices));
    const size_t part_bytes = size_t(kAttnWarps * hd) * sizeof(double);
    (fp8_rows ? split_logits_kernel<RowFormat::fp8_bf16> : split_logits_kernel<RowFormat::f32>)
        <<<grid, kAttnThreads, 0, stream_>>>(split);
    DSV4_CUDA_LAUNCHED("attention (split logits)");
    (fp8_rows ? split_values_kernel<RowFormat::fp8_bf16> : split_values_kernel<RowFormat::f32>)
        <<<grid, kAttnThreads, part_bytes, stream_>>>(split);
    DSV4_CUDA_LAUNCHED("attention (split values)");
    split_combine_kernel<<<dim3(unsigned(T), unsigned(H)), kAttnThreads, 0, stream_>>>(split);
    DSV4_CUDA_LAUNCHED("attention (split combine)");
    return;
  }
  const size_t smem = size_t((kAttnWarps + 1) * hd) * sizeof(double) + size_t(n_max) * sizeof(float) +
                      (comp.idx ? size_t(comp.k) * sizeof(int32_t) : 0);
  int device = 0, smem_limit = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (smem + 1024 > size_t(smem_limit))
    fail_unsupported(cat("attention: ", n_max, " rows per query need ", smem, " bytes of shared memory (limit ",
                         smem_limit, ")"));
  const auto kernel = fp8_rows ? attention_kernel<RowFormat::fp8_bf16> : attention_kernel<RowFormat::f32>;
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<dim3(unsigned(T), unsigned(H)), kAttnThreads, smem, stream_>>>(args);
  DSV4_CUDA_LAUNCHED("attention");
}

}  // namespace dsv4::cuda
