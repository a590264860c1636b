// deepseek-tc's routed FP4 experts on the FP8 tensor cores (gemm_experts_tc.h), Hopper's wgmma.
//
// The rows are grouped by expert (row_grouping.cuh, tiles of 256) and each block takes up to 256
// token rows of one expert against 128 of its weight rows, so an expert's weights are read, and made
// e5m2, once per 256 tokens, as stored (FP4 nibbles and their E8M0 1×32 scales). The activations
// are act_quant's e4m3 codes (QuantizedForm::fragment_codes) with their 1×128 scales. The weights
// become e5m2, exact: an e2m1 value times 2^t is an e5m2 value for every t in [−13, 13] (e5m2 spans
// 2^-14 … 57 344 with normals, and e2m1 has one mantissa bit to e5m2's two). So each weight row
// takes one common exponent R (its largest 1×32 scale over K, less 13) and each of its 32-blocks
// becomes e2m1 · 2^t with t = its scale − R; a block more than 2^26 below the row's largest is
// dropped (its products are below 2^-26 of the row's others: the approximation this numerics
// allows). The tensor cores then multiply e5m2 by e4m3 exactly and accumulate over one 128-block of
// K (four wgmma k32 steps, in their own reduced-precision fp32), and the partial is scaled by the
// token's activation scale and added to an fp32 accumulator on the CUDA cores, one 128-block at a
// time (the official kernels' promotion, architecture.md §5); the result times 2^R is rounded to
// bf16.
//
// The weights are wgmma's A operand, from registers: each consumer thread loads its raw nibbles
// from shared memory (ldmatrix: 8 consecutive codes of a 32-block per register) and turns them into
// e5m2 in place (byte permutes from a table per 32-block), so the converted weights never cross
// shared memory. A fragment register holds 4 consecutive K positions, and its thread's 8 codes
// fill two registers that wgmma reads 16 positions apart; act_quant writes the activations with
// each 32-block's groups of 4 reordered to match (group g at place 4 (g % 2) + g / 2), and the sum
// over K does not depend on its order. The tokens are the B operand, from shared memory.
//
// Why 256 tokens: a consumer's instructions, not the data, set the pace (bench/cuda_decode.md,
// twenty-sixth session: ≈ 110 a K block to make the fragments, ≈ 72 to promote 128 tokens), so the
// fragments now serve twice the tokens. The tokens go through the tensor cores a quarter (64) at a
// time, into two partials in turn: while one quarter's products run, the one before is promoted,
// so a warpgroup keeps the tensor cores busy on its own, and a tile's empty quarters cost nothing
// (at an 8K prompt a tile of 128 was 60% filled). Registers bound the tile: 128 accumulators, two
// partials of 32 and 16 fragment registers a consumer thread.
//
// The work is split by warpgroup, meeting only at barriers in shared memory (one per stage that
// fills, one that empties). The tile's weight scales reach shared memory once, at its start, made
// into a table by the consumers while the producer starts the first stages' activation copies. The
// producer (warpgroup 0) copies each K block's activations (32 KB, 128-byte rows swizzled as wgmma
// reads them), their scales and the raw weight bytes (8 KB) kStages − 1 blocks ahead (cp.async, a
// warp's copies whole rows); it skips the rows past the tile's, whose products are never stored.
// The two consumers (warpgroups 1 and 2, 64 weight rows each) multiply and promote, then make the
// next block's fragments. The registers are moved to the consumers (setmaxnreg).
//
// The tile's outputs leave through shared memory: each consumer thread's 128 values go to their
// token rows in the stages' memory, then each token row's 128 outputs to its output row as 16-byte
// stores. Stored from the registers, each value took its own address and 4-byte store, and the
// unrolled stores were 43% of the kernel's code: ncu's stall samples put ≈ 27% of a consumer's
// time there (bench/cuda_decode.md, forty-third session).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/fp4_e5m2.cuh"
#include "backend/cuda/gemm_experts_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_grouping.cuh"
#include "backend/cuda/weight_access.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kBM = 256, kBN = 128, kBK = 128, kStages = 4;  // token rows, weight rows, K per block
constexpr int kQuarter = 64, kQuarters = kBM / kQuarter;     // token rows per product
constexpr int kProducers = 128, kConsumers = 256, kThreads = kProducers + kConsumers;
// Registers per thread of each role once the roles split (setmaxnreg): together what the block is
// given at launch, 168 a thread (__launch_bounds__ with one block per SM).
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(kProducers * kProducerRegisters + kConsumers * kConsumerRegisters == kThreads * 168, "the block's registers");
static_assert(2 * kProducers == kBM, "a producer thread copies two token rows' scales");
// A stage: the activations, the raw weights, the tokens' scales (block_scales<kQuarter> per quarter).
constexpr int kXBytes = kBM * kBK, kRawBytes = kBN * kBK / 2, kQuarterScales = block_scales<kQuarter>;
constexpr int kScaleBytes = kQuarters * kQuarterScales * 4;
// Bytes per weight row of the scale table (its E8M0 bytes, then their shift entries): one word per
// K block (zeros past K), and a word more so that the rows a warp reads at once lie on different
// banks.
__host__ __device__ constexpr int64_t scale_stride(int64_t K) { return 4 * ((K + kBK - 1) / kBK) + 4; }
// Shared memory from a 1024-byte boundary (the swizzle's period): the stages' activations, raw
// weights and token scales, per weight row its 2^R, then the weights' scale table.
constexpr size_t kXOff = 0, kRawOff = kXOff + size_t(kStages) * kXBytes, kSxOff = kRawOff + size_t(kStages) * kRawBytes,
                 kRowScaleOff = kSxOff + size_t(kStages) * kScaleBytes, kTableOff = kRowScaleOff + kBN * 4;
size_t smem_bytes(int64_t K) { return kSwizzlePeriod + kTableOff + size_t(kBN * scale_stride(K)); }
// Where token row t's offset in x sits in the producer's table: row t = g + 16i (g < 16) is copy i of
// the producer threads 8g … 8g + 7, which read their 16 rows' offsets as four 16-byte loads.
__host__ __device__ constexpr int x_offset(int t) { return t % 16 * (kBM / 16) + t / 16; }
// The tile's outputs leave through the stages' memory (free once both consumers are past their last
// products): [kBM token rows][kOutPitch floats]. A pitch of 132 words puts a store instruction's
// four token rows (2 lc apart) on different banks.
constexpr int kOutPitch = kBN + 4;
static_assert(size_t(kBM) * kOutPitch * 4 <= kRowScaleOff, "the staged outputs fit in the stages");
// The dynamic shared memory a block may ask for: 227 KB less the kernel's own arrays (7.1 KB) and
// a margin.
constexpr size_t kSmemLimit = 217 * 1024;

// Where chunk c of raw weight row r sits in its 64 bytes: the 8 rows one ldmatrix matrix reads
// land on distinct banks.
__device__ __forceinline__ int raw_chunk(int r, int c) { return r * 64 + 16 * (c ^ ((r >> 1) & 3)); }

#ifdef DSV4_WGMMA
// d (+)= A · Bᵀ over 32 of K: A 64 rows of e5m2 in registers (a: this thread's fragment), B 64
// rows of e4m3 in shared memory; d = A · Bᵀ when !accumulate.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_k32(float (&d)[32], const uint32_t* a, uint64_t b) {
#define DSV4_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e5m2.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : DSV4_D8(0), DSV4_D8(8), DSV4_D8(16), DSV4_D8(24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kAccumulate ? 1 : 0));
#undef DSV4_D8
}

#endif

// Barriers of the consumer warpgroups alone (the producer's warps may have left) and of the
// producer's alone; and the consumers' word to the producer that the table of weight scales is made,
// one barrier at which the consumers arrive and go on (table_made) and the producer waits
// (await_table).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }
__device__ __forceinline__ void producers_sync() { asm volatile("bar.sync 2, %0;" ::"n"(kProducers) : "memory"); }
__device__ __forceinline__ void table_made() { asm volatile("bar.arrive 3, %0;" ::"n"(kThreads) : "memory"); }
__device__ __forceinline__ void await_table() { asm volatile("bar.sync 3, %0;" ::"n"(kThreads) : "memory"); }

// x: the activations' e4m3 codes, rows of K in fragment order; sx: their scales [source rows][K/128].
__global__ void __launch_bounds__(kThreads, 1)
    experts_fp8_kernel(GemmRequest p, const uint8_t* x, const float* sx, Grouping g) {
#ifdef DSV4_WGMMA
  await_previous_kernel();
  extern __shared__ unsigned char smem_base[];
  unsigned char* smem = at_swizzle_period(smem_base);
  float* row_scale = reinterpret_cast<float*>(smem + kRowScaleOff);  // [kBN]: 2^R of each weight row
  uint8_t* scales = smem + kTableOff;                                 // [kBN][scale_stride]: E8M0 bytes
  __shared__ int64_t src_of[kBM], out_of[kBM];
  __shared__ __align__(16) int32_t x_offsets[kBM];  // where each token row's codes start in x
  __shared__ int32_t sx_offsets[kBM];                // and its scales in sx
  __shared__ int row_top[2][kBN];  // each half's largest scale byte
  __shared__ uint64_t filled[kStages], emptied[kStages];
  LinearView W;
  if (!tile_rows<kBM>(p, g, kBN, src_of, out_of, W)) return;
  const int tid = threadIdx.x, lane = tid % 32;
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) barrier_init(&filled[s], kProducers), barrier_init(&emptied[s], kConsumers / 32);
  const int n_rows = __syncthreads_count(tid < kBM && out_of[tid] >= 0);  // the tile's rows come first
  const int64_t n0 = int64_t(blockIdx.x) * kBN, K = p.W.in;
  const int n_kb = int((K + kBK - 1) / kBK), n_sub = int(K / 32), stride = int(scale_stride(K));

  // The producer lays out the token rows' offsets and starts the first stages' activation copies while
  // the consumers make the table of weight scales the weight copies need (table_made, await_table).
  if (tid < kProducers) {
    // Each token row's offsets in x and sx (32 bits: fits_tensor_core_experts), x's in the order each
    // producer thread reads them (see x_offset).
    for (int t = tid; t < kBM; t += kProducers) {
      const int32_t src = t < n_rows ? int32_t(src_of[t]) : 0;
      x_offsets[x_offset(t)] = src * int32_t(K), sx_offsets[t] = src * n_kb;
    }
    producers_sync();
  } else {
    // Consumer thread c = (row c % kBN, half c / kBN) copies the words of every other K block of the
    // row's scale bytes (zeros past K) into the table and keeps their largest byte; R is the larger
    // half's, less kTopShift; then the same thread's words become shift entries (shift_entry).
    const int c = tid - kProducers, r = c % kBN, half = c / kBN;
    const int64_t n = n0 + r;
    const uint8_t* row = scale_row<kFp4>(W, n < p.rows ? p.row0 + n : 0);
    uint32_t* table = reinterpret_cast<uint32_t*>(scales + r * stride);
    const bool words = W.scale_cols % 4 == 0;  // (device scales start 256-byte aligned)
    uint32_t top = 0;                          // bytewise
    constexpr int kBatch = 8;                  // loads in flight at once
    for (int w0 = half; w0 < n_kb; w0 += 2 * kBatch) {
      uint32_t v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int w = w0 + 2 * i;
        v[i] = 0;
        if (n >= p.rows || w >= n_kb) continue;
        if (words && 4 * w + 4 <= n_sub) v[i] = reinterpret_cast<const uint32_t*>(row)[w];
        else
          for (int b = 0; b < 4 && 4 * w + b < n_sub; ++b) v[i] |= uint32_t(row[4 * w + b]) << (8 * b);
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        if (w0 + 2 * i < n_kb) table[w0 + 2 * i] = v[i], top = __vmaxu4(top, v[i]);
    }
    row_top[half][r] = int(largest_byte(top));
    consumers_sync();
    const int R = max(row_top[0][r], row_top[1][r]) - kTopShift;
    for (int w = half; w < n_kb; w += 2) {
      const uint32_t v = table[w];
      uint32_t entries = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) entries |= (4 * w + b < n_sub ? shift_entry(int(v >> (8 * b) & 0xFF), R) : 0u) << (8 * b);
      table[w] = entries;
    }
    if (half == 0) row_scale[r] = ldexpf(1.0f, R - 127);
    consumers_sync();
    table_made();
  }

  if (tid < kProducers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
    // Producer thread tid: chunk tid % 8 of activation rows tid / 8 + 16i, the scales of token rows
    // tid and tid + 128, and chunk tid % 4 of weight rows tid / 4 + 32i (so a warp reads whole 128-
    // and 64-byte rows). The rows past the tile's are zeros, read from nowhere (their products are
    // never stored), and so are the chunks past K (the weights' are zeros too, but x's could be NaN).
    // Row tid / 8 + 16i's chunk lands 2 048 i bytes after row tid / 8's, and weight row tid / 4 + 32i's
    // 2 048 i after row tid / 4's (both keep their row's swizzle). Each batch of copies follows its
    // shared-memory loads (ptxas separates a load from a copy after it by three idle slots).
    const int chunk = tid % 8, w_chunk = tid % 4;
    constexpr int kRawCopies = kBN * 4 / kProducers;  // 16-byte weight chunks per thread and block
    int32_t w_at[kRawCopies];                         // the weight rows' chunks in W, −1 for none
#pragma unroll
    for (int i = 0; i < kRawCopies; ++i) {
      const int64_t n = n0 + tid / 4 + (kProducers / 4) * i;
      w_at[i] = n < p.rows ? int32_t((p.row0 + n) * (K / 2) + 16 * w_chunk) : -1;
    }
    const uint32_t x_to = shared_address(smem + kXOff) + swizzled(tid / 8, chunk);
    const uint32_t raw_to = shared_address(smem + kRawOff) + raw_chunk(tid / 4, w_chunk);
    uint32_t sx_to[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = tid + kProducers * j;
      sx_to[j] = shared_address(smem + kSxOff) + 4 * (row / kQuarter * kQuarterScales + scale_place<kQuarter>(row % kQuarter));
    }
    const int4* my_x_offsets = reinterpret_cast<const int4*>(x_offsets + x_offset(tid / 8));
    const int32_t K32 = int32_t(K), rows_left = n_rows - tid / 8;  // row tid / 8 + 16i is the tile's if 16i < rows_left
    auto issue_tokens = [&](int kb) {
      const int slot = kb % kStages;
      const int32_t k0 = kb * kBK;
      const bool chunk_in = k0 + 16 * chunk < K32;
      const uint8_t* x_k = x + (k0 + 16 * chunk);
#pragma unroll
      for (int i4 = 0; i4 < kBM / 16 / 4; ++i4) {
        const int4 o = my_x_offsets[i4];
        const int32_t at[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * i4 + e;
          copy_async_16(x_to + slot * kXBytes + 2048 * i, x_k + uint32_t(at[e]), chunk_in && 16 * i < rows_left);
        }
      }
      const int32_t sx_at[2] = {sx_offsets[tid], sx_offsets[tid + kProducers]};
#pragma unroll
      for (int j = 0; j < 2; ++j)
        copy_async_4(sx_to[j] + slot * kScaleBytes, sx + (uint32_t(sx_at[j]) + kb), tid + kProducers * j < n_rows);
    };
    auto issue_weights = [&](int kb) {
      const int slot = kb % kStages;
      const int32_t k0 = kb * kBK;
      const bool w_chunk_in = k0 + 32 * w_chunk < K32;
      uint32_t entry[kRawCopies];
#pragma unroll
      for (int i = 0; i < kRawCopies; ++i) entry[i] = scales[(tid / 4 + (kProducers / 4) * i) * stride + 4 * kb + w_chunk];
#pragma unroll
      for (int i = 0; i < kRawCopies; ++i) {
        const bool ok = w_at[i] >= 0 && w_chunk_in && entry[i] != kDropped;
        copy_async_16(raw_to + slot * kRawBytes + 2048 * i, W.data + (ok ? w_at[i] + k0 / 2 : 0), ok);
      }
    };
    auto fill = [&](int steps) {  // the first stages: their activations before the table is ready
      for (int kb = 0; kb < steps; ++kb) issue_tokens(kb);
      await_table();
      for (int kb = 0; kb < steps; ++kb) issue_weights(kb);
    };
    produce_ring<kStages>(n_kb, filled, emptied, fill, [&](int kb) { issue_tokens(kb), issue_weights(kb); });
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
  const int ct = tid - kProducers, wg = ct / 128, warp = ct % 128 / 32;
  const int wrow = 64 * wg + 16 * warp;  // the warp's 16 weight rows; this thread's: wrow + lane / 4 (+ 8)
  const int lr = lane / 4, lc = lane % 4;  // the lane's row (of 8) and column (of 4) in mma terms
  // ldmatrix: lanes 8m … 8m + 7 address matrix m = rows wrow + 8 (m % 2) + lane % 8 of segment m / 2
  // (of the two in each load), so register m holds row lr (+ 8 for odd m) of that segment.
  const int ld_row = wrow + 8 * (lane / 8 % 2) + lane % 8, ld_seg = lane / 16;
  const uint32_t* table0 = reinterpret_cast<const uint32_t*>(scales + (wrow + lr) * stride);
  const uint32_t* table1 = reinterpret_cast<const uint32_t*>(scales + (wrow + lr + 8) * stride);
  // Block kb's A fragments: f[4q + i] is register i of K step q (rows lr, lr + 8 at places 4 lc … 4 lc + 3,
  // then the same rows 16 places on), from the 8 codes at 8 lc … 8 lc + 7 of each row's 32-block q.
  auto fragments = [&](int kb, uint32_t (&f)[16]) {
    const unsigned char* raw = smem + kRawOff + (kb % kStages) * kRawBytes;
    uint32_t w[8];  // w[2q + e]: row lr + 8e's codes of segment q
    load_matrices<false>(*reinterpret_cast<uint32_t(*)[4]>(&w[0]), raw + raw_chunk(ld_row, ld_seg));
    load_matrices<false>(*reinterpret_cast<uint32_t(*)[4]>(&w[4]), raw + raw_chunk(ld_row, 2 + ld_seg));
    const uint32_t entries[2] = {table0[kb], table1[kb]};
    auto segment = [&]<int kQ>() {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint2 v = e2m1x8_e5m2(w[2 * kQ + e], e5m2_table<kQ>(entries[e]));
        f[4 * kQ + e] = v.x, f[4 * kQ + 2 + e] = v.y;
      }
    };
    segment.operator()<0>(), segment.operator()<1>(), segment.operator()<2>(), segment.operator()<3>();
  };
  // The products of quarter q go to partial q % 2 (a, b). kQ: the quarters that hold rows, fixed
  // per tile, so no product is in a branch (ptxas would serialise them).
  auto run = [&]<int kQ>() {
    float acc[kQ][32] = {}, a[32], b[32];
    uint32_t f[16];
    const auto same = [](float s) { return s; };
    // Stage 0's first quarter; a descriptor counts 16-byte units (adding keeps within its address field).
    const uint64_t tokens0 = tile_descriptor(smem + kXOff);
    barrier_wait(&filled[0], 0);
    fragments(0, f);
    for (int kb = 0; kb < n_kb; ++kb) {
      const int slot = kb % kStages;
      const float* token_scales = reinterpret_cast<const float*>(smem + kSxOff + slot * kScaleBytes);
      auto product = [&](float (&d)[32], int q) {  // quarter q's products of this block, one group
        const uint64_t tokens = tokens0 + (slot * kXBytes + q * kQuarter * kBK) / 16;
        wgmma_k32<false>(d, &f[0], tokens);
#pragma unroll
        for (int s = 1; s < kBK / 32; ++s) wgmma_k32<true>(d, &f[4 * s], tokens + 2 * s);  // 32 bytes on, in 16s
        wgmma_commit();
      };
      // Quarter q's partial is promoted once its group is done, with the next quarter's in flight.
      auto promote_quarter = [&](const float (&d)[32], int q) {
        promote(acc[q], d, token_scales + q * kQuarterScales, lc, same);
      };
      wgmma_begin();
      product(a, 0);
      if constexpr (kQ > 1) product(b, 1);
      wgmma_wait<(kQ > 1 ? 1 : 0)>(a);
      promote_quarter(a, 0);
      if constexpr (kQ > 2) wgmma_begin(), product(a, 2);
      if constexpr (kQ > 1) wgmma_wait<(kQ > 2 ? 1 : 0)>(b), promote_quarter(b, 1);
      if constexpr (kQ > 3) wgmma_begin(), product(b, 3);
      if constexpr (kQ > 2) wgmma_wait<(kQ > 3 ? 1 : 0)>(a), promote_quarter(a, 2);
      if constexpr (kQ > 3) wgmma_wait<0>(b), promote_quarter(b, 3);
      __syncwarp();
      if (lane == 0) barrier_arrive(&emptied[slot]);  // the warp is done with the stage
      if (kb + 1 < n_kb) {  // every product is done: the fragments can be the next block's
        barrier_wait(&filled[(kb + 1) % kStages], ((kb + 1) / kStages) & 1);
        fragments(kb + 1, f);
      }
    }
    // The outputs, rounded, to their token rows in shared memory (once both consumers' products are done),
    // then each token row's 128 to its output row in 16-byte stores, a warp a row.
    const float scale_of[2] = {row_scale[wrow + lr], row_scale[wrow + lr + 8]};
    consumers_sync();
    float* staged = reinterpret_cast<float*>(smem + kXOff);
#pragma unroll
    for (int q = 0; q < kQ; ++q)
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int row = wrow + lr + (i % 4 >= 2 ? 8 : 0), token = kQuarter * q + 8 * (i / 4) + 2 * lc + i % 2;
        staged[token * kOutPitch + row] = round_bf16(acc[q][i] * scale_of[i % 4 / 2]);
      }
    consumers_sync();
    const bool vectors = reinterpret_cast<uintptr_t>(p.y) % 16 == 0 && p.y_stride % 4 == 0;
    static_assert(kRowGroup == 4, "a float4 of the staged row");
    for (int c = ct; c < n_rows * (kBN / 4); c += kConsumers) {
      const int token = c / (kBN / 4), col = 4 * (c % (kBN / 4));
      const float4 q = *reinterpret_cast<const float4*>(staged + token * kOutPitch + col);
      const float v[kRowGroup] = {q.x, q.y, q.z, q.w};
      store4(p.y + out_of[token] * p.y_stride + n0, col, p.rows - n0, vectors && n0 + col + kRowGroup <= p.rows, v);
    }
  };
  static_assert(kQuarters == 4, "one case per quarter count");
  switch ((n_rows + kQuarter - 1) / kQuarter) {
    case 1: run.operator()<1>(); break;
    case 2: run.operator()<2>(); break;
    case 3: run.operator()<3>(); break;
    default: run.operator()<4>(); break;
  }
#endif
}

}  // namespace

bool fits_tensor_core_experts(const GemmRequest& r) {
  const int64_t x_bytes = r.source_rows() * r.W.in, w_bytes = (r.row0 + r.rows) * r.W.in / 2;
  return r.table && r.W.format == kFp4 && !r.W.scale_is_f32 && r.W.in % 32 == 0 &&
         std::max(x_bytes, w_bytes) <= INT32_MAX &&  // the copies' 32-bit offsets
         smem_bytes(r.W.in) <= kSmemLimit && device_has_wgmma();
}

void CudaBackend::tensor_core_experts(const GemmRequest& r, const uint8_t* x, const float* sx, int32_t* scratch) {
  DSV4_CUDA_REQUIRE(fits_tensor_core_experts(r), "tensor-core experts: K ", r.W.in,
                    " must be a multiple of 32, the scales E8M0 and the device a Hopper (sm_90a)");
  if (r.T == 0 || r.rows == 0) return;
  Grouping g{};
  group_rows(r, scratch, g, stream_, kBM);
  const dim3 grid{unsigned((r.rows + kBN - 1) / kBN), unsigned(row_tile_count(r, kBM))};
  const size_t smem = smem_bytes(r.W.in);
  allow_shared_memory(reinterpret_cast<const void*>(experts_fp8_kernel), smem, "tensor-core experts");
  launch(experts_fp8_kernel, grid, kThreads, smem, stream_, r, x, sx, g);
  DSV4_CUDA_LAUNCHED("linear (experts on the FP8 tensor cores)");
}

}  // namespace dsv4::cuda
