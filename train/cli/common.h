#pragma once
// What the subcommands share: registering a command over its Args, list and seed flags, the
// precision and KV-cache flags' names and help, and --distill's settings. Each command group
// (train/cli/cmd_*.cpp) is flags -> one library call -> print.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/quant.h"
#include "train/cli/cli.h"
#include "train/study/uptrain.h"

namespace tapelm::cli {

/// Registers a subcommand whose flags fill an Args (starting as `init`) held by the command itself.
template <typename Args>
Command command(CLI::App& app, const char* name, const std::string& help, void (*flags)(CLI::App&, Args&), int (*run)(const Args&),
                Args init = {}) {
  auto args = std::make_shared<Args>(std::move(init));
  CLI::App* sub = app.add_subcommand(name, help);
  flags(*sub, *args);
  return {sub, [args, run] { return run(*args); }};
}

/// Seeds follow the config's rule (TrainConfig's max_seed): 0 to 2^63 - 1.
const CLI::Range& seed_range();
/// "a,b,c" -> {a, b, c}; an empty item is a usage error naming the flag.
std::vector<std::string> split_list(const std::string& s, const std::string& flag);
/// "4,2,2,1" -> {4, 2, 2, 1}: each item digits alone, 1 to `most`; anything else (a sign, a blank,
/// an empty item, a trailing comma) is a usage Error naming the flag and the item, saying it is not
/// `what` ("a positive count of key/value heads").
std::vector<int64_t> parse_counts(const std::string& s, const std::string& flag, const std::string& what, int64_t most);
/// A finite number from lo to hi (hi infinite: no upper bound; lo_open: lo itself excluded): NaN,
/// infinities and text are refused, and the message states the bounds as people write them (CLI11's
/// PositiveNumber echoed a 309-digit bound).
CLI::Validator number_in(double lo, double hi = std::numeric_limits<double>::infinity(), bool lo_open = false);
/// A whole number from lo to hi, digits alone (an optional leading minus).
CLI::Validator count_in(int64_t lo, int64_t hi);
/// "llama2c, hf, gguf".
std::string format_list();

/// --precision's help; its values are enum_names<Precision>().
extern const char* const precision_help;
/// The one-line refusal of a precision this machine cannot run, before any work is done.
void check_precision_runs(Precision p);
/// --kv-cache's and decoding --weights' help; --kv-cache's values are enum_names<KvType>().
extern const char* const kv_cache_help;
extern const char* const weights_help;

/// --distill and its settings, as uptrain and sweep take them.
struct DistillArgs {
  bool on = false;
  double lambda = -1;  // not given
  double temperature = UptrainOptions{}.distill_temperature;
  double attention = 0;
  /// with_attention: also --distill-attention (uptrain)
  void add_flags(CLI::App& c, const std::string& what, bool with_attention = false);
  /// λ: 0 without --distill; the settings without --distill are a usage Error.
  double lambda_for(const std::string& command) const;
};

}  // namespace tapelm::cli
