#include "train/study/convert_model.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "train/eval.h"
#include "train/formats/checkpoint.h"

namespace tapelm {

Converted calibrate_and_convert(GPT& src, int64_t G, const Variant& v, uint64_t seed, const CalibrationSource& source) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::optional<Calibration> calib = calibration_for(src, G, v, source);
  Converted c;
  c.model = convert_kv_heads(src, G, {.variant = v, .seed = seed, .calib = calib ? &*calib : nullptr});
  c.calib_tokens = calib ? calib->tokens : 0;
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

ConvertModelResult convert_model(const ConvertRequest& r) {
  const Variant v{&method(r.method), parse_grouping(r.grouping)};
  LoadedModel l = load_model(r.from);
  GPT& src = *l.model;
  ConvertModelResult out;
  out.kv_heads_from = src.config().n_kv_head;
  CalibrationSource cs{.tokens = r.calib_tokens, .seed = r.seed, .what = r.calib};
  if (conversion_calibrates(out.kv_heads_from, r.kv_heads, v)) {
    if (r.calib.empty()) throw Error(ErrorKind::usage, "--calib: converting by " + v.name() + " needs calibration data");
    // Text and corpora calibrate on their train split; token and parity files on all they hold.
    const EvalData data = load_eval_data(r.calib, "train", src.config(), l.tok ? &*l.tok : nullptr);
    cs.ids = data.ids;
    for (const auto& b : data.ready) cs.batches.push_back(b.first);
  }
  out.converted = calibrate_and_convert(src, r.kv_heads, v, r.seed, cs);
  write_converted(r.out, *out.converted.model, l.tok ? &*l.tok : nullptr,
                  nlohmann::json{{"kv_heads_from", out.kv_heads_from}, {"kv_heads", r.kv_heads}, {"method", r.method}, {"grouping", r.grouping}}
                      .dump());
  return out;
}

}  // namespace tapelm
