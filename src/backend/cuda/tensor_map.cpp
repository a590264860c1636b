#include "backend/cuda/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "backend/cuda/check.h"

namespace dsv4::cuda {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    DSV4_CUDA_REQUIRE(e == cudaSuccess && found == cudaDriverEntryPointSuccess && fn != nullptr,
                      "the driver has no cuTensorMapEncodeTiled (CUDA 12 or later): ", cudaGetErrorString(e));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

CUtensorMap swizzled_byte_tiles(const void* base, int64_t rows, int64_t cols, int box_rows, const char* what) {
  DSV4_CUDA_REQUIRE(cols % 16 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0 && rows > 0 && box_rows > 0 &&
                        box_rows <= 256,
                    what, ": a tensor map needs 16-byte aligned rows (", cols, " bytes) and 1 to 256 rows a box");
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols)};  // bytes from one row to the next
  const cuuint32_t box[2] = {128, cuuint32_t(box_rows)}, steps[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                                    steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DSV4_CUDA_REQUIRE(r == CUDA_SUCCESS, what, ": cuTensorMapEncodeTiled failed (", int(r), ") for ", rows, " rows of ",
                    cols, " bytes");
  return map;
}

}  // namespace dsv4::cuda
