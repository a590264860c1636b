// The CLI's subcommand registry. Each src/cli/<name>.cpp defines one subcommand and registers it
// with a file-scope `const bool <name>_registered = register_command({...});`, so adding a
// subcommand touches no other file. The files are linked straight into the executable (not a
// library), so the registrations are never dropped by the linker. They are compiled in batches
// (a unity build, CMakeLists.txt), so their file-scope names must differ between files.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace dsv4::cli {

struct Command {
  std::string name;
  std::string help;
  // Declares the subcommand's options on `app` and returns the function that runs it (called
  // after parsing; returns the process exit code).
  std::function<std::function<int()>(CLI::App& app)> setup;
};

bool register_command(Command command);

}  // namespace dsv4::cli
