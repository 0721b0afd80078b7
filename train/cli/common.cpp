#include "train/cli/common.h"

#include <sstream>

#include "autograd/error.h"
#include "train/formats/registry.h"
#include "train/study/uptrain.h"
#include "train/train_config.h"

namespace tapelm::cli {

const CLI::Range& seed_range() {
  static const CLI::Range r(uint64_t{0}, max_seed);
  return r;
}

std::vector<std::string> split_list(const std::string& s, const std::string& flag) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) throw Error(ErrorKind::usage, flag + ": empty item in \"" + s.substr(0, 80) + "\"");
    out.push_back(item);
  }
  if (out.empty()) throw Error(ErrorKind::usage, flag + ": no items");
  return out;
}

std::string format_list() {
  std::string out;
  for (const std::string& n : formats::model_format_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

const char* const precision_help =
    "products of the linear layers: f32, bf16 (bf16 inputs, f32 sums and outputs, as torch.autocast; needs AVX512-BF16), "
    "bf16-emulated (bf16's numbers on any CPU, no faster than f32); the same as --set precision=...";

void check_precision_runs(Precision p) {
  if (const std::string why = precision_unavailable(p); !why.empty()) throw Error(ErrorKind::usage, why);
}

const char* const kv_cache_help =
    "how the KV cache stores keys and values: f32, f16 or bf16 (half the bytes), q8 (q8_0 blocks of 32: 34 bytes per 32 values)";
const char* const weights_help =
    "linear weights while decoding: f32, or q8_0 (int8 rows with an f16 scale per 32, as llama.cpp's q8_0)";

void DistillArgs::add_flags(CLI::App& c, const std::string& what, bool with_attention) {
  c.add_flag("--distill", on, what);
  c.add_option("--distill-lambda", lambda, "with --distill: the weight of the source's soft targets (default " +
                                               std::to_string(kDefaultDistillLambda).substr(0, 4) + ")")
      ->check(CLI::Range(0.0, 1.0));
  c.add_option("--distill-temperature", temperature, "with --distill: the softmax temperature T")->check(CLI::PositiveNumber);
  if (with_attention)
    c.add_option("--distill-attention", attention,
                 "with --distill: the weight beta of a per-layer term, beta·mean over layers of |o - t|²/|t|², each "
                 "block's attention output o against the source's t (default 0: off)")
        ->check(CLI::NonNegativeNumber);
}

double DistillArgs::lambda_for(const std::string& command) const {
  if ((lambda >= 0 || temperature != UptrainOptions{}.distill_temperature || attention > 0) && !on)
    throw Error(ErrorKind::usage, command + ": --distill-lambda, --distill-temperature and --distill-attention need --distill");
  return !on ? 0 : lambda >= 0 ? lambda : kDefaultDistillLambda;
}

}  // namespace tapelm::cli
