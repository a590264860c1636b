// The Lightning Indexer's scores over compact (FP4) keys in deepseek numerics (twin of the score
// loop of cpu/indexer.cpp): score_w = bf16(Σ_h bf16(relu(bf16(q_h · K_w)) · w_h)), the head sum in
// double in head order.
//
// The dot. q and k are e2m1 · 2^e with one E8M0 exponent e per 32-block, so a block's dot is
// 2^(e_q + e_k − 2) times an integer sum of products of 2·e2m1 values (integers in [−12, 12]): the
// int8 tensor cores (mma m16n8k32, keys × heads) give it exactly. A row whose block exponents lie
// within kMaxFold of its least is folded: block b's codes times 2^(e_b − e_min), every block e_min,
// so one int32 sum over the row is the dot (|c| < 128 · 96² < 2^21).
//
// Fast terms. When every row a warp multiplies is folded, the dot is c · 2^E with E = E_q + E_k − 2,
// and the terms take few instructions, and one conversion per two (Hopper issues conversions at a
// quarter of the FP32 rate; per-term double conversions bounded the kernel before): c arrives as
// the float 1.5 · 2^23 + c (the sum starts from that float's bits), one subtraction makes it a
// float; one conversion rounds two heads' dots to a bf16 pair, one bf16x2 multiply by their weights
// gives both terms (the weights are bf16 in deepseek numerics, so the product of two 8-bit
// significands is exact and rounding it once is the CPU's float product, then bf16); the power
// 2^E_k of the key is left out of the term (exact while everything stays normal) and applied to
// the sum; a term's bits, as a float's, shifted right by 3 are a double 2^-896 times the term,
// which one fused multiply-add by ±2^896 adds to the lane's sum. A lane sums
// its 2 of every 8 heads, then two shuffles add the 4 lanes: in another order than the CPU's, which
// is the same sum when it is exact in double. prepare_fp4_queries bounds, per query, the exponents
// the terms can have (the range of E_q + log2|w| over the heads, and the key exponents that keep
// every step normal) and requires bf16 weights; a warp whose keys fall outside takes the ordered path.
//
// Ordered terms (rows of wider exponent spreads, queries outside the bounds): one block at a time,
// the block sums folded into double dots in block order as the CPU does; each head's bf16 term to
// the warp's shared memory; then a lane per key adds its terms in head order.
//
// Layout: a block stages kFp4KeysPerBlock keys once, each warp holds its 32 in registers (A
// fragments), and serves kFp4QueriesPerBlock queries in turn, reading their prepared operands
// from global memory (the L1 keeps them for the block's other warps): no barrier per query.
//
// deepseek-tc (indexer_scores_fp4_tc_kernel, sm_90a): the same terms, summed on the tensor cores.
// The folded dots come from wgmma (m64n64k32 s8: a warpgroup's 128 keys in registers, the same A
// fragments, against a query's 64 head rows in shared memory), whose C fragments of two head tiles
// are, packed as bf16 pairs, the A fragment of a 16-key × 16-head mma.m16n8k16; its B is a column of
// the heads' signs, since relu(d) · w = sign(w) · relu(d · |w|), so one fused multiply-add with relu
// makes two terms. Only the sum differs from the exact path's: the tensor cores' fp32 accumulation
// against an ordered double sum, below fp32's last bit, so a score's bf16 rounding changes only
// when its sum lies within a few fp32 ulps of a bf16 tie. Each query's head rows (in wgmma's
// 128-byte swizzle), weight and sign pairs and bounds form an image the prepare kernel writes once;
// thread 0 copies it whole (cp.async.bulk) into one of kTcStages stages, kTcStages − 1 queries ahead.
// The dots become floats by conversion, not by the exact path's bias: int-to-float issues at half
// the FP32 rate on an H200, so an add and a subtraction cost more (bench/cuda/conversion_rates.cu).
//
// Measured on an H200 (4 synthetic V4-Flash layers, 1M prompt, chunks of 8 192 queries): 79.7 ms
// per chunk with the top-k, 19.9 per 2 048 queries (44.3 with per-head doubles and conversions, the
// terms staged in shared memory for an ordered sum); 99.96% of warps took the fast path (a counter,
// not kept). deepseek-tc's kernel at a 256K prompt (ncu, all launches): 199 ms against the exact
// kernel's 590 (378 with the tensor-core head sums on mma.sync alone; 230 while each query divided
// for its visible keys, the products started from a float bias and 44 bytes spilled). ncu of one
// launch of a variant that waited for the key tiles' products one at a time (247 ms, not kept):
// IPC 2.27, 1.12 eligible warps per scheduler at 2 blocks of 8 warps per SM (128 registers), ≈ 490
// instructions per warp and query where the terms need ≈ 250, the integer pipe the busiest (36%).
#include "backend/cuda/indexer_fp4.cuh"

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kFp4MaxDim = 128;  // V4's index_head_dim
constexpr int kFp4MaxBlocks = kFp4MaxDim / RowFormat::kFp4Block;
static_assert(kFp4MaxBlocks == 4, "a head's block exponents are one int4 (Fp4Queries::exps)");
constexpr int kFp4Warps = 4;
constexpr int kKeysPerWarp = 32;  // two 16-key tiles: each query operand serves both
constexpr int kFp4KeysPerBlock = kKeysPerWarp * kFp4Warps;
constexpr int kFp4QueriesPerBlock = 32;
constexpr int kFp4Threads = 32 * kFp4Warps;
// deepseek-tc's kernel: two warpgroups of 128 keys each; per query an image of kImageBytes (its 64
// head rows as wgmma's B operand, kImageTile bytes, then the weight and sign pairs, then the bounds)
// in one of kTcStages stages of shared memory, each from a 1024-byte boundary (the swizzle's period).
constexpr int kTcWarps = 8;
constexpr int kTcThreads = 32 * kTcWarps, kTcKeysPerBlock = kKeysPerWarp * kTcWarps, kTcQueriesPerBlock = 64;
constexpr int kImageHeads = 64, kImageTile = kImageHeads * 128, kImageBytes = int(Fp4QueryArrays<true>::kImageWords * 16);
static_assert(kImageBytes == kImageTile + 256 + 16, "the image's parts");
constexpr int kTcStages = 4, kStageBytes = (kImageBytes + kSwizzlePeriod - 1) / kSwizzlePeriod * kSwizzlePeriod;
// Int8 words (4 codes) per staged key row: the 8 rows × 4 lanes of a fragment load fall on
// distinct banks with a stride of 4 (mod 32) words.
constexpr int kFp4WordStride = kFp4MaxDim / 4 + 4;

// See the top: folded blocks lie within kMaxFold of the row's least exponent (|12 · 2^3| fits int8).
constexpr int kMaxFold = 3;
// The fast terms' bounds: the terms of a head lie in [2^a, 2^(a + 22)] times 2^E_k, a = E_q − 2 +
// ⌊log2|w|⌋ (c < 2^21, so bf16(c) ≤ 2^21, times |w| < 2^(⌊log2|w|⌋ + 1)), each with 8 significant
// bits; 64 of them sum exactly in double when the spread of a over the heads is at most 53 − 28 − 7.
constexpr int kMaxTermSpread = 18;
constexpr int kMagicBits = 0x4B400000;  // the float 1.5 · 2^23: its bits plus c are 1.5 · 2^23 + c
constexpr float kMagic = 12582912.0f;
constexpr uint32_t kPlus2p896 = 0x77F00000u, kMinus2p896 = 0xF7F00000u;  // high words of ±2^896

// A row's staged block exponents (unbiased) and its codes' shifts: folded when its `blocks` E8M0
// exponents lie within kMaxFold of their least (every block then takes e_min, blocks past the width
// too, so a folded row's exponents are all equal), else each block its own (0 past the width).
struct StagedRow {
  int e[kFp4MaxBlocks], shift[kFp4MaxBlocks];
};
__device__ inline StagedRow staged_row(const uint8_t* scales, int blocks) {
  int lo = INT_MAX, hi = INT_MIN;
  for (int j = 0; j < blocks; ++j) lo = min(lo, int(scales[j])), hi = max(hi, int(scales[j]));
  const bool folded = hi - lo <= kMaxFold;
  StagedRow s;
#pragma unroll
  for (int b = 0; b < kFp4MaxBlocks; ++b) {
    const int e = b < blocks ? int(scales[b]) : lo;
    s.e[b] = folded ? lo - 127 : b < blocks ? e - 127 : 0;
    s.shift[b] = folded ? e - lo : 0;
  }
  return s;
}

__device__ inline const uint8_t* row_scales(const float* row, const RowFormat& f) {
  return reinterpret_cast<const uint8_t*>(row) + f.scale_offset();
}

// Half-word j (8 codes) of a row as two int8 words (dims 8j … 8j + 7), staged (folded where it can be).
__device__ inline void staged_words(const float* row, const RowFormat& f, int j, int shift, uint32_t (&w)[2]) {
  const uint32_t nibbles = j < f.width / 8 ? reinterpret_cast<const uint32_t*>(row)[j] : 0u;
  fp4_to_int8x8(nibbles, w[0], w[1], shift);
}

// Whether a staged row's exponents are all equal: folded, or one exponent throughout.
__device__ inline bool one_exponent(const int* exps) {
  bool same = true;
#pragma unroll
  for (int b = 1; b < kFp4MaxBlocks; ++b) same &= exps[b] == exps[0];
  return same;
}

// The prepared form of T queries laid out in `buffer`: each array for all T, one after another.
Fp4QueryArrays<true> queries_in(void* buffer, int64_t T, int64_t heads, bool images) {
  using Q = Fp4QueryArrays<true>;
  const int64_t tiles = head_tiles(heads);
  auto* words = static_cast<uint4*>(buffer);
  auto* exps = reinterpret_cast<int4*>(words + T * tiles * Q::kWords);
  auto* lanes = reinterpret_cast<uint4*>(exps + T * tiles * Q::kExps);
  auto* query = reinterpret_cast<int4*>(lanes + T * tiles * Q::kLanes);
  return {words, exps, lanes, query, images ? reinterpret_cast<uint4*>(query + T) : nullptr};
}

// A block per query: its heads' rows staged as the keys are (folded where they can be), the words
// in each lane's fragment order; per head its exponents, |w| · 2^(E_q − 2) and the sign of w as
// ±2^896 (0 for w = 0 and the padding heads); the query's bounds (see the top). Heads of w = 0
// have zero terms but their dots still bound E (the CPU multiplies them by 0: a dot must stay finite).
__global__ void __launch_bounds__(kFp4Threads)
    indexer_prepare_queries_kernel(const float* qc, const float* wts, int heads, RowFormat f, Fp4QueryArrays<true> out) {
  await_previous_kernel();
  __shared__ int lo_q, hi_q, lo_a, hi_a, fast;
  const int64_t t = blockIdx.x;
  const int tiles = int(head_tiles(heads)), rows = 8 * tiles, blocks = f.width / RowFormat::kFp4Block;
  if (threadIdx.x == 0) lo_q = lo_a = INT_MAX, hi_q = hi_a = INT_MIN, fast = 1;
  __syncthreads();
  const Fp4QueryArrays<true> own = out.from(t, heads);
  uint32_t* words = reinterpret_cast<uint32_t*>(own.words);
  uint32_t* lanes = reinterpret_cast<uint32_t*>(own.lanes);
  // The image (heads ≤ kImageHeads): head rows as wgmma reads them; per lane column pair i and head
  // tile j, the bf16 pairs |w| · 2^(E_q − 2) (word 16i + 2j) and ±1 (the next word).
  uint8_t* image = reinterpret_cast<uint8_t*>(own.images);
  uint16_t* pair_halves = image ? reinterpret_cast<uint16_t*>(image + kImageTile) : nullptr;
  auto pair_half = [](int h, int word) { return 2 * (16 * (h % 8 / 2) + 2 * (h / 8) + word) + h % 2; };
  for (int h = rows + threadIdx.x; image && h < kImageHeads; h += blockDim.x) {  // padding heads: zero terms
    for (int c = 0; c < 8; ++c) *reinterpret_cast<uint4*>(image + swizzled(h, c)) = make_uint4(0, 0, 0, 0);
    pair_halves[pair_half(h, 0)] = 0, pair_halves[pair_half(h, 1)] = 0x3F80;
  }
  for (int h = threadIdx.x; h < rows; h += blockDim.x) {
    const float* row = qc + (t * heads + h) * f.stride;
    const StagedRow staged = h < heads ? staged_row(row_scales(row, f), blocks) : StagedRow{};
    const int(&e)[kFp4MaxBlocks] = staged.e;
    for (int j = 0; j < kFp4MaxDim / 8; ++j) {
      uint32_t w[2] = {0u, 0u};
      if (h < heads) staged_words(row, f, j, staged.shift[j / 4], w);
      // Word 2j + k holds dims 4(2j + k) …: in block j / 4 at r = (2j + k) mod 8, the B fragment's b0
      // (r < 4) or b1 of lane (g = h mod 8, i = r mod 4).
      for (int k = 0; k < 2; ++k) {
        const int r = (2 * j + k) % 8;
        words[((h / 8) * 32 + 4 * (h % 8) + r % 4) * 8 + 2 * (j / 4) + r / 4] = w[k];
      }
      if (image) *reinterpret_cast<uint2*>(image + swizzled(h, j / 2) + 8 * (j % 2)) = make_uint2(w[0], w[1]);
    }
    const float w = h < heads ? wts[t * heads + h] : 0.0f;
    if (h < heads) {
      atomicMin(&lo_q, e[0]);
      atomicMax(&hi_q, e[0]);
      if (!one_exponent(e)) fast = 0;
    }
    out.exps[t * rows + h] = make_int4(e[0], e[1], e[2], e[3]);
    const int w_field = int((f32_bits(w) >> 23) & 0xff), a = w_field - 127 + e[0] - 2;
    if (w != 0.0f) {
      atomicMin(&lo_a, a);
      atomicMax(&hi_a, a);
      // Subnormal w or not a bf16 (the bf16 products need it); a scaled weight not normal, or a
      // term (≤ 2^(a + 22)) near the float range's end.
      if (w_field == 0 || (f32_bits(w) & 0xffffu) || a < -126 || a > 88) fast = 0;
    }
    const int at = ((h / 8) * 4 + (h % 8) / 2) * 4 + h % 2;  // lane column pair (h mod 8) / 2, column h mod 2
    lanes[at] = f32_bits(w != 0.0f ? ldexpf(fabsf(w), e[0] - 2) : 0.0f);
    lanes[at + 2] = w > 0.0f ? kPlus2p896 : w < 0.0f ? kMinus2p896 : 0u;
    if (image) {  // (a bf16 whenever the fast terms are used)
      pair_halves[pair_half(h, 0)] = uint16_t(lanes[at] >> 16);
      pair_halves[pair_half(h, 1)] = w < 0.0f ? 0xBF80 : 0x3F80;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool weighted = lo_a <= hi_a;  // (lo_q ≤ hi_q: heads ≥ 1)
    // E = E_q + E_k − 2 in [−126, 106] keeps c · 2^E (|c| ≤ 2^21) normal; a + E_k in [−126, 105] the terms.
    const int4 bounds = make_int4(fast && (!weighted || hi_a - lo_a <= kMaxTermSpread),
                                  weighted ? max(-124 - lo_q, -126 - lo_a) : -124 - lo_q,
                                  weighted ? min(108 - hi_q, 105 - hi_a) : 108 - hi_q, 0);
    out.query[t] = bounds;
    if (image) *reinterpret_cast<int4*>(image + kImageBytes - 16) = bounds;
  }
}

// Rows of FP4 codes (f) into shared memory as int8 words and exponents, folded where kMaxFold
// allows: row r is src + r·f.stride, present when r < n_present (else zeros, exponents 0); rows are
// padded to kFp4WordStride words, blocks past the row's width left zero. A thread per row stages
// its exponents and shifts, then the words go 16 threads to a row (coalesced loads).
__device__ inline void stage_fp4_rows(const float* src, RowFormat f, int rows, int n_present, uint32_t* words,
                                      int* exps, uint8_t* shifts) {
  constexpr int kHalfWords = kFp4MaxDim / 8;  // 8 codes each; 4 per 32-block
  const int blocks = f.width / RowFormat::kFp4Block;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const float* row = src + int64_t(r) * f.stride;
    const StagedRow staged = r < n_present ? staged_row(row_scales(row, f), blocks) : StagedRow{};
    for (int b = 0; b < kFp4MaxBlocks; ++b) {
      exps[r * kFp4MaxBlocks + b] = staged.e[b];
      shifts[r * kFp4MaxBlocks + b] = uint8_t(staged.shift[b]);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * kHalfWords; i += blockDim.x) {
    const int r = i / kHalfWords, j = i % kHalfWords;
    uint32_t w[2] = {0u, 0u};
    if (r < n_present) staged_words(src + int64_t(r) * f.stride, f, j, shifts[r * kFp4MaxBlocks + j / 4], w);
    words[r * kFp4WordStride + 2 * j] = w[0];
    words[r * kFp4WordStride + 2 * j + 1] = w[1];
  }
}

// double(i), exactly, on the FP64 pipe (2^52 + 2^31 + i is exact) instead of the slower conversion unit.
__device__ __forceinline__ double int_to_double(int i) {
  return __hiloint2double(0x43300000, i ^ int(0x80000000)) - 4503601774854144.0;  // − (2^52 + 2^31)
}

// Two fast terms (see the top), heads 2i and 2i + 1 of one key, from their dots' c as 1.5 · 2^23 + c
// in float bits and the heads' |w| · 2^(E_q − 2) as a bf16 pair: bf16(bf16(relu(c)) · W) · 2^-896
// each, as doubles.
__device__ __forceinline__ void fast_terms(int c0, int c1, uint32_t W, double& t0, double& t1) {
  const float f0 = fmaxf(__fsub_rn(__int_as_float(c0), kMagic), 0.0f);
  const float f1 = fmaxf(__fsub_rn(__int_as_float(c1), kMagic), 0.0f);
  const __nv_bfloat162 weights = bf16x2_pair(W);
  const uint32_t t = bf16x2_bits(__hmul2_rn(__floats2bfloat162_rn(f0, f1), weights));  // low half: head 2i
  t0 = __hiloint2double(int((t << 13) & 0x1fffe000u), 0);
  t1 = __hiloint2double(int((t >> 3) & 0x1fffe000u), 0);
}

using KeyOperands = uint32_t[2][kFp4MaxBlocks][4];  // A fragments of the warp's two key tiles

// A head tile's operands for one lane: its 8 B-fragment words (b0, b1 of blocks 0 … 3) and its
// column pair's scaled weights and signs. words, lanes: the query's, at this lane's (tile 0).
struct TileOperands {
  uint4 lo, hi, w;
};
__device__ __forceinline__ TileOperands load_tile(const uint4* words, const uint4* lanes, int nt) {
  return {__ldg(words + nt * 64), __ldg(words + nt * 64 + 1), __ldg(lanes + nt * 4)};
}

// c = 1.5 · 2^23 + the folded dots of the warp's two key tiles with a head tile, as float bits.
__device__ __forceinline__ void fast_products(const KeyOperands& a, const TileOperands& op, int blocks,
                                              int (&c)[2][4]) {
  const uint32_t b[kFp4MaxBlocks][2] = {{op.lo.x, op.lo.y}, {op.lo.z, op.lo.w}, {op.hi.x, op.hi.y}, {op.hi.z, op.hi.w}};
#pragma unroll
  for (int tile = 0; tile < 2; ++tile)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[tile][e] = kMagicBits;
#pragma unroll
  for (int bl = 0; bl < kFp4MaxBlocks; ++bl) {
    if (bl >= blocks) break;
#pragma unroll
    for (int tile = 0; tile < 2; ++tile) mma_i8_add(c[tile], a[tile][bl], b[bl][0], b[bl][1]);
  }
}

// The fast path's sum for one query: the warp's key (row 8i + g of its 32) in this lane, times
// 2^-E_k (applied by the caller). A head tile's operands are loaded two tiles ahead and its
// products issued one tile ahead of its terms, so a warp rarely waits on either.
__device__ inline double fast_sum(const uint4* words, const uint4* lanes, const KeyOperands& a, int tiles,
                                  int blocks) {
  const int lane = threadIdx.x % 32, i = lane % 4;
  words += lane * 2;
  lanes += i;
  double sum[2][2] = {};  // (tile, row g + 8r): this lane's heads 2i, 2i + 1 of every 8
  TileOperands ahead = load_tile(words, lanes, 0);
  int c[2][4];
  fast_products(a, ahead, blocks, c);
  uint4 w = ahead.w;
  if (tiles > 1) ahead = load_tile(words, lanes, 1);
#pragma unroll 2
  for (int nt = 0; nt < tiles; ++nt) {
    int c_next[2][4];
    uint4 w_next = w;
    if (nt + 1 < tiles) {
      fast_products(a, ahead, blocks, c_next);
      w_next = ahead.w;
      if (nt + 2 < tiles) ahead = load_tile(words, lanes, nt + 2);
    }
    const double sign[2] = {__hiloint2double(int(w.z), 0), __hiloint2double(int(w.w), 0)};
    const uint32_t weights = __byte_perm(w.x, w.y, 0x7632);  // the two f32 weights (bf16 values) as a pair
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        double t0, t1;
        fast_terms(c[tile][2 * r], c[tile][2 * r + 1], weights, t0, t1);
        sum[tile][r] = __fma_rn(t1, sign[1], __fma_rn(t0, sign[0], sum[tile][r]));
      }
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[tile][e] = c_next[tile][e];
    w = w_next;
  }
#pragma unroll
  for (int tile = 0; tile < 2; ++tile)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[tile][r] += __shfl_xor_sync(kFullMask, sum[tile][r], 1);
      sum[tile][r] += __shfl_xor_sync(kFullMask, sum[tile][r], 2);
    }
  return i == 0 ? sum[0][0] : i == 1 ? sum[0][1] : i == 2 ? sum[1][0] : sum[1][1];
}

// The ordered path's sum for one query: the warp's key `lane` (row lane of its 32), exact as the
// CPU's. terms: the warp's [8 · tiles][32] bf16 in shared memory; k_exp the block's key exponents.
__device__ inline double ordered_sum(const uint4* words, const int4* q_exps, const float* w, int heads, int tiles,
                                     int blocks, const KeyOperands& a, const int* k_exp, uint16_t* terms) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, i = lane % 4;
  for (int nt = 0; nt < tiles; ++nt) {
    const uint4 lo = __ldg(words + nt * 64 + lane * 2), hi = __ldg(words + nt * 64 + lane * 2 + 1);
    const uint32_t b[kFp4MaxBlocks][2] = {{lo.x, lo.y}, {lo.z, lo.w}, {hi.x, hi.y}, {hi.z, hi.w}};
    const int c_head = 8 * nt + 2 * i;  // this lane's columns of c: heads c_head, c_head + 1
    const int4 qe0 = q_exps[c_head], qe1 = q_exps[c_head + 1];
    const int qe[2][kFp4MaxBlocks] = {{qe0.x, qe0.y, qe0.z, qe0.w}, {qe1.x, qe1.y, qe1.z, qe1.w}};
    double dot[2][4] = {};  // (tile, row g + 8r, head c_head + j) at [tile][2r + j]
#pragma unroll
    for (int bl = 0; bl < kFp4MaxBlocks; ++bl) {
      if (bl >= blocks) break;
#pragma unroll
      for (int tile = 0; tile < 2; ++tile) {
        int c[4];
        mma_i8<false>(c, a[tile][bl], b[bl][0], b[bl][1]);  // a 32-dim block: keys (rows) × heads, exact
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int key_e = k_exp[(kKeysPerWarp * warp + 16 * tile + g + 8 * r) * kFp4MaxBlocks + bl];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            // The product c · 2^(e_q + e_k − 2) is exact, so one fused multiply-add rounds as the CPU's add.
            const double scale = __hiloint2double(int(pow2_high(key_e + qe[j][bl], 1023 - 2)), 0);
            dot[tile][2 * r + j] = __fma_rn(int_to_double(c[2 * r + j]), scale, dot[tile][2 * r + j]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (c_head + j >= heads) continue;
#pragma unroll
      for (int tile = 0; tile < 2; ++tile)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float d = round_bf16(float(dot[tile][2 * r + j]));
          terms[(c_head + j) * kKeysPerWarp + 16 * tile + g + 8 * r] = f32_to_bf16(fmaxf(d, 0.0f) * w[c_head + j]);
        }
    }
  }
  __syncwarp();
  double acc = 0.0;
  for (int h = 0; h < heads; ++h) acc += double(bf16_to_f32(terms[h * kKeysPerWarp + lane]));
  __syncwarp();  // the terms are read before the next query's are written
  return acc;
}

// A scores block's share of a chunk: the keys w0 … w0 + n_present − 1 (blockIdx.x of blocks of
// `keys`) for its queries t0 … t_end − 1 (blockIdx.y of groups of `queries`, of n_queries);
// n_present ≤ 0 when even its last query (visibility grows with t) sees none of its keys.
struct BlockShare {
  int64_t w0, t0, t_end;
  int n_present;
};
__device__ inline BlockShare block_share(int keys, int queries, int64_t n_queries, int64_t p0, int64_t ratio,
                                         int64_t n_keys) {
  const int64_t w0 = int64_t(blockIdx.x) * keys, t0 = int64_t(blockIdx.y) * queries;
  const int64_t t_end = t0 + queries < n_queries ? t0 + queries : n_queries;
  const int64_t visible_last = visible_keys(t_end - 1, p0, ratio, n_keys);
  return {w0, t0, t_end, int(visible_last - w0 < keys ? visible_last - w0 : keys)};
}

// The warp's 32 staged keys (rows 32 · warp on, of a block's) as A fragments, row 16 · tile + g + 8r
// of its 32 at a[tile][·][r] and [2 + r]; whether every one has one staged exponent, the present
// keys' least and greatest (INT_MAX and INT_MIN when none is), and 2^E_k of this lane's store row
// 8i + g.
struct WarpKeys {
  KeyOperands a;
  bool single;
  int lo, hi;
  double scale;
};
__device__ inline void load_warp_keys(const uint32_t* k_words, const int* k_exp, int n_present, WarpKeys& k) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, i = lane % 4;
  k.single = true;
  k.lo = INT_MAX, k.hi = INT_MIN;
  int own = 0;
#pragma unroll
  for (int tile = 0; tile < 2; ++tile)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = kKeysPerWarp * warp + 16 * tile + g + 8 * r;
      const int* e = k_exp + row * kFp4MaxBlocks;
      k.single &= one_exponent(e);
      if (row < n_present) k.lo = min(k.lo, e[0]), k.hi = max(k.hi, e[0]);
      if (2 * tile + r == i) own = e[0];
#pragma unroll
      for (int bl = 0; bl < kFp4MaxBlocks; ++bl) {
        k.a[tile][bl][r] = k_words[row * kFp4WordStride + 8 * bl + i];
        k.a[tile][bl][2 + r] = k_words[row * kFp4WordStride + 8 * bl + 4 + i];
      }
    }
  k.single = __all_sync(kFullMask, k.single);
  k.lo = __reduce_min_sync(kFullMask, k.lo);
  k.hi = __reduce_max_sync(kFullMask, k.hi);
  k.scale = __hiloint2double(int(pow2_high(own, 1023)), 0);
}

// Whether query bounds (Fp4QueryArrays::query) let the fast terms serve keys of these exponents.
__device__ inline bool fast_for(int4 bounds, bool single, int lo, int hi) {
  return bounds.x && single && lo >= bounds.y && hi <= bounds.z;
}

// Grid (key blocks, query groups): score[t, w] for kFp4QueriesPerBlock queries t in turn and
// kFp4KeysPerBlock keys w (see the top). q: the chunk's prepared queries, wts their weights.
__global__ void __launch_bounds__(kFp4Threads, 4)
    indexer_scores_fp4_kernel(Fp4Queries q, const float* wts, int64_t n_queries, int heads, RowFormat f,
                              const float* keys, int64_t n_keys, int64_t ratio, int64_t p0, Bf16Bits* score) {
  await_previous_kernel();
  extern __shared__ uint32_t fp4_smem[];
  const int tiles = int(head_tiles(heads)), blocks = f.width / RowFormat::kFp4Block;
  int* k_exp = reinterpret_cast<int*>(fp4_smem);                                      // [keys][4]
  uint8_t* k_shift = reinterpret_cast<uint8_t*>(fp4_smem + kFp4KeysPerBlock * kFp4MaxBlocks);  // [keys][4]
  uint32_t* k_words = fp4_smem + kFp4KeysPerBlock * kFp4MaxBlocks * 5 / 4;  // [keys][stride], then the terms
  const auto [w0, t0, t_end, n_present] =
      block_share(kFp4KeysPerBlock, kFp4QueriesPerBlock, n_queries, p0, ratio, n_keys);
  if (n_present <= 0) return;
  stage_fp4_rows(keys + w0 * f.stride, f, kFp4KeysPerBlock, n_present, k_words, k_exp, k_shift);
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, i = lane % 4;
  WarpKeys k;
  load_warp_keys(k_words, k_exp, n_present, k);
  __syncthreads();  // every warp holds its keys: their words' space becomes the terms'
  uint16_t* terms = reinterpret_cast<uint16_t*>(k_words) + warp * 8 * tiles * kKeysPerWarp;
  const int64_t warp_w0 = w0 + kKeysPerWarp * warp;
  VisibleKeys visible_now(t0, p0, ratio, n_keys);
  for (int64_t t = t0; t < t_end; ++t, visible_now.next()) {
    const int64_t visible = visible_now.count();
    if (warp_w0 >= visible) continue;  // (uniform over the warp)
    const Fp4Queries own = q.from(t, heads);
    if (fast_for(__ldg(own.query), k.single, k.lo, k.hi)) {
      const int64_t w = warp_w0 + 8 * i + g;
      const double sum = fast_sum(own.words, own.lanes, k.a, tiles, blocks);
      if (w < visible) score[t * n_keys + w] = f32_to_bf16(float(sum * k.scale));
    } else {
      const double sum = ordered_sum(own.words, own.exps, wts + t * heads, heads, tiles, blocks, k.a, k_exp, terms);
      if (warp_w0 + lane < visible) score[t * n_keys + warp_w0 + lane] = f32_to_bf16(float(sum));
    }
  }
}

#ifdef DSV4_WGMMA
// c += A · Bᵀ over one 32-dim block: A 64 keys of int8 codes in registers (a: this thread's
// fragment, as mma.m16n8k32's for its warp's 16 rows), B the image's 64 head rows in shared memory
// (b: the block's descriptor); exact int32. Without kAccumulate, c = A · Bᵀ (c's values unread).
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_keys_heads(int (&c)[32], const uint32_t (&a)[4], uint64_t b) {
#define DSV4_C8(j) "+r"(c[j]), "+r"(c[j + 1]), "+r"(c[j + 2]), "+r"(c[j + 3]), "+r"(c[j + 4]), "+r"(c[j + 5]), "+r"(c[j + 6]), "+r"(c[j + 7])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p;\n}\n"
      : DSV4_C8(0), DSV4_C8(8), DSV4_C8(16), DSV4_C8(24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(int(kAccumulate)));
#undef DSV4_C8
}

// The fast path's sum for one query on the tensor cores, for this lane's row 8i + g of its warp's
// keys, times 2^-E_k: the folded dots of both key tiles by wgmma (c[4j + 2r + e]: the row g + 8r and
// head 8j + 2i + e; floats exactly, |c| < 2^21), each head pair's terms by one fused
// multiply-add with relu, and their sum by mma.m16n8k16 (see the top). tile: the image in shared
// memory; pairs: this lane's |w| and sign pairs, head tile j at [2j] and [2j + 1].
__device__ inline float tensor_sum(const unsigned char* tile, const KeyOperands& a, const uint32_t (&pairs)[16]) {
  const int i = threadIdx.x % 32 % 4;
  const uint64_t b = tile_descriptor(tile);
  float row_sum[2][2];  // (tile, r)
#pragma unroll
  for (int kt = 0; kt < 2; ++kt) {
    int c[32];
    wgmma_begin();
    wgmma_keys_heads<false>(c, a[kt][0], b);
#pragma unroll
    for (int bl = 1; bl < kFp4MaxBlocks; ++bl) wgmma_keys_heads<true>(c, a[kt][bl], b + 2 * bl);  // 32 bytes on
    wgmma_commit();
    wgmma_finish(c);
    float d[4] = {};  // rows g, g + 8 at [0], [2]; every column the same
#pragma unroll
    for (int m = 0; m < kImageHeads / 16; ++m) {
      uint32_t terms[4];  // the A fragment of heads 16m … 16m + 15: head tiles 2m, 2m + 1
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int j = 2 * m + h;
          const float f0 = __int2float_rn(c[4 * j + 2 * r]), f1 = __int2float_rn(c[4 * j + 2 * r + 1]);
          terms[2 * h + r] =
              bf16x2_bits(__hfma2_relu(__floats2bfloat162_rn(f0, f1), bf16x2_pair(pairs[2 * j]), bf16x2_pair(0u)));
        }
      mma_bf16(d, terms, pairs[4 * m + 1], pairs[4 * m + 3]);
    }
    row_sum[kt][0] = d[0], row_sum[kt][1] = d[2];
  }
  return i == 0 ? row_sum[0][0] : i == 1 ? row_sum[0][1] : i == 2 ? row_sum[1][0] : row_sum[1][1];
}
#endif

// deepseek-tc's scores (see the top): grid (key blocks of kTcKeysPerBlock, query groups of
// kTcQueriesPerBlock). Each warpgroup's 128 keys sit in its registers; the queries' images reach
// shared memory by bulk copies kTcStages − 1 queries ahead, thread 0 refilling a stage once every
// warp has left it. A warpgroup whose keys the fast terms cannot serve for a query takes the
// ordered path, warp by warp.
__global__ void __launch_bounds__(kTcThreads, 2)
    indexer_scores_fp4_tc_kernel(Fp4Queries q, const float* wts, int64_t n_queries, int heads, RowFormat f,
                                 const float* keys, int64_t n_keys, int64_t ratio, int64_t p0, Bf16Bits* score) {
#ifdef DSV4_WGMMA
  await_previous_kernel();
  extern __shared__ unsigned char tc_smem_base[];
  unsigned char* stages = at_swizzle_period(tc_smem_base);
  int* k_exp = reinterpret_cast<int*>(stages + kTcStages * kStageBytes);                        // [keys][4]
  uint8_t* k_shift = reinterpret_cast<uint8_t*>(k_exp + kTcKeysPerBlock * kFp4MaxBlocks);       // [keys][4]
  uint32_t* k_words = reinterpret_cast<uint32_t*>(k_shift + kTcKeysPerBlock * kFp4MaxBlocks);   // then the terms
  __shared__ uint64_t filled[kTcStages], emptied[kTcStages];
  __shared__ int group_single[2], group_lo[2], group_hi[2];  // per warpgroup: its warps' WarpKeys
  const int tiles = int(head_tiles(heads)), blocks = f.width / RowFormat::kFp4Block;
  const auto [w0, t0, t_end, n_present] =
      block_share(kTcKeysPerBlock, kTcQueriesPerBlock, n_queries, p0, ratio, n_keys);
  if (n_present <= 0) return;
  const int n_here = int(t_end - t0), tid = threadIdx.x;
  auto fetch = [&](int n) {  // query t0 + n's image into its stage
    uint64_t* full = &filled[n % kTcStages];
    barrier_expect_bytes(full, kImageBytes);
    copy_bulk(stages + (n % kTcStages) * kStageBytes, q.images + (t0 + n) * Fp4Queries::kImageWords, kImageBytes, full);
  };
  if (tid == 0) {
    for (int s = 0; s < kTcStages; ++s) barrier_init(&filled[s], 1), barrier_init(&emptied[s], kTcWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // before the copies complete on them
    for (int n = 0; n < kTcStages && n < n_here; ++n) fetch(n);
    for (int wg = 0; wg < 2; ++wg) group_single[wg] = 1, group_lo[wg] = INT_MAX, group_hi[wg] = INT_MIN;
  }
  stage_fp4_rows(keys + w0 * f.stride, f, kTcKeysPerBlock, n_present, k_words, k_exp, k_shift);  // (barriers)
  __syncthreads();

  const int warp = tid / 32, lane = tid % 32, g = lane / 4, i = lane % 4, wg = warp / 4;
  WarpKeys k;
  load_warp_keys(k_words, k_exp, n_present, k);
  if (lane == 0) {
    atomicAnd(&group_single[wg], int(k.single));
    atomicMin(&group_lo[wg], k.lo);
    atomicMax(&group_hi[wg], k.hi);
  }
  __syncthreads();  // every warp holds its keys (their words' space becomes the terms'), the groups' flags are whole
  const bool wg_single = group_single[wg];
  const int wg_lo = group_lo[wg], wg_hi = group_hi[wg];
  uint16_t* terms = reinterpret_cast<uint16_t*>(k_words) + warp * 8 * tiles * kKeysPerWarp;
  const int64_t warp_w0 = w0 + kKeysPerWarp * warp, wg_w0 = w0 + 4 * kKeysPerWarp * wg;
  VisibleKeys visible_now(t0, p0, ratio, n_keys);
  for (int n = 0; n < n_here; ++n, visible_now.next()) {
    const int64_t t = t0 + n, visible = visible_now.count();
    const unsigned char* image = stages + (n % kTcStages) * kStageBytes;
    barrier_wait(&filled[n % kTcStages], n / kTcStages % 2);
    const int4 bounds = *reinterpret_cast<const int4*>(image + kImageBytes - 16);
    if (wg_w0 < visible && fast_for(bounds, wg_single, wg_lo, wg_hi)) {  // (uniform over the warpgroup)
      uint32_t pairs[16];
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const uint4 x = reinterpret_cast<const uint4*>(image + kImageTile)[4 * i + v];
        pairs[4 * v] = x.x, pairs[4 * v + 1] = x.y, pairs[4 * v + 2] = x.z, pairs[4 * v + 3] = x.w;
      }
      const float sum = tensor_sum(image, k.a, pairs);
      const int64_t w = warp_w0 + 8 * i + g;
      // (2^E_k is a float, so one float product rounds as the double product's conversion would)
      if (w < visible) score[t * n_keys + w] = f32_to_bf16(sum * float(k.scale));
    } else if (warp_w0 < visible) {
      const Fp4Queries own = q.from(t, heads);
      const double sum = ordered_sum(own.words, own.exps, wts + t * heads, heads, tiles, blocks, k.a, k_exp, terms);
      if (warp_w0 + lane < visible) score[t * n_keys + warp_w0 + lane] = f32_to_bf16(float(sum));
    }
    __syncwarp();
    if (lane == 0) barrier_arrive(&emptied[n % kTcStages]);
    // A query behind: every warp has most likely left its stage by now.
    if (tid == 0 && n >= 1 && n - 1 + kTcStages < n_here) {
      barrier_wait(&emptied[(n - 1) % kTcStages], (n - 1) / kTcStages % 2);
      fetch(n - 1 + kTcStages);
    }
  }
#endif
}

}  // namespace

bool fp4_scores_apply(const RowFormat& f, int64_t dim) {
  return f.kind == RowFormat::fp4 && dim % RowFormat::kFp4Block == 0 && dim <= kFp4MaxDim;
}

bool fp4_tensor_cores_apply(int64_t heads) { return heads <= kImageHeads && device_has_wgmma(); }

size_t fp4_queries_bytes(int64_t T, int64_t heads, bool images) {
  using Q = Fp4Queries;
  return size_t(T * head_tiles(heads) * (Q::kWords + Q::kExps + Q::kLanes) + T + (images ? T * Q::kImageWords : 0)) *
         sizeof(uint4);
}

Fp4Queries prepare_fp4_queries(cudaStream_t stream, const float* q_packed, const float* wts, int64_t T, int heads,
                               const RowFormat& f, bool images, void* buffer) {
  const Fp4QueryArrays<true> out = queries_in(buffer, T, heads, images);
  launch(indexer_prepare_queries_kernel, unsigned(T), kFp4Threads, 0, stream, q_packed, wts, heads, f, out);
  DSV4_CUDA_LAUNCHED("indexer_select (FP4 queries)");
  return out.read_only();
}

const void* fp4_scores_kernel(bool tensor_cores) {
  return tensor_cores ? reinterpret_cast<const void*>(indexer_scores_fp4_tc_kernel)
                      : reinterpret_cast<const void*>(indexer_scores_fp4_kernel);
}

// The keys' exponents and shifts, then their words, whose space the warps' terms take over once the
// keys are in registers; before them, the tensor-core kernel's stages (from a 1024-byte boundary).
size_t fp4_scores_smem(int heads, bool tensor_cores) {
  const int keys = tensor_cores ? kTcKeysPerBlock : kFp4KeysPerBlock, warps = keys / kKeysPerWarp;
  const size_t words = size_t(keys) * kFp4WordStride * 4, terms = size_t(warps) * 8 * head_tiles(heads) * kKeysPerWarp * 2;
  return (tensor_cores ? kSwizzlePeriod + size_t(kTcStages) * kStageBytes : 0) + size_t(keys) * kFp4MaxBlocks * 5 +
         std::max(words, terms);
}

void fp4_scores(cudaStream_t stream, const Fp4Queries& q, int64_t t0, int64_t n, const float* wts, int heads,
                const RowFormat& f, const float* keys, int64_t n_keys, int64_t visible_max, int64_t ratio, int64_t p0,
                bool tensor_cores, Bf16Bits* score) {
  const Fp4Queries chunk = q.from(t0, heads);
  const int block_keys = tensor_cores ? kTcKeysPerBlock : kFp4KeysPerBlock;
  const int block_queries = tensor_cores ? kTcQueriesPerBlock : kFp4QueriesPerBlock;
  const dim3 grid(unsigned((visible_max + block_keys - 1) / block_keys),
                  unsigned((n + block_queries - 1) / block_queries));
  launch(tensor_cores ? indexer_scores_fp4_tc_kernel : indexer_scores_fp4_kernel, grid,
         tensor_cores ? kTcThreads : kFp4Threads, fp4_scores_smem(heads, tensor_cores), stream, chunk, wts + t0 * heads,
         n, heads, f, keys, n_keys, ratio, p0 + t0, score);
  DSV4_CUDA_LAUNCHED("indexer_select (FP4 scores)");
}

}  // namespace dsv4::cuda
