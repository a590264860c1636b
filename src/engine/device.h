// Choosing the backend at run time (--device cpu|cuda).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace dsv4::engine {

// "cpu", or "cuda" when this build has the CUDA backend and the machine a GPU; a clear error
// otherwise.
std::unique_ptr<Backend> make_backend(const std::string& device, Numerics numerics);

// The hardware behind a device, for benchmark records: the GPU's name, or the CPU model and
// its thread count.
std::string device_name(const std::string& device);

}  // namespace dsv4::engine
