// Lightning Indexer scoring and top-k (twin of cpu/indexer.cpp; architecture.md §3.5).
//
// score_w = Σ_h relu(q_h · K_w) · wts_h over the rows visible to the query (w < ⌊(t+1)/ratio⌋);
// in deepseek numerics the per-head dot, each weighted term and the sum are rounded to bf16, so
// ties are common; they go to the lower row, as on the CPU.
//
// Parallelisation:
//   scores: grid (query, key blocks), one warp per (query, key); the warp decodes the key from its
//     stored format once (each lane its dims lane, lane + 32, …, in registers), then sums the
//     heads in order, each head's dot a double shuffle reduction.
//   scores over compact (FP4) keys in deepseek numerics: q and k are e2m1 · 2^e with one e per
//     32-block, so a block's dot is 2^(e_q + e_k − 2) times a small integer sum of products of
//     2·e2m1 values (integers in [−12, 12]): the int8 tensor cores give it exactly (one
//     m16n8k32 product per block, heads × keys), and the few block terms, exact doubles, add to
//     the same correctly rounded float as the double path. q is packed into the keys' format
//     first and kept in shared memory as int8; a warp takes 8 keys at a time. (One thread per key
//     with four-way int8 dot products, dp4a, took 133 µs over the 262 144 keys of a 1M context.)
//   top-k: each candidate becomes a unique 64-bit key (order-preserving score bits above the
//     inverted row index), so "higher score, then lower row" is plain key order. A radix select
//     (eight 8-bit digit passes, histograms in shared memory, each pass's digit found by one warp's
//     scan) finds the k-th largest key (once the keys still in play fit in shared memory they are
//     gathered there, and later passes read only them; once they are exactly the ones still wanted,
//     it stops); the k keys at or above it are gathered and bitonic-sorted in shared memory.
//     Many queries (prefill) take one block per query over the scores. A few queries (decode)
//     would leave all but a few SMs idle, so their keys are split into parts of 8 192: a block per
//     (part, query) keys its part into shared memory and selects its top k, and one block per query
//     selects again from the parts' survivors, which hold the query's top k. The same select body
//     runs in all three kernels, over keys from scores or keys already made.
//   Queries are processed in chunks so the score scratch stays bounded at long contexts.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kScoreWarps = 8;
constexpr int kSelectThreads = 1024;
constexpr int64_t kMaxTopK = 4096;             // bitonic buffer (32 KiB of keys)
constexpr int64_t kPartKeys = 8192;            // split top-k: a part's keys in shared memory
constexpr size_t kPartBytes = kPartKeys * sizeof(uint64_t);  // (64 KiB: above the default 48)
constexpr int64_t kScoreScratch = int64_t(1) << 26;  // floats of scores per chunk (256 MiB)
constexpr int kMaxKeyDim = 256;                        // a key's dims in registers: 8 per lane

// Query t of a chunk starting at position p0 sees the rows w < ⌊(p0 + t + 1) / ratio⌋ that exist.
__device__ inline int64_t visible_keys(int64_t t, int64_t p0, int64_t ratio, int64_t n_keys) {
  return (p0 + t + 1) / ratio < n_keys ? (p0 + t + 1) / ratio : n_keys;
}

__global__ void indexer_scores_kernel(const float* q, const float* wts, int64_t heads, int64_t dim,
                                      const float* keys, RowFormat key_format, int64_t n_keys, int64_t ratio,
                                      int64_t p0, bool bf16, float* score) {
  const int64_t t = blockIdx.x;
  const int64_t w = int64_t(blockIdx.y) * kScoreWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t visible = visible_keys(t, p0, ratio, n_keys);
  if (w >= visible) return;
  float key[kMaxKeyDim / 32];
#pragma unroll
  for (int j = 0; j < kMaxKeyDim / 32; ++j)
    key[j] = 32 * j + lane < dim ? row_value(key_format, keys + w * key_format.stride, 32 * j + lane) : 0.0f;
  double acc = 0.0;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + (t * heads + h) * dim;
    double dot = 0.0;
#pragma unroll
    for (int j = 0; j < kMaxKeyDim / 32; ++j)
      if (32 * j + lane < dim) dot += double(qh[32 * j + lane]) * double(key[j]);
    const float d = round_if(bf16, float(warp_sum(dot)));
    acc += double(round_if(bf16, fmaxf(d, 0.0f) * wts[t * heads + h]));
  }
  if (lane == 0) score[t * n_keys + w] = round_if(bf16, float(acc));
}

constexpr int kFp4KeysPerBlock = 256;  // 8 warps of 4 tiles of 8 keys
constexpr int kFp4MaxDim = 128;        // V4's index_head_dim; wider keys take the general path
constexpr int kFp4MaxHeads = 64;       // 4 tiles of 16 (V4's index_n_heads); more take the general path

// The 2·e2m1 integers of 8 nibbles (one 32-bit word of codes, the first dim in the low nibble) as
// two words of four int8 (dims 0–3, 4–7): the positive and the negative value of each code's
// magnitude picked from byte tables, then one of the two by its sign bit.
__device__ inline void fp4_to_int8x8(uint32_t nibbles, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kPos0 = 0x03020100u, kPos1 = 0x0C080604u;  // codes 0–3, 4–7: 0 1 2 3 | 4 6 8 12
  constexpr uint32_t kNeg0 = 0xFDFEFF00u, kNeg1 = 0xF4F8FAFCu;  // their negatives
  auto four = [&](uint32_t n) {  // four codes in the low 16 bits
    const uint32_t magnitude = n & 0x7777u;
    const uint32_t pos = __byte_perm(kPos0, kPos1, magnitude), neg = __byte_perm(kNeg0, kNeg1, magnitude);
    return __byte_perm(pos, neg, 0x3210u | ((n >> 1) & 0x4444u));  // byte k from neg where code k's bit 3 is set
  };
  lo = four(nibbles & 0xffffu);
  hi = four(nibbles >> 16);
}

__device__ inline double pow2(int e) { return __longlong_as_double(int64_t(e + 1023) << 52); }

// c += A·B over one 32-dim block on the int8 tensor cores (mma.m16n8k32.s8, exact int32 sums):
// lane 4g + i holds a0–a3 = A[g][4i…], A[g+8][4i…], A[g][16+4i…], A[g+8][16+4i…], b0, b1 =
// B[4i…][g], B[16+4i…][g], and c = C[g][2i], C[g][2i+1], C[g+8][2i], C[g+8][2i+1].
__device__ __forceinline__ void imma(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                     uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// score[t, w] for one query t (blockIdx.x) and kFp4KeysPerBlock keys from blockIdx.y; qc: the
// queries packed as FP4 rows (key_format), [T, heads]. A warp takes 8 keys at a time: the 32-dim
// block sums of every (head, key) pair come from the int8 tensor cores, heads as M, keys as N, one
// product per block (the product's K runs over a block's dims in a permuted order, the same for
// q and k: position 4i + j is dim 8i + j, 16 + 4i + j is 8i + 4 + j, so a lane's share of a key
// block is one 32-bit word of nibbles). Each lane then scales and sums its pairs as the scalar
// path did, and the lanes holding other heads of the same keys are added by shuffles.
__global__ void __launch_bounds__(kFp4KeysPerBlock)
    indexer_scores_fp4_kernel(const float* qc, const float* wts, int64_t heads, RowFormat f, const float* keys,
                              int64_t n_keys, int64_t ratio, int64_t p0, float* score) {
  constexpr int kBlocks = kFp4MaxDim / RowFormat::kFp4Block;
  __shared__ uint32_t q_words[kFp4MaxHeads * kFp4MaxDim / 4];  // int8 codes; zero past `heads`
  __shared__ int q_exp[kFp4MaxHeads * kBlocks];
  __shared__ float q_wts[kFp4MaxHeads];
  const int64_t t = blockIdx.x;
  const int words = f.width / 4, blocks = f.width / RowFormat::kFp4Block, head_tiles = int(heads + 15) / 16;
  for (int i = threadIdx.x; i < head_tiles * 16 * (words / 2); i += blockDim.x) {
    const int h = i / (words / 2), j = i % (words / 2);
    uint32_t lo = 0, hi = 0;
    if (h < heads) {
      const uint8_t* row = reinterpret_cast<const uint8_t*>(qc + (t * heads + h) * f.stride);
      fp4_to_int8x8(*reinterpret_cast<const uint32_t*>(row + 4 * j), lo, hi);
    }
    q_words[h * words + 2 * j] = lo, q_words[h * words + 2 * j + 1] = hi;
  }
  for (int i = threadIdx.x; i < head_tiles * 16 * blocks; i += blockDim.x) {
    const int h = i / blocks, b = i % blocks;
    const uint8_t* row = reinterpret_cast<const uint8_t*>(qc + (t * heads + h) * f.stride);
    q_exp[i] = h < heads ? int(row[f.scale_offset() + b]) - 127 : 0;
  }
  for (int h = threadIdx.x; h < head_tiles * 16; h += blockDim.x) q_wts[h] = h < heads ? wts[t * heads + h] : 0.0f;
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, i = lane % 4;
  const int64_t visible = visible_keys(t, p0, ratio, n_keys);
  for (int64_t n0 = int64_t(blockIdx.y) * kFp4KeysPerBlock + 32 * warp, end = n0 + 32; n0 < end && n0 < visible;
       n0 += 8) {
    // B: this lane's word of each block of key n0 + g.
    uint32_t kb[kBlocks][2] = {};
    if (n0 + g < visible) {
      const uint8_t* key = reinterpret_cast<const uint8_t*>(keys + (n0 + g) * f.stride);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b)
        if (b < blocks) fp4_to_int8x8(*reinterpret_cast<const uint32_t*>(key + 16 * b + 4 * i), kb[b][0], kb[b][1]);
    }
    int c[kFp4MaxHeads / 16][kBlocks][4] = {};  // [head tile][block][element]
#pragma unroll
    for (int m = 0; m < kFp4MaxHeads / 16; ++m) {
      if (m >= head_tiles) break;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        if (b >= blocks) break;
        const uint2 top = *reinterpret_cast<const uint2*>(q_words + (16 * m + g) * words + 8 * b + 2 * i);
        const uint2 bottom = *reinterpret_cast<const uint2*>(q_words + (16 * m + g + 8) * words + 8 * b + 2 * i);
        imma(c[m][b], top.x, bottom.x, top.y, bottom.y, kb[b][0], kb[b][1]);
      }
    }
    // c[m][b][e]: head 16m + g + 8·(e / 2), key n0 + 2i + e % 2.
    int k_exp[2][kBlocks];
#pragma unroll
    for (int k2 = 0; k2 < 2; ++k2) {
      const int64_t w = n0 + 2 * i + k2;
      const uint32_t e = w < visible ? *reinterpret_cast<const uint32_t*>(
                                           reinterpret_cast<const uint8_t*>(keys + w * f.stride) + f.scale_offset())
                                     : 0u;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) k_exp[k2][b] = int((e >> (8 * b)) & 0xff) - 127;
    }
    double acc[2] = {0.0, 0.0};
#pragma unroll
    for (int m = 0; m < kFp4MaxHeads / 16; ++m) {
      if (m >= head_tiles) break;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = 16 * m + g + 8 * (e / 2), k2 = e % 2;
        if (h >= heads) continue;
        double dot = 0.0;
#pragma unroll
        for (int b = 0; b < kBlocks; ++b)
          if (b < blocks) dot += double(c[m][b][e]) * pow2(q_exp[h * blocks + b] + k_exp[k2][b] - 2);
        const float d = round_bf16(float(dot));
        acc[k2] += double(round_bf16(fmaxf(d, 0.0f) * q_wts[h]));
      }
    }
#pragma unroll
    for (int k2 = 0; k2 < 2; ++k2) {
      for (int offset = 4; offset < 32; offset *= 2) acc[k2] += __shfl_xor_sync(kFullMask, acc[k2], offset);
      const int64_t w = n0 + 2 * i + k2;
      if (g == 0 && w < visible) score[t * n_keys + w] = round_bf16(float(acc[k2]));
    }
  }
}

// Larger key = higher score, then lower row. −0 is folded into +0: they compare equal on the CPU.
__device__ inline uint64_t select_key(float score, int64_t w) {
  if (score == 0.0f) score = 0.0f;
  const uint32_t b = f32_bits(score);
  const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (uint64_t(ordered) << 32) | uint64_t(0xffffffffu - uint32_t(w));
}

// Where a selection reads its candidates: for_each(f) calls f(key) for each, spread over the block.
// A query's scores, keyed on the fly (the one-block path reads them from global memory).
struct ScoreKeys {
  const float* score;
  int64_t n;
  template <class F>
  __device__ void for_each(F f) const {
    for_each_element(score, n, [&](float s, int64_t w) { f(select_key(s, w)); });
  }
};

// Keys already made: a part's in shared memory, the parts' survivors, the candidates gathered so far.
struct StoredKeys {
  const uint64_t* key;
  int64_t n;
  template <class F>
  __device__ void for_each(F f) const {
    for_each_element(key, n, [&](uint64_t stored, int64_t) { f(stored); });
  }
};

// The digit holding the `remaining`-th largest key of a histogram over digits, and how many keys
// lie in higher digits, for every lane of the one warp that calls it. Each lane sums 8 digits from
// the top and a scan over the lanes finds the one that reaches `remaining`: a serial walk down the
// 256 counts cost one thread a few microseconds per digit pass. Digit 0 when no lane reaches it,
// where the walk would end.
__device__ inline void find_digit(const uint32_t* hist, int64_t remaining, int& digit, int64_t& above) {
  const int lane = threadIdx.x % 32;
  const int top = 255 - 8 * lane;  // this lane's digits: top, top − 1, …, top − 7
  uint32_t own = 0;
  for (int j = 0; j < 8; ++j) own += hist[top - j];
  uint32_t through = own;  // keys in the digits of lanes 0 … lane
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint32_t lower = __shfl_up_sync(kFullMask, through, offset);
    if (lane >= offset) through += lower;
  }
  const unsigned reached = __ballot_sync(kFullMask, int64_t(through) >= remaining);
  const int owner = reached ? __ffs(reached) - 1 : 31;
  int64_t before = __shfl_sync(kFullMask, through - own, owner);
  int d = 255 - 8 * owner;
  for (; d > 248 - 8 * owner; --d) {
    if (before + hist[d] >= remaining) break;
    before += hist[d];
  }
  digit = d;
  above = before;
}

// Gathers into `sel` (shared memory, kMaxTopK keys), unordered, the min(k, n_real) largest of
// `keys`, and returns how many. n_real counts the real keys; the others are 0, below every real
// key, and never gathered. Radix select: the k-th largest key, one 8-bit digit at a time from the
// top. Once the keys sharing the prefix fit in `sel`, they are gathered there and the later digits
// read only them; once they are exactly the ones still wanted, the prefix is the threshold.
template <class Keys>
__device__ int gather_top(const Keys& keys, int64_t n_real, int64_t k, uint64_t* sel) {
  __shared__ uint32_t hist[256];
  __shared__ uint64_t prefix_s;
  __shared__ int64_t remaining_s, bucket_s;
  __shared__ int n_cand_s, n_sel_s;
  uint64_t threshold = 1;
  if (n_real > k) {
    uint64_t prefix = 0, mask = 0;
    int64_t remaining = k, n_cand = -1;  // n_cand ≥ 0: the candidates are sel[0, n_cand)
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      // Most scores share their top digits: one atomic per group of lanes with equal digits (a
      // shared-memory atomic per lane on one address serialises the whole warp).
      auto count = [&](uint64_t key) {
        const unsigned digit = (key & mask) == prefix ? unsigned(key >> shift) & 0xff : 0x100;
        const unsigned peers = __match_any_sync(__activemask(), digit);
        if (digit < 0x100 && __ffs(peers) - 1 == int(threadIdx.x % 32))
          atomicAdd(&hist[digit], unsigned(__popc(peers)));
      };
      if (n_cand >= 0)
        StoredKeys{sel, n_cand}.for_each(count);
      else
        keys.for_each(count);
      __syncthreads();
      if (threadIdx.x < 32) {
        int digit;
        int64_t above;
        find_digit(hist, remaining, digit, above);
        if (threadIdx.x == 0) {
          prefix_s = prefix | (uint64_t(digit) << shift);
          remaining_s = remaining - above;
          bucket_s = hist[digit];
        }
      }
      __syncthreads();
      prefix = prefix_s;
      remaining = remaining_s;
      mask |= uint64_t(0xff) << shift;
      if (bucket_s == remaining) break;  // every key with this prefix is taken
      if (n_cand < 0 && bucket_s <= kMaxTopK) {
        if (threadIdx.x == 0) n_cand_s = 0;
        __syncthreads();
        keys.for_each([&](uint64_t key) {
          if ((key & mask) == prefix) sel[atomicAdd(&n_cand_s, 1)] = key;
        });
        __syncthreads();
        n_cand = n_cand_s;
      }
    }
    threshold = prefix;  // ≥ 1: the k-th largest key is real, and so is every key with its prefix
  }
  // Exactly min(k, n_real) keys reach the threshold: real keys are unique.
  if (threadIdx.x == 0) n_sel_s = 0;
  __syncthreads();
  keys.for_each([&](uint64_t key) {
    if (key >= threshold) sel[atomicAdd(&n_sel_s, 1)] = key;
  });
  __syncthreads();
  return n_sel_s;
}

// Bitonic sort of sel[0, n) into descending order, padded with zeros to a power of two.
__device__ inline void sort_descending(uint64_t* sel, int64_t n) {
  int64_t size = 1;
  while (size < n) size *= 2;
  for (int64_t i = n + threadIdx.x; i < size; i += blockDim.x) sel[i] = 0;
  __syncthreads();
  for (int64_t len = 2; len <= size; len *= 2)
    for (int64_t stride = len / 2; stride > 0; stride /= 2) {
      for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
        const int64_t j = i ^ stride;
        if (j > i) {
          const bool descending = (i & len) == 0;
          const uint64_t x = sel[i], y = sel[j];
          if (descending ? x < y : x > y) sel[i] = y, sel[j] = x;
        }
      }
      __syncthreads();
    }
}

// A query's k output rows from its n_sel sorted keys, −1 after them.
__device__ inline void write_rows(const uint64_t* sel, int64_t n_sel, int64_t k, int32_t* rows) {
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
    rows[i] = i < n_sel ? int32_t(0xffffffffu - uint32_t(sel[i] & 0xffffffffu)) : -1;
}

// One block per query over its scores.
__global__ void __launch_bounds__(kSelectThreads)
    indexer_topk_kernel(const float* score, int64_t n_keys, int64_t ratio, int64_t p0, int64_t k, int32_t* idx) {
  __shared__ uint64_t sel[kMaxTopK];
  const int64_t t = blockIdx.x;
  const int64_t visible = visible_keys(t, p0, ratio, n_keys);
  const int n_sel = gather_top(ScoreKeys{score + t * n_keys, visible}, visible, k, sel);
  sort_descending(sel, n_sel);
  write_rows(sel, n_sel, k, idx + t * k);
}

// Split top-k, first step: block (part, t) keeps the top min(k, its keys) of query t's rows
// [part · kPartKeys, (part + 1) · kPartKeys) in survivors[t, part], zeros after them. The part is
// keyed once into shared memory, so every digit pass after the load reads shared memory only.
__global__ void __launch_bounds__(kSelectThreads)
    indexer_part_topk_kernel(const float* score, int64_t n_keys, int64_t ratio, int64_t p0, int64_t k,
                             uint64_t* survivors) {
  extern __shared__ uint64_t part_keys[];  // kPartKeys
  __shared__ uint64_t sel[kMaxTopK];
  const int64_t t = blockIdx.y, part = blockIdx.x, row0 = part * kPartKeys;
  const int64_t rest = visible_keys(t, p0, ratio, n_keys) - row0;
  const int64_t n = rest < 0 ? 0 : (rest < kPartKeys ? rest : kPartKeys);
  for_each_element(score + t * n_keys + row0, n, [&](float s, int64_t i) { part_keys[i] = select_key(s, row0 + i); });
  __syncthreads();
  const int n_sel = gather_top(StoredKeys{part_keys, n}, n, k, sel);
  uint64_t* out = survivors + (t * gridDim.x + part) * k;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) out[i] = i < n_sel ? sel[i] : 0;
}

// Split top-k, second step: one block per query selects from its parts' survivors, which hold its
// top k (a part keeps every key of the top k it holds). With `staged`, the survivors are copied to
// shared memory first, so the digit passes read it (over global memory the merge of 16K survivors
// took 48 µs at 1M context on an H200, longer than the 32 parts).
__global__ void __launch_bounds__(kSelectThreads)
    indexer_merge_topk_kernel(const uint64_t* survivors, int64_t parts, int64_t n_keys, int64_t ratio, int64_t p0,
                              int64_t k, bool staged, int32_t* idx) {
  extern __shared__ uint64_t staged_keys[];  // parts · k when staged
  __shared__ uint64_t sel[kMaxTopK];
  const int64_t t = blockIdx.x;
  const int64_t visible = visible_keys(t, p0, ratio, n_keys);
  const int64_t last = visible % kPartKeys;
  const int64_t n_real = visible / kPartKeys * k + (last < k ? last : k);
  const uint64_t* keys = survivors + t * parts * k;
  if (staged) {
    for_each_element(keys, parts * k, [&](uint64_t key, int64_t i) { staged_keys[i] = key; });
    __syncthreads();
    keys = staged_keys;
  }
  const int n_sel = gather_top(StoredKeys{keys, parts * k}, n_real, k, sel);
  sort_descending(sel, n_sel);
  write_rows(sel, n_sel, k, idx + t * k);
}

__global__ void fill_ids_kernel(int32_t* idx, int64_t n, int32_t value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    idx[i] = value;
}

// How many parts the top-k splits each query's keys into (1: one block per query). One block per
// query fills the GPU only with about as many queries as it has SMs (132 on an H200); with the one
// to few queries of decode, a single block took most of an indexer call at long contexts. Fewer
// queries than that are split once their keys exceed one part, if a part keeps at most an eighth of
// its keys (k ≤ kPartKeys / 8), so that the merge reads far fewer keys than the query has. Larger
// chunks (prefill) keep one block per query: their grid is full, and the merge would be extra work.
int64_t top_k_parts(int64_t T, int64_t visible_max, int64_t k) {
  constexpr int64_t kQueriesFillingGpu = 128;
  if (T >= kQueriesFillingGpu || 8 * k > kPartKeys) return 1;
  return (visible_max + kPartKeys - 1) / kPartKeys;
}

// Shared memory of the merge: its survivors when they fit (beside `sel`: 32 parts of k = 512 do),
// else none (read from global memory).
size_t merge_bytes(int64_t parts, int64_t k) {
  constexpr size_t kMaxStaged = 160 * 1024;
  const size_t bytes = size_t(parts * k) * sizeof(uint64_t);
  return bytes <= kMaxStaged ? bytes : 0;
}

// The top k of n queries' scores into idx; with parts > 1 through survivors ([n, parts, k]).
void select_top_k(cudaStream_t stream, const float* score, int64_t n, int64_t n_keys, int64_t ratio, int64_t p0,
                  int64_t k, int64_t parts, uint64_t* survivors, int32_t* idx) {
  if (parts <= 1) {
    indexer_topk_kernel<<<unsigned(n), kSelectThreads, 0, stream>>>(score, n_keys, ratio, p0, k, idx);
    DSV4_CUDA_LAUNCHED("indexer_select (top-k)");
    return;
  }
  indexer_part_topk_kernel<<<dim3(unsigned(parts), unsigned(n)), kSelectThreads, kPartBytes, stream>>>(
      score, n_keys, ratio, p0, k, survivors);
  DSV4_CUDA_LAUNCHED("indexer_select (top-k parts)");
  const size_t staged = merge_bytes(parts, k);
  indexer_merge_topk_kernel<<<unsigned(n), kSelectThreads, staged, stream>>>(survivors, parts, n_keys, ratio, p0, k,
                                                                               staged > 0, idx);
  DSV4_CUDA_LAUNCHED("indexer_select (top-k merge)");
}

}  // namespace

void CudaBackend::indexer_select(const float* q, const float* wts, int64_t T, int64_t heads, int64_t dim,
                                 const float* keys, const RowFormat& key_format, int64_t n_keys, int64_t ratio,
                                 int64_t p0, int64_t k, int32_t* idx) {
  Timed timed(*this, "indexer_select");
  if (T == 0 || k == 0) return;
  DSV4_CUDA_REQUIRE(ratio > 0 && k <= kMaxTopK && n_keys < (int64_t(1) << 31), "indexer_select: ratio ", ratio,
                    ", k ", k, " (at most ", kMaxTopK, "), ", n_keys, " keys");
  DSV4_CUDA_REQUIRE(dim <= kMaxKeyDim && (!keys || key_format.width == dim), "indexer_select: keys of width ",
                    key_format.width, ", queries of ", dim, " (at most ", kMaxKeyDim, ")");
  if (n_keys == 0 || !keys) {
    fill_ids_kernel<<<grid_for(T * k, 256), 256, 0, stream_>>>(idx, T * k, -1);
    DSV4_CUDA_LAUNCHED("indexer_select (no keys)");
    return;
  }
  // Compact keys in deepseek numerics: the exact integer path, on q packed like the keys.
  const bool fp4_path = deepseek() && key_format.kind == RowFormat::fp4 && dim % RowFormat::kFp4Block == 0 &&
                        dim <= kFp4MaxDim && heads <= kFp4MaxHeads;
  DeviceArray<float> q_packed(stream_, fp4_path ? size_t(T * heads * key_format.stride) : 0);
  if (fp4_path) pack_rows(key_format, q, T * heads, q_packed.get());
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(T, kScoreScratch / n_keys));
  DeviceArray<float> score(stream_, size_t(chunk * n_keys));
  const int64_t parts = top_k_parts(T, std::min(n_keys, (p0 + T) / ratio), k);
  DeviceArray<uint64_t> survivors(stream_, parts > 1 ? size_t(chunk * parts * k) : 0);
  if (parts > 1) {
    allow_shared_memory(reinterpret_cast<const void*>(indexer_part_topk_kernel), kPartBytes, "indexer top-k parts");
    allow_shared_memory(reinterpret_cast<const void*>(indexer_merge_topk_kernel), merge_bytes(parts, k),
                        "indexer top-k merge");
  }
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    const int64_t visible_max = std::min(n_keys, (p0 + t0 + n) / ratio);
    if (visible_max > 0 && fp4_path) {
      const dim3 grid(unsigned(n), unsigned((visible_max + kFp4KeysPerBlock - 1) / kFp4KeysPerBlock));
      indexer_scores_fp4_kernel<<<grid, kFp4KeysPerBlock, 0, stream_>>>(
          q_packed.get() + t0 * heads * key_format.stride, wts + t0 * heads, heads, key_format, keys, n_keys, ratio,
          p0 + t0, score.get());
      DSV4_CUDA_LAUNCHED("indexer_select (FP4 scores)");
    } else if (visible_max > 0) {
      const dim3 grid(unsigned(n), unsigned((visible_max + kScoreWarps - 1) / kScoreWarps));
      indexer_scores_kernel<<<grid, kScoreWarps * 32, 0, stream_>>>(q + t0 * heads * dim, wts + t0 * heads, heads,
                                                                    dim, keys, key_format, n_keys, ratio, p0 + t0,
                                                                    deepseek(),
                                                                    score.get());
      DSV4_CUDA_LAUNCHED("indexer_select (scores)");
    }
    select_top_k(stream_, score.get(), n, n_keys, ratio, p0 + t0, k, parts, survivors.get(), idx + t0 * k);
  }
}

}  // namespace dsv4::cuda
