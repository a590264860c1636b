#include "core/replace_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include "core/error.h"

namespace dsv4 {

void replace_file(const std::filesystem::path& path, const std::function<void(const std::filesystem::path& tmp)>& write) {
  const std::filesystem::path tmp = path.string() + fmt::format(".{}.tmp", ::getpid());
  try {
    write(tmp);
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) fail(ErrorCode::invalid_input, "{}: cannot rename {} to it: {}", path.string(), tmp.string(), ec.message());
  } catch (...) {
    std::error_code ignored;  // the error being thrown is the one to report
    std::filesystem::remove(tmp, ignored);
    throw;
  }
}

}  // namespace dsv4
