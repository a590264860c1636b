// The Lightning Indexer's scores over compact (FP4) keys in deepseek numerics, on the integer
// tensor cores (indexer.cu selects the top k from them; the method is at the top of
// indexer_fp4.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/row_format.h"

namespace dsv4::cuda {

// A deepseek score as a chunk stores it: its bf16 bits (every score is a bf16 value in deepseek
// numerics; indexer.cu).
using Bf16Bits = uint16_t;

// Query t of a chunk starting at position p0 sees the rows w < ⌊(p0 + t + 1) / ratio⌋ that exist.
__device__ inline int64_t visible_keys(int64_t t, int64_t p0, int64_t ratio, int64_t n_keys) {
  return (p0 + t + 1) / ratio < n_keys ? (p0 + t + 1) / ratio : n_keys;
}

// visible_keys for the queries t0, t0 + 1, … in turn, stepping ⌊(p0 + t + 1) / ratio⌋ as a quotient
// and remainder: a scores kernel's loop over its queries then divides once, not once per query
// (a 64-bit division is a long call on the GPU).
class VisibleKeys {
 public:
  __device__ VisibleKeys(int64_t t0, int64_t p0, int64_t ratio, int64_t n_keys)
      : quotient_((p0 + t0 + 1) / ratio), n_keys_(n_keys), remainder_(int((p0 + t0 + 1) % ratio)), ratio_(int(ratio)) {}
  __device__ int64_t count() const { return quotient_ < n_keys_ ? quotient_ : n_keys_; }
  __device__ void next() {
    if (++remainder_ == ratio_) remainder_ = 0, ++quotient_;
  }

 private:
  int64_t quotient_, n_keys_;
  int remainder_, ratio_;
};

// Whether the compact-key path scores keys of format f and width dim: FP4 rows of whole 32-blocks,
// at most V4's index_head_dim (128) wide.
bool fp4_scores_apply(const RowFormat& f, int64_t dim);

// Heads in tiles of 8: the tensor cores' column count.
__host__ __device__ inline int64_t head_tiles(int64_t heads) { return (heads + 7) / 8; }

// The queries as the scores kernel reads them, made once per call (prepare_fp4_queries): each
// lane's tensor-core operands in its load order, the heads' block exponents, each lane's weights
// and per query the bounds that let its terms be summed in any order (see indexer_fp4.cu). The
// preparing kernel writes them (kWritable); the scores kernel reads.
template <bool kWritable>
struct Fp4QueryArrays {
  template <class T>
  using Ptr = std::conditional_t<kWritable, T*, const T*>;
  // Elements per query and head tile of the first three arrays.
  static constexpr int64_t kWords = 64, kExps = 8, kLanes = 4;
  // Elements per query of the images: 64 head rows of 128 bytes, 256 bytes of weight and sign
  // pairs, the bounds (indexer_fp4.cu).
  static constexpr int64_t kImageWords = (64 * 128 + 256) / 16 + 1;
  Ptr<uint4> words;   // [T][head tiles][32 lanes][2]: a lane's 8 operand words, blocks 0 … 3
  Ptr<int4> exps;     // [T][8 · head tiles]: a head's staged block exponents
  Ptr<uint4> lanes;   // [T][head tiles][4]: per lane column pair, the scaled weights and the signs
  Ptr<int4> query;    // [T]: fast (0/1), the least and the greatest key exponent it allows
  Ptr<uint4> images;  // [T][kImageWords]: what the tensor-core kernel copies whole (null when unused)

  // The arrays from query t on.
  __host__ __device__ Fp4QueryArrays from(int64_t t, int64_t heads) const {
    const int64_t tiles = head_tiles(heads);
    return {words + t * tiles * kWords, exps + t * tiles * kExps, lanes + t * tiles * kLanes, query + t,
            images ? images + t * kImageWords : images};
  }
  Fp4QueryArrays<false> read_only() const { return {words, exps, lanes, query, images}; }
};
using Fp4Queries = Fp4QueryArrays<false>;

// Whether deepseek-tc's tensor-core scores kernel runs queries of `heads` heads on this device
// (sm_90a: wgmma; at most 64 heads, V4's).
bool fp4_tensor_cores_apply(int64_t heads);

// Bytes of the prepared form of T queries of `heads` heads; with images for the tensor-core kernel.
size_t fp4_queries_bytes(int64_t T, int64_t heads, bool images);

// Prepares T queries (q_packed: [T, heads] rows packed in the keys' format f; wts: [T, heads]) in
// `buffer` (fp4_queries_bytes), returning its view.
Fp4Queries prepare_fp4_queries(cudaStream_t stream, const float* q_packed, const float* wts, int64_t T, int heads,
                               const RowFormat& f, bool images, void* buffer);

// The scores kernel (exact, or deepseek-tc's on the tensor cores) and the shared memory it needs
// (the caller allows it once).
const void* fp4_scores_kernel(bool tensor_cores);
size_t fp4_scores_smem(int heads, bool tensor_cores);

// score[t − t0, w] (bf16 bits) for the queries t0 … t0 + n − 1 of q (positions p0 + t − t0) over the keys each
// sees (the last sees visible_max); wts as given to prepare_fp4_queries. tensor_cores: deepseek-tc's
// kernel (q prepared with images; see indexer_fp4.cu).
void fp4_scores(cudaStream_t stream, const Fp4Queries& q, int64_t t0, int64_t n, const float* wts, int heads,
                const RowFormat& f, const float* keys, int64_t n_keys, int64_t visible_max, int64_t ratio, int64_t p0,
                bool tensor_cores, Bf16Bits* score);

}  // namespace dsv4::cuda
