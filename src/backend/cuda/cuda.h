// The CUDA backend's public entry points (issue 4): the same op interface as the CPU reference
// (backend.h), run on the GPU. Only built with -DDSV4_CUDA=ON.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace dsv4 {

// A backend on the current CUDA device. Throws dsv4::Error (unsupported) when there is none.
std::unique_ptr<Backend> make_cuda_backend(Numerics numerics);

// The number of usable CUDA devices: 0 when there is no GPU or no driver. Never throws, so tests
// can ask it and skip.
int cuda_device_count();

// The name of the current CUDA device ("NVIDIA H200"); empty when there is none.
std::string cuda_device_name();

}  // namespace dsv4
