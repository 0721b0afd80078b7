#pragma once
// Converting a model end to end, as `tapelm convert`, uptraining and the sweep do it: calibrate
// when the variant needs it, convert, and (convert_model) write the result beside its source.
#include <cstdint>
#include <memory>
#include <string>

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
/// Calibrates src on `source` when converting to G kv heads by v needs it, then converts.
Converted calibrate_and_convert(GPT& src, int64_t G, const Variant& v, uint64_t seed, const CalibrationSource& source);

/// What `tapelm convert` does.
struct ConvertRequest {
  std::string from, out;
  int64_t kv_heads = 0;
  std::string method = "mean", grouping = "contiguous";
  std::string calib;            // calibration data, as eval reads it (text: its train split); needed by calibrated variants
  int64_t calib_tokens = 16384;
  uint64_t seed = 0;            // --method random and the calibration windows
};
struct ConvertModelResult {
  int64_t kv_heads_from = 0;
  Converted converted;
};
/// Reads the checkpoint, converts it and writes the result with the source's tokenizer and a
/// converted_from note; a calibrated variant without calibration data is a usage Error.
ConvertModelResult convert_model(const ConvertRequest& r);

}  // namespace tapelm
