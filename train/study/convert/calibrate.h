#pragma once
// Calibration: the activation statistics the calibrated conversions (and similar grouping) read,
// and the one place that decides whether a conversion calibrates and on which windows. The CLI's
// convert, uptrain and the sweep all come here.
#include <optional>
#include <string>
#include <vector>

#include "data/shards.h"
#include "nn/gpt.h"
#include "train/study/convert/linalg.h"
#include "train/study/convert/methods.h"

namespace tapelm {

/// Second moments of every layer's attention input on calibration tokens: per layer the mean over
/// tokens of x̃ x̃ᵀ with x̃ = [ln1(x); 1] ((d+1) × (d+1); the 1 carries the biases). Every
/// quantity the methods need — Gram matrices of K, V and Q activations of any heads — is
/// W̃_a Σ W̃_bᵀ for row blocks W̃ = [W | b] of the projections, so this is all they keep.
struct Calibration {
  std::vector<la::Mat> gram;
  int64_t tokens = 0;
};

/// Runs the model (eval mode, no tape) on the batches of ids and accumulates the layers' Σ.
Calibration calibrate(GPT& model, const std::vector<Index>& batches);

/// Adds Σ_t x̃_t x̃_tᵀ of the rows of x [N, d] (x̃ = [x; 1]) to g, all but its last row (which
/// finish_gram mirrors from the last column), as calibrate does per batch and layer; finish_gram then averages.
void accumulate_gram(la::Mat& g, const Tensor& x);
/// Mirrors g's last column into its last row and divides by the token count.
void finish_gram(la::Mat& g, int64_t tokens);

/// Tokens a calibration batch holds at most (unless one window is longer).
constexpr int64_t kCalibrationForwardTokens = 4096;
/// `tokens` tokens of `ids` as windows of T at seeded random starts, batches of up to 32 windows
/// and kCalibrationForwardTokens tokens.
/// Data shorter than one window or than `tokens` -> a data Error naming `what`.
std::vector<Index> calibration_batches(const TokenSeq& ids, int64_t T, int64_t tokens, uint64_t seed,
                                       const std::string& what);

/// What a conversion may calibrate on: ids to draw windows from, or batches given whole (a parity
/// file's), and how many tokens at which seed.
struct CalibrationSource {
  TokenSeq ids;
  std::vector<Index> batches;  // when not empty: used as they are, `ids` ignored
  int64_t tokens = 16384;
  uint64_t seed = 0;
  std::string what;            // names the data in errors
};

/// The batches a calibration runs: source.batches as given, else windows of T drawn from source.ids.
std::vector<Index> calibration_windows(const CalibrationSource& source, int64_t T);

/// True when converting a model with `kv` kv heads to G by `v` reads calibration activations:
/// the variant needs them and the groups have more than one member.
bool conversion_calibrates(int64_t kv, int64_t G, const Variant& v);
/// The same for a model of config `from` converted to `to` (layer by layer): true when any layer does.
bool conversion_calibrates(const GPTConfig& from, const GPTConfig& to, const Variant& v);

/// The calibration converting `model` to G kv heads by `v` needs, from `source`; nullopt when
/// conversion_calibrates is false.
std::optional<Calibration> calibration_for(GPT& model, int64_t G, const Variant& v, const CalibrationSource& source);
/// The same for a conversion to the config `to` (converted_config, convert.h).
std::optional<Calibration> calibration_for(GPT& model, const GPTConfig& to, const Variant& v, const CalibrationSource& source);

}  // namespace tapelm
