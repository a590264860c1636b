// Replacing a file so that a crash leaves the old file or the new one, never half of one.
#pragma once

#include <filesystem>
#include <functional>

namespace dsv4 {

// `write` writes the whole new file to the temporary path it is given (next to `path`, named with
// the process id so that two processes replacing one path never share a temporary), then the
// temporary is renamed over `path`. If `write` or the rename throws, the temporary is removed and
// the error passed on. Durability is `write`'s part: a writer that must survive power loss syncs.
void replace_file(const std::filesystem::path& path, const std::function<void(const std::filesystem::path& tmp)>& write);

}  // namespace dsv4
