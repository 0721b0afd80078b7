#pragma once
// Each subcommand's registration, by group: cmd_train.cpp (train, uptrain, sweep, plot),
// cmd_inspect.cpp (eval, sample, inspect, bench), cmd_convert.cpp, cmd_formats.cpp (import,
// export), cmd_data.cpp (prepare). cli.cpp lists them in the order `tapelm --help` shows.
#include "train/cli/cli.h"

namespace tapelm::cli {

Command train_command(CLI::App& app, const int& threads);
Command uptrain_command(CLI::App& app, const int& threads);
Command sweep_command(CLI::App& app);
Command plot_command(CLI::App& app);
Command eval_command(CLI::App& app);
Command sample_command(CLI::App& app);
Command inspect_command(CLI::App& app);
Command bench_command(CLI::App& app);
Command convert_command(CLI::App& app);
Command export_command(CLI::App& app);
Command import_command(CLI::App& app);
Command prepare_command(CLI::App& app);

}  // namespace tapelm::cli
