// tapelm: the command line. The subcommands' flags and what they run are in cli.cpp; this file
// parses, agrees across MPI ranks, dispatches, and turns errors into one line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>
#include <optional>
#include <sstream>

#include "autograd/cpu.h"
#include "autograd/runtime.h"
#include "nn/config.h"
#include "train/cli/cli.h"
#include "train/dist.h"
#include "train/train_config.h"

using namespace tapelm;

namespace {

/// A flag that cannot be parsed as one line: CLI11's first line, the value in it cut.
std::string parse_error_line(const CLI::ParseError& e) {
  const std::string what = e.what();
  return cut_for_message(what.substr(0, what.find('\n')), 200);
}

/// In a multi-rank job, one decision for the whole job: a rank that left alone would hang the
/// rest. Returns the exit code when the job must end here (help printed, or an error reported
/// by one rank), nothing when every rank goes on.
std::optional<int> agree_to_start(CLI::App& app, const std::optional<CLI::ParseError>& parse_error, const cli::Command* chosen) {
  std::string why;  // this rank's reason not to train, "" if none
  const bool multi_rank = chosen && chosen->multi_rank;
  // the ranks of one job must run the same command, or they would wait in different collectives
  std::string name = multi_rank ? chosen->app->get_name() : "", lead = name;
  dist::broadcast(lead);
  const bool help = parse_error && parse_error->get_exit_code() == 0;
  if (help) {
    std::ostringstream out, err;
    app.exit(*parse_error, out, err);
    why = out.str();
  } else if (parse_error) {
    why = parse_error_line(*parse_error);
  } else if (!multi_rank) {
    why = "only `tapelm train` and `tapelm uptrain` run on more than one MPI rank (this job has " + std::to_string(dist::size()) + ")";
  } else if (name != lead && !lead.empty()) {
    why = "it runs `tapelm " + name + "` where rank 0 runs `tapelm " + lead + "`: every rank of a job runs the same command";
  }
  try {
    dist::agree(why);
  } catch (const dist::AgreedError& e) {
    if (e.print_here && help) std::fputs(why.c_str(), stdout);
    else if (e.print_here) std::fprintf(stderr, "tapelm: error: %s\n", e.what());
    return help ? 0 : 1;
  }
  return std::nullopt;
}

/// Reports an error as one line; a multi-rank job is ended, as the other ranks may be waiting in a collective.
int fail(const char* what) {
  std::fprintf(stderr, "tapelm: error: %s%s\n", dist::rank_prefix().c_str(), what);
  if (dist::multi()) dist::abort_job(1);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Before MPI and before any work: may re-execute this program with better BLAS kernels.
  try {
    guard_blas_core(argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "tapelm: error: %s\n", e.what());
    return 1;
  }
  dist::Session mpi(&argc, &argv);  // initialises MPI only under an MPI launcher
  CLI::App app{"tapelm: train small GPT language models with MHA, GQA or MQA attention"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  int threads = 0;
  app.add_option("--threads", threads, "threads for kernels and BLAS (0: all cores)")
      ->check(CLI::Range(0, static_cast<int>(max_threads)));
  const std::vector<cli::Command> commands = cli::add_commands(app, threads);

  std::optional<CLI::ParseError> parse_error;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (!dist::multi() && e.get_exit_code() == 0) return app.exit(e);  // --help
    if (!dist::multi()) {
      std::fprintf(stderr, "tapelm: error: %s\n", parse_error_line(e).c_str());
      return 1;
    }
    parse_error = e;
  }
  if (dist::multi()) {
    const cli::Command* chosen = nullptr;
    for (const cli::Command& c : commands)
      if (!parse_error && *c.app) chosen = &c;
    if (auto code = agree_to_start(app, parse_error, chosen)) return *code;
  }
  try {
    set_num_threads(threads);
    for (const cli::Command& c : commands)
      if (*c.app) return c.run();
  } catch (const dist::AgreedError& e) {  // every rank has it; one reports
    if (e.print_here) std::fprintf(stderr, "tapelm: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {  // the memory checks before the work undercounted, or others took it
    return fail("out of memory: an allocation failed (less memory free than the check before the work counted)");
  } catch (const std::exception& e) {  // tapelm's Error, a library's error, or a broken invariant
    return fail(e.what());
  }
  return 0;
}
