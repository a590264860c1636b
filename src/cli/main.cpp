// dsv4: the command-line face. Subcommands register themselves (command.h); this file parses,
// dispatches, and maps dsv4::Error codes to exit codes.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

#include "cli/command.h"
#include "core/error.h"

namespace dsv4::cli {

static std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}

bool register_command(Command command) {
  registry().push_back(std::move(command));
  return true;
}

static int exit_code(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_input: return 2;
    case ErrorCode::not_found: return 3;
    case ErrorCode::unsupported: return 4;
    case ErrorCode::out_of_memory: return 5;
    case ErrorCode::unavailable: return 6;
    case ErrorCode::internal: return 70;
  }
  return 1;
}

}  // namespace dsv4::cli

int main(int argc, char** argv) {
  using namespace dsv4::cli;
  CLI::App app{"dsv4: DeepSeek V4 inference engine"};
  app.require_subcommand(1);
  auto commands = registry();
  std::sort(commands.begin(), commands.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> runners;
  for (auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.help);
    runners[sub] = command.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const dsv4::Error& e) {
    fmt::print(stderr, "dsv4: error: {}\n", e.what());
    return exit_code(e.code());
  } catch (const std::exception& e) {
    fmt::print(stderr, "dsv4: internal error: {}\n", e.what());
    return 70;
  }
  return 1;
}
