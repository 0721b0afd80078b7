#pragma once
// Converting a model end to end, as `tapelm convert`, uptraining and the sweep do it: calibrate
// when the variant needs it, convert, and (convert_model) write the result beside its source.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "train/study/convert/calibrate.h"
#include "train/study/convert/convert.h"

namespace tapelm {

/// A converted model and what making it took.
struct Converted {
  std::unique_ptr<GPT> model;
  int64_t calib_tokens = 0;  // 0: no calibration
  double seconds = 0;        // calibration included
};
/// Where a conversion puts the key/value heads: one count for every layer, one count per layer,
/// or (budget > 0) a total over the layers placed where the conversion error is largest (budget.h).
struct KvTarget {
  std::vector<int64_t> heads;
  int64_t budget = 0;
};
/// Mean next-token loss of m on calibration windows (each window predicts its own tokens 1 … T−1),
/// in eval mode: what a KV budget's allocation measures (budget.h).
double next_token_loss(GPT& m, const std::vector<Index>& windows);
/// The budget a conversion places: target.budget, or for grouping per-layer its one count in
/// every layer (G · n_layer); 0: none.
int64_t kv_budget_of(const KvTarget& target, const Variant& v, const GPTConfig& c);
/// Calibrates src on `source` when converting to the target by v needs it (a budget always does),
/// then converts.
Converted calibrate_and_convert(GPT& src, const KvTarget& target, const Variant& v, uint64_t seed, const CalibrationSource& source);
/// Every layer to G kv heads.
Converted calibrate_and_convert(GPT& src, int64_t G, const Variant& v, uint64_t seed, const CalibrationSource& source);
/// The model at `from` (a checkpoint, an HF directory or a GGUF file) converted to G kv heads in
/// every layer into a model in memory, read one block at a time as convert_model reads it: the
/// memory of the converted model, one source block and the calibration's hidden states, where
/// calibrate_and_convert holds the whole source beside its result. The result is
/// calibrate_and_convert's on the loaded source, bit for bit. A budget (grouping per-layer), which
/// measures every layer's conversion on the whole model, is an internal Error: load it instead.
/// With held_as, each block is narrowed as soon as it is filled (NarrowedBlocks, set as the
/// result's residency), so the float32 model is never whole: narrowed_values, what held_as is
/// expected to hold in 16 bits, is counted at 2 bytes in the memory check.
Converted convert_streamed_in_memory(const std::string& from, int64_t G, const Variant& v, uint64_t seed,
                                     const CalibrationSource& source, const NarrowedBlocks::HeldAs& held_as = nullptr,
                                     double narrowed_values = 0);

/// What `tapelm convert` does.
struct ConvertRequest {
  std::string from, out;        // from: a checkpoint, an HF directory or a GGUF file
  std::vector<int64_t> kv_heads;  // one count for every layer, or one per layer
  int64_t kv_budget = 0;        // instead: the kv heads of all layers together, placed by budget.h
  Variant variant;              // method and grouping (default: mean, contiguous)
  std::string calib;            // calibration data, as eval reads it (text: its train split); needed by calibrated variants
  int64_t calib_tokens = 16384;
  uint64_t seed = 0;            // --method random and the calibration windows
  bool progress = false;        // a line per block: times, calibration GFLOP/s, time left
  std::optional<WeightType> dtype;  // f32, bf16, f16 (gguf: q8_0 too); none: the source's 16-bit type, else f32
  std::string format;           // what is written: "tapelm" (or empty: a checkpoint), "hf" (a directory), "gguf"
};
struct ConvertModelResult {
  int64_t kv_heads_from = 0;
  std::vector<int64_t> kv_heads;  // the result's: one count, or one per layer
  int64_t calib_tokens = 0;     // 0: no calibration
  double seconds = 0;
  WeightType dtype = WeightType::f32;  // how the weights were written
};
/// Converts the model at r.from one block at a time — read block l, form its calibration second
/// moments from the hidden states of the calibration windows, convert its K/V, write it, run it
/// forward for block l + 1's inputs, free it — so that a model larger than memory converts in the
/// memory of one block and the hidden states. The result is bit for bit what
/// calibrate_and_convert gives on the whole model (convert_attention per layer, the same draws), and
/// is written with the source's tokenizer and a converted_from note. A calibrated variant without
/// calibration data is a usage Error; a conversion whose block and hidden states do not fit in
/// memory is refused before any work.
ConvertModelResult convert_model(const ConvertRequest& r);

}  // namespace tapelm
