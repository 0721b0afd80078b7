#include "train/cli/cli.h"

#include "train/cli/commands.h"

namespace tapelm::cli {

std::vector<Command> add_commands(CLI::App& app, const int& threads) {
  return {train_command(app, threads),   eval_command(app),   sample_command(app), convert_command(app),
          uptrain_command(app, threads), sweep_command(app),  plot_command(app),   inspect_command(app),
          prepare_command(app),          export_command(app), import_command(app), bench_command(app)};
}

}  // namespace tapelm::cli
