#include "train/cli/common.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <limits>
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
    if (item.empty()) throw Error(ErrorKind::usage, flag + ": empty item in \"" + cut_for_message(s, 80) + "\"");
    out.push_back(item);
  }
  if (out.empty()) throw Error(ErrorKind::usage, flag + ": no items");
  // getline drops a trailing empty item: "2,2," is refused as ",2" is
  if (s.back() == ',') throw Error(ErrorKind::usage, flag + ": empty item in \"" + cut_for_message(s, 80) + "\"");
  return out;
}

std::vector<int64_t> parse_counts(const std::string& s, const std::string& flag, const std::string& what, int64_t most) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(s, flag)) {
    // digits alone: stoll's leading blanks and sign are not part of a count ("2 " and " 2" alike)
    int64_t v = 0;
    bool ok = !item.empty() && item.size() <= 18;  // 18 digits: below 2^63, stoll cannot throw
    for (const char ch : item) ok = ok && ch >= '0' && ch <= '9';
    if (ok) v = std::stoll(item);
    if (!ok || v <= 0 || v > most)
      throw Error(ErrorKind::usage, flag + ": \"" + cut_for_message(item) + "\" is not " + what + " (1 to " + std::to_string(most) + ")");
    out.push_back(v);
  }
  return out;
}

namespace {

// "1e+308"-free: the shortest text of a bound
std::string bound_text(double v) {
  if (std::isinf(v)) return v > 0 ? "infinity" : "-infinity";
  std::ostringstream o;
  o << std::setprecision(6) << v;
  return o.str();
}

}  // namespace

CLI::Validator number_in(double lo, double hi, bool lo_open) {
  std::string desc = hi == std::numeric_limits<double>::infinity() ? (lo_open ? "> " : ">= ") + bound_text(lo)
                                                                  : (lo_open ? "(" : "[") + bound_text(lo) + ", " + bound_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, lo_open](std::string& text) -> std::string {
        const char* b = text.c_str();
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(b, &end);
        const bool number = end != b && *end == '\0' && !std::isspace(static_cast<unsigned char>(*b));
        if (!number || !std::isfinite(v) || v < lo || (lo_open && v == lo) || v > hi) {
          std::string range = hi == std::numeric_limits<double>::infinity() ? (lo_open ? "greater than " : "at least ") + bound_text(lo)
                                                                            : "from " + bound_text(lo) + (lo_open ? " (excluded)" : "") + " to " + bound_text(hi);
          return "\"" + cut_for_message(text, 40) + "\" is not a finite number " + range;
        }
        return {};
      },
      desc);
}

CLI::Validator count_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        bool ok = !text.empty() && text.size() <= 18;  // a sign and 17 digits, or 18: stoll cannot throw
        for (size_t i = 0; i < text.size(); i++) ok = ok && ((text[i] >= '0' && text[i] <= '9') || (i == 0 && text[i] == '-' && text.size() > 1));
        const int64_t v = ok ? std::stoll(text) : 0;
        if (!ok || v < lo || v > hi) return "\"" + cut_for_message(text, 40) + "\" is not a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
        return {};
      },
      "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
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
    "linear weights while decoding: f32; bf16 or f16 (16-bit values widened as they are read: exact for a "
    "16-bit file's); q8_0 (int8 rows with an f16 scale per 32, as llama.cpp's q8_0)";

void DistillArgs::add_flags(CLI::App& c, const std::string& what, bool with_attention) {
  c.add_flag("--distill", on, what);
  c.add_option("--distill-lambda", lambda, "with --distill: the weight of the source's soft targets (default " +
                                               std::to_string(kDefaultDistillLambda).substr(0, 4) + ")")
      ->check(number_in(0, 1));
  // the soft targets' term is scaled by T² (Hinton et al. 2015): at T 1e-30 it vanished from the
  // loss without a word, so T is bounded where the term still counts
  c.add_option("--distill-temperature", temperature, "with --distill: the softmax temperature T, " + distill_temperature_range())
      ->check(number_in(min_distill_temperature, max_distill_temperature));
  if (with_attention)
    c.add_option("--distill-attention", attention,
                 "with --distill: the weight beta of a per-layer term, beta·mean over layers of |o - t|²/|t|², each "
                 "block's attention output o against the source's t (default 0: off)")
        ->check(number_in(0));
}

double DistillArgs::lambda_for(const std::string& command) const {
  if ((lambda >= 0 || temperature != UptrainOptions{}.distill_temperature || attention > 0) && !on)
    throw Error(ErrorKind::usage, command + ": --distill-lambda, --distill-temperature and --distill-attention need --distill");
  return !on ? 0 : lambda >= 0 ? lambda : kDefaultDistillLambda;
}

}  // namespace tapelm::cli
