// convert: MHA/GQA to fewer key/value heads, one block at a time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "train/cli/commands.h"
#include "train/cli/common.h"
#include "train/formats/registry.h"
#include "data/outdir.h"
#include "train/study/convert/methods.h"
#include "train/study/convert_model.h"

namespace tapelm::cli {

namespace fs = std::filesystem;

namespace {

struct ConvertArgs {
  std::string from, method = "mean", out, grouping = "contiguous", calib, dtype, format = "tapelm", kv_heads;
  int64_t kv_budget = 0, calib_tokens = 16384;
  uint64_t seed = 0;
};

void convert_flags(CLI::App& c, ConvertArgs& a) {
  c.add_option("--from", a.from, "source model: a checkpoint, a Hugging Face directory or a GGUF file (read one block at a time)")
      ->required();
  CLI::Option* kv = c.add_option("--kv-heads", a.kv_heads, "new number of key/value heads (divides the old), or one per layer: 4,2,2,1");
  c.add_option("--kv-budget", a.kv_budget, "instead of --kv-heads: the key/value heads of all layers together, placed where converting "
                                           "a layer costs the most loss on the calibration windows (needs --calib)")
      ->excludes(kv)
      ->check(count_in(1, int64_t{1} << 20));
  c.add_option("--method", a.method, "conversion method")->check(CLI::IsMember(method_names()));
  c.add_option("--grouping", a.grouping, "contiguous, similar (similar K/V heads share a group) or per-layer (--kv-heads G: "
                                         "the budget of G in every layer, placed by the conversion error; see --kv-budget)")
      ->check(CLI::IsMember({"contiguous", "similar", "per-layer"}));
  c.add_option("--calib", a.calib,
               "calibration data for aligned, fit, aligned-fit and similar: what eval takes (text: its train split)");
  c.add_option("--calib-tokens", a.calib_tokens, "calibration tokens, drawn as seeded random windows");
  c.add_option("--out", a.out, "the converted model: a checkpoint, an HF directory or a GGUF file (--format)")->required();
  const std::vector<const formats::ModelFormat*>& rows = formats::writable_formats();
  std::vector<std::string> names;
  std::string format_help;
  for (const formats::ModelFormat* f : rows) {
    names.push_back(f->name);
    format_help += (format_help.empty() ? "" : ", ") + std::string(f->name) + " (" + f->what + ")";
  }
  c.add_option("--format", a.format, "what --out is (default tapelm): " + format_help)->check(CLI::IsMember(names));
  c.add_option("--dtype", a.dtype, "the weights' type (default: the source's 16-bit type, else f32); " + formats::describe_dtypes(rows))
      ->check(CLI::IsMember(formats::dtype_names(rows)));
  c.add_option("--seed", a.seed, "seed for --method random and the calibration windows")->check(seed_range());
}

int run_convert(const ConvertArgs& a) {
  refuse_outputs_over_inputs({{"--out", a.out}}, {{"--from", a.from}, {"--calib", a.calib}});
  if (a.kv_heads.empty() == (a.kv_budget == 0)) throw Error(ErrorKind::usage, "convert: give --kv-heads or --kv-budget");
  const ConvertModelResult r =
      convert_model({.from = a.from, .out = a.out, .kv_heads = a.kv_heads.empty() ? std::vector<int64_t>{} : parse_counts(a.kv_heads, "--kv-heads", "a positive count of key/value heads", int64_t{1} << 20),
                     .kv_budget = a.kv_budget, .variant = {&method(a.method), enum_from_name<Grouping>(a.grouping, "--grouping")}, .calib = a.calib, .calib_tokens = a.calib_tokens,
                     .seed = a.seed, .progress = true,
                     .dtype = a.dtype.empty() ? std::nullopt : std::optional(enum_from_name<WeightType>(a.dtype, "--dtype")), .format = a.format});
  std::string heads;
  for (int64_t k : r.kv_heads) heads += (heads.empty() ? "" : ",") + std::to_string(k);
  std::printf("converted %s: %ld -> %s kv heads%s by %s (%s groups%s) in %.2fs, written to %s (%s)\n", a.from.c_str(), (long)r.kv_heads_from,
              heads.c_str(), r.kv_heads.size() > 1 ? " (layer by layer)" : "", a.method.c_str(), a.grouping.c_str(),
              r.calib_tokens ? (", calibrated on " + std::to_string(r.calib_tokens) + " tokens").c_str() : "",
              r.seconds, a.out.c_str(), to_string(r.dtype).c_str());
  return 0;
}

}  // namespace

Command convert_command(CLI::App& app) {
  return command(app, "convert", "convert MHA/GQA to fewer key/value heads", convert_flags, run_convert);
}

}  // namespace tapelm::cli
