#pragma once
// The subcommands behind the `tapelm` binary. Each has a setup function that registers its flags
// with CLI11 (enumerated values checked there) and a run function over library calls, side by
// side in its group's file (train/cli/commands.h); main.cpp parses and dispatches.
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace tapelm::cli {

/// A subcommand: the CLI11 app holding its flags, and what runs when it was given (an exit code).
/// multi_rank: it runs as one job under mpirun (train, uptrain); the others refuse more than one rank.
struct Command {
  CLI::App* app;
  std::function<int()> run;
  bool multi_rank = false;
};

/// Registers every subcommand on `app`, in the order `tapelm --help` lists them. `threads` is the
/// global --threads flag's value, read when a command runs.
std::vector<Command> add_commands(CLI::App& app, const int& threads);

}  // namespace tapelm::cli
