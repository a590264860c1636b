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
//   scores over compact (FP4) keys in deepseek numerics: on the integer tensor cores, exact
//     (indexer_fp4.cu).
//   top-k: each candidate becomes a unique 64-bit key (order-preserving score bits above the
//     inverted row index), so "higher score, then lower row" is plain key order. A radix select
//     (eight 8-bit digit passes, histograms in shared memory, each pass's digit found by one warp's
//     scan) finds the k-th largest key (once the keys still in play fit in shared memory they are
//     gathered there, and later passes read only them; once they are exactly the ones still wanted,
//     it stops); the k keys at or above it are gathered and bitonic-sorted in shared memory.
//     Many queries (prefill) take one block per query over the scores.
//   top-k of a few queries over many keys (decode at long contexts): one block per query would
//     leave all but a few SMs idle, so the whole GPU finds each query's threshold instead. A key's
//     top 16 bits name its bin (a bf16 score is all in them), and bins order as keys do:
//     histogram: a grid over the keys counts them per bin and per coarse bin (a bin's top 8 bits),
//       in shared memory per block, then added up;
//     threshold: a warp per query finds the coarse bin holding its k-th largest key, then the bin
//       within it (keys above that bin are all taken, of it some);
//     gather: a grid over the keys lists the keys above the threshold bin and those in it, and
//       clears the counts for the next selection;
//     final: a block per query sorts both lists together and keeps the first k; should the
//       threshold bin hold more keys than the list has room for, it selects over all the scores
//       as one block per query does.
//     At 1M context on an H200 (262 144 keys, ncu): 9.9 + 3.4 + 7.2 + 8.8 µs. (Before: parts of
//     8 192 keys selected their top k, and one block per query selected again from the parts'
//     survivors: 23 + 28 µs.)
//   Queries are processed in chunks so the score scratch stays bounded at long contexts. Deepseek
//   numerics stores a chunk's scores as their bf16 bits (every such score is a bf16 value), half
//   the bytes that the scoring writes and the top-k's passes read; plain keeps floats.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/indexer_fp4.cuh"
#include "backend/cuda/launch.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kScoreWarps = 8;
constexpr int kSelectThreads = 1024;
constexpr int64_t kMaxTopK = 4096;             // bitonic buffer (32 KiB of keys)
constexpr int64_t kManyKeys = 8192;            // more keys than this, few queries: the threshold path
constexpr int kBins = 1 << 16;                 // the threshold path's bins: a key's top 16 bits
constexpr int kCoarseBins = 256;               // and their top 8 bits
constexpr int64_t kHistWords = kBins + kCoarseBins;  // a query's counts: per bin, then per coarse bin
constexpr int64_t kSortAllKeys = 2048;         // fewer keys are sorted whole, without a radix select
static_assert(kSortAllKeys <= kMaxTopK, "the keys sorted whole fit the sort buffer");
constexpr int64_t kScoreScratchBytes = int64_t(1) << 28;  // a chunk's scores (256 MiB)
constexpr int kMaxKeyDim = 256;                        // a key's dims in registers: 8 per lane

// A score as stored (S: Bf16Bits in deepseek numerics, whose score is x rounded to bf16; float in
// plain; see the top) and its value.
template <class S>
__device__ inline S stored_score(float x) {
  if constexpr (std::is_same_v<S, Bf16Bits>)
    return f32_to_bf16(x);
  else
    return x;
}
__device__ inline float score_value(float s) { return s; }
__device__ inline float score_value(Bf16Bits s) { return bf16_to_f32(s); }

template <class S>
__global__ void indexer_scores_kernel(const float* q, const float* wts, int64_t heads, int64_t dim,
                                      const float* keys, RowFormat key_format, int64_t n_keys, int64_t ratio,
                                      int64_t p0, S* score) {
  await_previous_kernel();
  constexpr bool bf16 = std::is_same_v<S, Bf16Bits>;  // deepseek numerics' roundings
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
  if (lane == 0) score[t * n_keys + w] = stored_score<S>(float(acc));
}

// Larger key = higher score, then lower row. −0 is folded into +0: they compare equal on the CPU.
__device__ inline uint64_t select_key(float score, int64_t w) {
  if (score == 0.0f) score = 0.0f;
  const uint32_t b = f32_bits(score);
  const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (uint64_t(ordered) << 32) | uint64_t(0xffffffffu - uint32_t(w));
}

// Where a selection reads its candidates: for_each(f) calls f(key) for each, spread over the block.
// A query's scores, keyed on the fly (the one-block path reads them from global memory), 16 bytes
// a load (8 bf16 scores): the scores before the row's first 16-byte boundary and after its last
// one alone. Fewer scores than give every thread a load's worth are read one a thread (a decoded
// token's few keys: every thread then holds one, where 16-byte loads would leave most idle).
template <class S>
struct ScoreKeys {
  const S* score;
  int64_t n;
  template <class F>
  __device__ void for_each(F f) const {
    constexpr int kPerLoad = 16 / sizeof(S), kLoads = 2;  // a thread's loads in flight together
    if (n < int64_t(kPerLoad) * blockDim.x) {
      for_each_element(score, n, [&](S s, int64_t w) { f(select_key(score_value(s), w)); });
      return;
    }
    const int64_t head = min(n, int64_t((16 - reinterpret_cast<uintptr_t>(score) % 16) % 16 / sizeof(S)));
    const int64_t n_vectors = (n - head) / kPerLoad, tail = head + n_vectors * kPerLoad;
    for (int64_t w = threadIdx.x; w < head; w += blockDim.x) f(select_key(score_value(score[w]), w));
    for (int64_t w = tail + threadIdx.x; w < n; w += blockDim.x) f(select_key(score_value(score[w]), w));
    const uint4* vectors = reinterpret_cast<const uint4*>(score + head);
    for (int64_t base = threadIdx.x; base < n_vectors; base += int64_t(blockDim.x) * kLoads) {
      uint4 v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u)
        if (base + u * blockDim.x < n_vectors) v[u] = vectors[base + u * blockDim.x];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        if (base + u * blockDim.x >= n_vectors) break;
        S s[kPerLoad];
        memcpy(s, &v[u], sizeof(s));
        const int64_t w0 = head + (base + u * blockDim.x) * kPerLoad;
#pragma unroll
        for (int e = 0; e < kPerLoad; ++e) f(select_key(score_value(s[e]), w0 + e));
      }
    }
  }
  __device__ uint64_t first() const { return select_key(score_value(score[0]), 0); }
};

// Keys already made: the candidates gathered so far.
struct StoredKeys {
  const uint64_t* key;
  int64_t n;
  template <class F>
  __device__ void for_each(F f) const {
    for_each_element(key, n, [&](uint64_t stored, int64_t) { f(stored); });
  }
};

// The OR of every thread's v over the block (all threads call it).
__device__ inline uint64_t block_or(uint64_t v) {
  __shared__ unsigned long long or_s;
  if (threadIdx.x == 0) or_s = 0;
  __syncthreads();
  for (int offset = 16; offset > 0; offset /= 2) v |= __shfl_xor_sync(kFullMask, v, offset);
  if (threadIdx.x % 32 == 0 && v) atomicOr(&or_s, static_cast<unsigned long long>(v));
  __syncthreads();
  return or_s;
}

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

// The first digit of a radix select (gather_top) is 12 bits wide: a score's sign, exponent and 3
// mantissa bits. The k-th largest key's bin then nearly always fits in `sel` beside the keys above
// it, so a query's scores are read twice, counted and then gathered; a first digit of 8 bits (an
// octave of scores) held more keys than that at long contexts, and a second digit's pass read
// them a third time. Its counts take the space of `sel` until the first gather.
constexpr int kFirstDigitBits = 12, kFirstBins = 1 << kFirstDigitBits;
static_assert(kFirstBins * sizeof(uint32_t) <= kMaxTopK * sizeof(uint64_t), "the first digit's counts fit in sel");

// Of the 16 fine bins 16·c … 16·c + 15 of a first digit's counts, the one holding the
// `remaining`-th largest key there, and how many keys lie in the bins above it, for every lane of
// the one warp that calls it (the bin 16·c when no lane reaches it, as find_digit).
__device__ inline void find_fine_bin(const uint32_t* counts, int c, int64_t remaining, int& bin, int64_t& above) {
  const int lane = threadIdx.x % 32;
  const uint32_t own = lane < 16 ? counts[16 * c + 15 - lane] : 0;  // lane 0 the highest bin
  uint32_t through = own;
  for (int offset = 1; offset < 16; offset *= 2) {
    const uint32_t lower = __shfl_up_sync(kFullMask, through, offset);
    if (lane >= offset) through += lower;
  }
  const unsigned reached = __ballot_sync(kFullMask, lane < 16 && int64_t(through) >= remaining);
  const int owner = reached ? __ffs(reached) - 1 : 15;
  bin = 16 * c + 15 - owner;
  above = __shfl_sync(kFullMask, through - own, owner);
}

// Gathers into `sel` (shared memory, kMaxTopK keys), unordered, the min(k, n_real) largest of
// `keys`, and returns how many; its callers run kSelectThreads threads. n_real counts the real
// keys; the others are 0, below every real key, and never gathered. Radix select: the k-th largest
// key, one digit at a time from the top (the first of kFirstDigitBits, the others of 8). The first
// digit's pass also finds the bits in which the keys differ: a digit that none of them sets is the
// same in every key, so a pass over it would learn nothing (bf16 scores, deepseek numerics, leave
// the low 16 bits of the score zero, and row indices below 2^24 the top byte of the inverted row).
// Once the keys sharing the prefix fit in `sel` beside those above it, both are gathered there (the
// ones above from its end), and the later digits and the final gather read only them; once the
// keys with the prefix are exactly the ones still wanted, the prefix is the threshold. (A query's
// scores do not stay in L2 between passes: a separate pass for the varying bits and a final one
// over all the keys made five.)
template <class Keys>
__device__ int gather_top(const Keys& keys, int64_t n_real, int64_t k, uint64_t* sel) {
  __shared__ uint32_t hist[256];  // a later digit's counts, or the first's summed 16 bins at a time
  __shared__ uint64_t prefix_s;
  __shared__ int64_t remaining_s, bucket_s;
  __shared__ int n_cand_s, n_above_s, n_sel_s;
  uint64_t threshold = 1;
  int64_t n_cand = -1, n_above = 0;  // n_cand ≥ 0: the candidates are sel[0, n_cand), the keys above them
                                     // sel[kMaxTopK − n_above, kMaxTopK)
  if (n_real > k) {
    uint64_t prefix = 0, mask = 0, varying = 0;
    int64_t remaining = k;
    const uint64_t first = keys.first();
    uint32_t* first_counts = reinterpret_cast<uint32_t*>(sel);
    // The digits' widths: kFirstDigitBits, then 8 while 8 bits are left, then the rest (none after bit 0).
    for (int shift = 64 - kFirstDigitBits, bits = kFirstDigitBits; bits > 0; bits = min(shift, 8), shift -= bits) {
      const bool first_digit = bits == kFirstDigitBits;
      const uint64_t digit_mask = ((uint64_t(1) << bits) - 1) << shift;
      if (!first_digit && (varying & digit_mask) == 0) {  // every key has this digit: the keys in play keep it
        prefix |= first & digit_mask;
        mask |= digit_mask;
        continue;
      }
      uint32_t* counts = first_digit ? first_counts : hist;
      for (int b = threadIdx.x; b < (first_digit ? kFirstBins : 256); b += blockDim.x) counts[b] = 0;
      __syncthreads();
      // A shared-memory atomic per key. Most scores share their top digits, yet grouping a warp's
      // equal digits first (__match_any_sync, one atomic a group) measured slower: indexer_select
      // at a 262 144 prompt 324.7 against 281.4 ms (H100, bench/results/cuda_stop46_h100.log).
      uint64_t differs = 0;
      auto count = [&](uint64_t key) {
        const unsigned digit = (key & mask) == prefix ? unsigned((key & digit_mask) >> shift) : kFirstBins;
        if (digit < kFirstBins) atomicAdd(&counts[digit], 1u);
        differs |= key ^ first;
      };
      if (n_cand >= 0)
        StoredKeys{sel, n_cand}.for_each(count);
      else
        keys.for_each(count);
      if (first_digit) {
        varying = block_or(differs);  // (its barriers also end the counting)
        for (int c = threadIdx.x; c < 256; c += blockDim.x) {
          uint32_t sum = 0;  // (from a bin set by c: lanes 16 words apart would share a bank)
          for (int j = 0; j < 16; ++j) sum += first_counts[16 * c + (j + c) % 16];
          hist[c] = sum;
        }
      }
      __syncthreads();
      if (threadIdx.x < 32) {
        int digit;
        int64_t above;
        find_digit(hist, remaining, digit, above);
        if (first_digit) {
          int bin;
          int64_t above_in_digit;
          find_fine_bin(first_counts, digit, remaining - above, bin, above_in_digit);
          digit = bin;
          above += above_in_digit;
        }
        if (threadIdx.x == 0) {
          prefix_s = prefix | (uint64_t(digit) << shift);
          remaining_s = remaining - above;
          bucket_s = counts[digit];
        }
      }
      __syncthreads();
      prefix = prefix_s;
      remaining = remaining_s;
      mask |= digit_mask;
      if (bucket_s == remaining) break;  // every key with this prefix is taken
      if (n_cand < 0 && bucket_s + (k - remaining) <= kMaxTopK) {  // (k − remaining keys lie above the prefix)
        if (threadIdx.x == 0) n_cand_s = n_above_s = 0;
        __syncthreads();
        keys.for_each([&](uint64_t key) {
          const uint64_t top = key & mask;
          if (top == prefix)
            sel[atomicAdd(&n_cand_s, 1)] = key;
          else if (top > prefix)
            sel[kMaxTopK - 1 - atomicAdd(&n_above_s, 1)] = key;
        });
        __syncthreads();
        n_cand = n_cand_s;
        n_above = n_above_s;
      }
    }
    threshold = prefix;  // ≥ 1: the k-th largest key is real, and so is every key with its prefix
  }
  // Exactly min(k, n_real) keys reach the threshold: real keys are unique.
  if (threadIdx.x == 0) n_sel_s = 0;
  __syncthreads();
  if (n_cand < 0) {
    keys.for_each([&](uint64_t key) {
      if (key >= threshold) sel[atomicAdd(&n_sel_s, 1)] = key;
    });
  } else {  // the listed keys to the front of sel, through registers (they may move onto each other)
    constexpr int kPerThread = kMaxTopK / kSelectThreads + 1;  // ⌈n_cand / threads⌉ + ⌈n_above / threads⌉
    uint64_t mine[kPerThread];
    int n_mine = 0;
    for (int64_t i = threadIdx.x; i < n_cand; i += blockDim.x)
      if (sel[i] >= threshold) mine[n_mine++] = sel[i];
    for (int64_t i = threadIdx.x; i < n_above; i += blockDim.x) mine[n_mine++] = sel[kMaxTopK - 1 - i];
    __syncthreads();
    for (int j = 0; j < n_mine; ++j) sel[atomicAdd(&n_sel_s, 1)] = mine[j];
  }
  __syncthreads();
  return n_sel_s;
}

// Bitonic sort of sel[0, n) into descending order, padded with zeros to a power of two. Pairs 32
// or more apart meet through shared memory, one barrier per step; steps whose pairs lie within 32
// run in registers with shuffles (element i stays with lane i mod 32: blockDim.x is a multiple of
// 32), the merges up to length 32 in one pass. 512 keys take 15 barriers instead of 45.
__device__ inline void sort_descending(uint64_t* sel, int64_t n) {
  int64_t size = 1;
  while (size < n) size *= 2;
  for (int64_t i = n + threadIdx.x; i < size; i += blockDim.x) sel[i] = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  // The steps of stride < 32 of the merges of length len_first … len_last. Whole warps step
  // together (every lane shuffles); lanes past `size` (size < 32) carry nothing a lane below reads.
  auto in_registers = [&](int64_t len_first, int64_t len_last) {
    for (int64_t i0 = threadIdx.x - lane; i0 < size; i0 += blockDim.x) {
      const int64_t i = i0 + lane;
      uint64_t x = i < size ? sel[i] : 0;
      for (int64_t len = len_first; len <= len_last; len *= 2)
        for (int64_t s = len / 2 < 32 ? len / 2 : 16; s > 0; s /= 2) {
          const uint64_t y = __shfl_xor_sync(kFullMask, x, int(s));
          const bool keep_larger = ((i & s) == 0) == ((i & len) == 0);  // the lower of a descending pair
          x = keep_larger ? (x > y ? x : y) : (x < y ? x : y);
        }
      if (i < size) sel[i] = x;
    }
    __syncthreads();
  };
  in_registers(2, size < 32 ? size : 32);
  for (int64_t len = 64; len <= size; len *= 2) {
    for (int64_t stride = len / 2; stride >= 32; stride /= 2) {
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
    in_registers(len, len);
  }
}

// How many of n_real keys a final selection gathers for its sort: all of few keys (sorting them
// whole costs fewer barriers than the digit passes and a sort of k), else the k largest.
__device__ inline int64_t gathered(int64_t n_real, int64_t k) { return n_real <= kSortAllKeys ? n_real : k; }

// A query's k output rows from its first n_sel sorted keys (more than k: the first k), −1 after them.
__device__ inline void write_rows(const uint64_t* sel, int64_t n_sel, int64_t k, int32_t* rows) {
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
    rows[i] = i < n_sel ? int32_t(0xffffffffu - uint32_t(sel[i] & 0xffffffffu)) : -1;
}

// The top k of one query's `visible` scores into its k output rows (−1 past the visible ones).
template <class S>
__device__ void select_over_scores(const S* score, int64_t visible, int64_t k, uint64_t* sel, int32_t* rows) {
  const int n_sel = gather_top(ScoreKeys<S>{score, visible}, visible, gathered(visible, k), sel);
  sort_descending(sel, n_sel);
  write_rows(sel, n_sel, k, rows);
}

// One block per query over its scores.
template <class S>
__global__ void __launch_bounds__(kSelectThreads)
    indexer_topk_kernel(const S* score, int64_t n_keys, int64_t ratio, int64_t p0, int64_t k, int32_t* idx) {
  await_previous_kernel();
  __shared__ uint64_t sel[kMaxTopK];
  const int64_t t = blockIdx.x;
  select_over_scores(score + t * n_keys, visible_keys(t, p0, ratio, n_keys), k, sel, idx + t * k);
}

// ---- the threshold path (few queries over many keys; see the top) ----------------------------

__device__ inline int bin_of(uint64_t key) { return int(key >> 48); }

// A query's threshold: written by the threshold kernel, counted up by the gather.
struct TopKThreshold {
  int32_t bin;       // keys above this bin are taken, of it the largest; −1: every key is taken
  uint32_t n_above;  // keys listed above the bin (fewer than k)
  uint32_t n_ties;   // keys of the bin met (the list keeps the first `tie_room`)
};

// Grid (key blocks of kHistKeys, query): hist[t] counts query t's visible keys per bin and per
// coarse bin. A block counts its keys in shared memory first (two 16-bit counts per word: a block
// has fewer than 2^16 keys), then adds its nonzero counts to hist. (One global atomic per key took
// 50 µs for the 262 144 keys of 1M context on an H200: the keys crowd into a few hundred bins.)
constexpr int kHistKeys = 16384, kHistThreads = 1024;
constexpr size_t kHistBytes = kBins * sizeof(uint16_t) + kCoarseBins * sizeof(uint32_t);
static_assert(kHistKeys < (1 << 16), "a block's count per bin fits 16 bits");

template <class S>
__global__ void __launch_bounds__(kHistThreads)
    topk_histogram_kernel(const S* score, int64_t n_keys, int64_t ratio, int64_t p0, uint32_t* hist) {
  await_previous_kernel();
  extern __shared__ uint32_t pair_counts[];  // kBins / 2 words (bin 2j in the low half of word j), then coarse
  uint32_t* coarse = pair_counts + kBins / 2;
  const int64_t t = blockIdx.y, visible = visible_keys(t, p0, ratio, n_keys);
  const int64_t w0 = int64_t(blockIdx.x) * kHistKeys;
  if (w0 >= visible) return;  // (uniform over the block)
  for (int j = threadIdx.x; j < kBins / 2 + kCoarseBins; j += blockDim.x) pair_counts[j] = 0;
  __syncthreads();
  const int64_t n = visible - w0 < kHistKeys ? visible - w0 : kHistKeys;
  for_each_element(score + t * n_keys + w0, n, [&](S s, int64_t i) {
    const int bin = bin_of(select_key(score_value(s), w0 + i));
    atomicAdd(&pair_counts[bin / 2], 1u << (16 * (bin % 2)));
  });
  __syncthreads();
  uint32_t* h = hist + t * kHistWords;
  for (int j = threadIdx.x; j < kBins / 2; j += blockDim.x) {
    const uint32_t c = pair_counts[j], lo = c & 0xffff, hi = c >> 16;
    if (lo) atomicAdd(&h[2 * j], lo);
    if (hi) atomicAdd(&h[2 * j + 1], hi);
    if (c) atomicAdd(&coarse[2 * j / (kBins / kCoarseBins)], lo + hi);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kCoarseBins; i += blockDim.x)
    if (coarse[i]) atomicAdd(&h[kBins + i], coarse[i]);
}

// One warp per query: the coarse bin holding its k-th largest key, then the bin among that coarse
// bin's 256 (find_digit over counts staged in shared memory). The gather clears the counts.
__global__ void __launch_bounds__(32) topk_threshold_kernel(const uint32_t* hist, int64_t k, TopKThreshold* threshold) {
  await_previous_kernel();
  __shared__ uint32_t counts[kCoarseBins];
  const int64_t t = blockIdx.x;
  const uint32_t* h = hist + t * kHistWords;
  const int lane = threadIdx.x;
  uint32_t own = 0;
  for (int i = lane; i < kCoarseBins; i += 32) {
    counts[i] = h[kBins + i];
    own += counts[i];
  }
  if (int64_t(__reduce_add_sync(kFullMask, own)) < k) {  // fewer than k keys: every one is taken
    if (lane == 0) threshold[t] = TopKThreshold{-1, 0, 0};
    return;
  }
  __syncwarp();
  int coarse_bin, fine_bin;
  int64_t above_coarse, above_fine;
  find_digit(counts, k, coarse_bin, above_coarse);
  __syncwarp();
  const int64_t first = int64_t(coarse_bin) * (kBins / kCoarseBins);
  for (int i = lane; i < kCoarseBins; i += 32) counts[i] = h[first + i];
  __syncwarp();
  find_digit(counts, k - above_coarse, fine_bin, above_fine);
  if (lane == 0) threshold[t] = TopKThreshold{int32_t(first) + fine_bin, 0, 0};
}

// Grid (key blocks, query): the keys above query t's threshold bin to above[t] (k each), those in
// it to ties[t] (tie_room each).
template <class S>
__global__ void topk_gather_kernel(const S* score, int64_t n_keys, int64_t ratio, int64_t p0, int64_t k,
                                   int64_t tie_room, TopKThreshold* threshold, uint32_t* hist, uint64_t* above,
                                   uint64_t* ties) {
  await_previous_kernel();
  const int64_t t = blockIdx.y, visible = visible_keys(t, p0, ratio, n_keys);
  const S* s = score + t * n_keys;
  TopKThreshold& th = threshold[t];
  const int bin = th.bin;
  // The counts, read by the threshold kernel before this one started, cleared for the next selection.
  uint32_t* h = hist + t * kHistWords;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < kHistWords; i += int64_t(gridDim.x) * blockDim.x)
    h[i] = 0;
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < visible; w += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t key = select_key(score_value(s[w]), w);
    if (bin_of(key) > bin) {
      above[t * k + atomicAdd(&th.n_above, 1u)] = key;
    } else if (bin_of(key) == bin) {
      const uint32_t i = atomicAdd(&th.n_ties, 1u);
      if (i < tie_room) ties[t * tie_room + i] = key;
    }
  }
}

// Block per query: its listed keys sorted, the first k kept; or, when the threshold bin held more
// keys than the list's room, the selection over all its scores.
template <class S>
__global__ void __launch_bounds__(kSelectThreads)
    topk_final_kernel(const S* score, int64_t n_keys, int64_t ratio, int64_t p0, int64_t k, int64_t tie_room,
                      const TopKThreshold* threshold, const uint64_t* above, const uint64_t* ties, int32_t* idx) {
  await_previous_kernel();
  __shared__ uint64_t sel[kMaxTopK];
  const int64_t t = blockIdx.x;
  const TopKThreshold th = threshold[t];
  if (th.n_ties > tie_room) {  // (uniform over the block)
    select_over_scores(score + t * n_keys, visible_keys(t, p0, ratio, n_keys), k, sel, idx + t * k);
    return;
  }
  const int64_t n = int64_t(th.n_above) + th.n_ties;  // ≤ k − 1 + tie_room ≤ kMaxTopK
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    sel[i] = i < th.n_above ? above[t * k + i] : ties[t * tie_room + i - th.n_above];
  __syncthreads();
  sort_descending(sel, n);
  write_rows(sel, n, k, idx + t * k);
}

__global__ void fill_ids_kernel(int32_t* idx, int64_t n, int32_t value) {
  await_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    idx[i] = value;
}

// Whether the top-k takes the threshold path (see the top): for fewer queries than fill the GPU with
// a block each (132 SMs on an H200), once they see more than kManyKeys keys, and only for k ≤
// kMaxTopK / 4, so that the threshold bin's keys have room beside the k − 1 above it.
bool threshold_path(int64_t T, int64_t visible_max, int64_t k) {
  constexpr int64_t kQueriesFillingGpu = 128;
  return T < kQueriesFillingGpu && visible_max > kManyKeys && 4 * k <= kMaxTopK;
}

// Scratch of the threshold path for n queries: their key counts, thresholds and listed keys.
struct ThresholdScratch {
  TopKThreshold* threshold;
  uint64_t* above;  // [n, k]
  uint64_t* ties;   // [n, tie_room]
  uint32_t* hist;   // [n, kHistWords], zero between selections
  int64_t tie_room;
};

// The threshold path's scratch for n queries in `buffer` (kept between selections, zero when new:
// the counts stay zero between selections), in parts of 256-byte multiples.
ThresholdScratch threshold_scratch(GrownBuffer& buffer, StreamMemory& memory, int64_t n, int64_t k) {
  auto round_up = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t hist_bytes = round_up(size_t(n * kHistWords) * sizeof(uint32_t));
  const size_t threshold_bytes = round_up(size_t(n) * sizeof(TopKThreshold));
  const size_t listed_bytes = size_t(n * kMaxTopK) * sizeof(uint64_t);  // k above and kMaxTopK − k ties per query
  auto* base = static_cast<unsigned char*>(buffer.get(memory, hist_bytes + threshold_bytes + listed_bytes));
  auto* listed = reinterpret_cast<uint64_t*>(base + hist_bytes + threshold_bytes);
  return {reinterpret_cast<TopKThreshold*>(base + hist_bytes), listed, listed + n * k,
          reinterpret_cast<uint32_t*>(base), kMaxTopK - k};
}

// The top k of n queries' scores into idx (the last query sees visible_max keys).
template <class S>
void select_top_k(cudaStream_t stream, const S* score, int64_t n, int64_t n_keys, int64_t visible_max,
                  int64_t ratio, int64_t p0, int64_t k, const ThresholdScratch* th, int32_t* idx) {
  if (!th) {
    launch(indexer_topk_kernel<S>, unsigned(n), kSelectThreads, 0, stream, score, n_keys, ratio, p0, k, idx);
    DSV4_CUDA_LAUNCHED("indexer_select (top-k)");
    return;
  }
  constexpr int kKeysPerBlock = 2048, kThreads = 256;  // the gather's
  const dim3 hist_grid(unsigned(std::max<int64_t>(1, (visible_max + kHistKeys - 1) / kHistKeys)), unsigned(n));
  launch(topk_histogram_kernel<S>, hist_grid, kHistThreads, kHistBytes, stream, score, n_keys, ratio, p0, th->hist);
  DSV4_CUDA_LAUNCHED("indexer_select (top-k histogram)");
  launch(topk_threshold_kernel, unsigned(n), 32, 0, stream, th->hist, k, th->threshold);
  DSV4_CUDA_LAUNCHED("indexer_select (top-k threshold)");
  const dim3 grid(unsigned(std::max<int64_t>(1, (visible_max + kKeysPerBlock - 1) / kKeysPerBlock)), unsigned(n));
  launch(topk_gather_kernel<S>, grid, kThreads, 0, stream, score, n_keys, ratio, p0, k, th->tie_room, th->threshold,
         th->hist, th->above, th->ties);
  DSV4_CUDA_LAUNCHED("indexer_select (top-k gather)");
  launch(topk_final_kernel<S>, unsigned(n), kSelectThreads, 0, stream, score, n_keys, ratio, p0, k, th->tie_room,
         th->threshold, th->above, th->ties, idx);
  DSV4_CUDA_LAUNCHED("indexer_select (top-k final)");
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
    launch(fill_ids_kernel, grid_for(T * k, 256), 256, 0, stream_, idx, T * k, -1);
    DSV4_CUDA_LAUNCHED("indexer_select (no keys)");
    return;
  }
  // Compact keys in deepseek numerics: the exact integer path (indexer_fp4.cu), on q packed like
  // the keys and prepared once for every chunk; deepseek-tc's runs on the tensor cores.
  const bool fp4_path = deepseek() && fp4_scores_apply(key_format, dim);
  const bool tensor_cores = fp4_path && numerics() == Numerics::deepseek_tc && fp4_tensor_cores_apply(heads);
  DeviceArray<float> q_packed(memory_, fp4_path ? size_t(T * heads * key_format.stride) : 0);
  DeviceArray<unsigned char> q_prepared(memory_, fp4_path ? fp4_queries_bytes(T, heads, tensor_cores) : 0);
  Fp4Queries fp4_queries{};
  if (fp4_path) {
    pack_rows(key_format, q, T * heads, q_packed.get());
    fp4_queries = prepare_fp4_queries(stream_, q_packed.get(), wts, T, int(heads), key_format, tensor_cores,
                                      q_prepared.get());
    allow_shared_memory(fp4_scores_kernel(tensor_cores), fp4_scores_smem(int(heads), tensor_cores),
                        "indexer scores over compact keys");
  }
  // The chunks' scores, stored as S (see the top).
  auto score_and_select = [&](auto stored) {
    using S = decltype(stored);
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(T, kScoreScratchBytes / int64_t(sizeof(S)) / n_keys));
    DeviceArray<S> score(memory_, size_t(chunk * n_keys));
    const bool by_threshold = threshold_path(T, std::min(n_keys, (p0 + T) / ratio), k);
    const ThresholdScratch th =
        by_threshold ? threshold_scratch(topk_scratch_, memory_, chunk, k) : ThresholdScratch{};
    if (by_threshold)
      allow_shared_memory(reinterpret_cast<const void*>(topk_histogram_kernel<S>), kHistBytes,
                          "indexer top-k histogram");
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t n = std::min(chunk, T - t0);
      const int64_t visible_max = std::min(n_keys, (p0 + t0 + n) / ratio);
      if constexpr (std::is_same_v<S, Bf16Bits>) {
        if (visible_max > 0 && fp4_path)
          fp4_scores(stream_, fp4_queries, t0, n, wts, int(heads), key_format, keys, n_keys, visible_max, ratio, p0,
                     tensor_cores, score.get());
      }
      if (visible_max > 0 && !fp4_path) {
        const dim3 grid(unsigned(n), unsigned((visible_max + kScoreWarps - 1) / kScoreWarps));
        launch(indexer_scores_kernel<S>, grid, kScoreWarps * 32, 0, stream_, q + t0 * heads * dim, wts + t0 * heads,
               heads, dim, keys, key_format, n_keys, ratio, p0 + t0, score.get());
        DSV4_CUDA_LAUNCHED("indexer_select (scores)");
      }
      select_top_k(stream_, score.get(), n, n_keys, visible_max, ratio, p0 + t0, k, by_threshold ? &th : nullptr,
                   idx + t0 * k);
    }
  };
  if (deepseek())
    score_and_select(Bf16Bits{});
  else
    score_and_select(float{});
}

}  // namespace dsv4::cuda
