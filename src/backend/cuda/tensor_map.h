// Tensor maps: the descriptions of a global array that Hopper's tensor memory accelerator (TMA)
// copies tiles of into shared memory on one thread's request (cp.async.bulk.tensor), rows past the
// array's end filled with zeros. Made on the host by the driver's cuTensorMapEncodeTiled, reached
// through the runtime's entry-point query so the engine links no libcuda of its own.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace dsv4::cuda {

// The map of a row-major byte matrix of `rows` rows of `cols` bytes (cols a multiple of 16, base
// 16-byte aligned) read in boxes of box_rows × 128 bytes under the 128-byte swizzle that wgmma's
// K-major operands take (wgmma.cuh's swizzled: a box lands as rows of 128 bytes, chunk c of row r at
// 16 · (c ^ r % 8)). `what` names the operand in errors.
CUtensorMap swizzled_byte_tiles(const void* base, int64_t rows, int64_t cols, int box_rows, const char* what);

}  // namespace dsv4::cuda
