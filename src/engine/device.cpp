#include "engine/device.h"

#include <fstream>

#include "core/error.h"
#include "core/parallel.h"
#ifdef DSV4_HAVE_CUDA
#include "backend/cuda/cuda.h"
#endif

namespace dsv4::engine {

std::unique_ptr<Backend> make_backend(const std::string& device, Numerics numerics) {
  if (device == "cpu") return make_cpu_backend(numerics);
  if (device == "cuda") {
#ifdef DSV4_HAVE_CUDA
    if (cuda_device_count() == 0) fail(ErrorCode::unsupported, "--device cuda: no CUDA device on this machine");
    return make_cuda_backend(numerics);
#else
    fail(ErrorCode::unsupported, "--device cuda: this dsv4 was built without CUDA (cmake -DDSV4_CUDA=ON)");
#endif
  }
  fail(ErrorCode::invalid_input, "--device '{}': expected cpu or cuda", device);
}

std::string device_name(const std::string& device) {
#ifdef DSV4_HAVE_CUDA
  if (device == "cuda") return cuda_device_name();
#endif
  if (device != "cpu") return device;
  std::ifstream f("/proc/cpuinfo");
  std::string line, name = "cpu";
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      name = line.substr(line.find(':') + 2);
      break;
    }
  return name + ", " + std::to_string(n_threads()) + " threads";
}

}  // namespace dsv4::engine
