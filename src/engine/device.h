// Choosing the backend at run time (--device cpu|cuda).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace dsv4::engine {

// "cpu", or "cuda" when this build has the CUDA backend and the machine a GPU; a clear error
// otherwise.
std::unique_ptr<Backend> make_backend(const std::string& device, Numerics numerics);

}  // namespace dsv4::engine
