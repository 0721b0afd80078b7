#include "train/study/sweep/results.h"

#include <optional>

namespace tapelm {

namespace {

const char* const step_key = "ms_per_token_step_b";
const char* const sample_key = "ms_per_sample_b";
const char* const q1_key = "ms_per_sample_q1_b";
const char* const q3_key = "ms_per_sample_q3_b";
const char* const runs_key = "runs_b";

/// The batch size of key = <prefix><name><digits>; nothing when the key is another.
std::optional<int64_t> batch_of(const std::string& key, const std::string& prefix, const char* name) {
  const std::string head = prefix + name;
  if (!key.starts_with(head) || key.size() == head.size() || key.size() - head.size() > 9) return std::nullopt;
  int64_t b = 0;
  for (size_t i = head.size(); i < key.size(); i++) {
    if (key[i] < '0' || key[i] > '9') return std::nullopt;
    b = 10 * b + (key[i] - '0');
  }
  return b;
}

}  // namespace

nlohmann::json decode_times_to_json(const DecodeTimes& d, const std::string& prefix) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [b, t] : d) {
    const std::string n = std::to_string(b);
    j[prefix + step_key + n] = t.ms_per_token_step;
    j[prefix + sample_key + n] = t.ms_per_sample;
    if (t.runs > 0) {
      j[prefix + q1_key + n] = t.sample_q1;
      j[prefix + q3_key + n] = t.sample_q3;
      j[prefix + runs_key + n] = t.runs;
    }
  }
  return j;
}

DecodeTimes decode_times_from_json(const nlohmann::json& j, const std::string& prefix) {
  DecodeTimes d;
  for (const auto& [k, v] : j.items()) {
    if (auto b = batch_of(k, prefix, step_key)) d[*b].ms_per_token_step = v.get<double>();
    else if (auto b = batch_of(k, prefix, sample_key)) d[*b].ms_per_sample = v.get<double>();
    else if (auto b = batch_of(k, prefix, q1_key)) d[*b].sample_q1 = v.get<double>();
    else if (auto b = batch_of(k, prefix, q3_key)) d[*b].sample_q3 = v.get<double>();
    else if (auto b = batch_of(k, prefix, runs_key)) d[*b].runs = v.get<int>();
  }
  return d;
}

nlohmann::json ShapeDecodeTimes::to_json() const {
  nlohmann::json j = decode_times_to_json(decode);
  if (long_context > 0) {
    j["decode_long_context"] = long_context;
    j.update(decode_times_to_json(decode_long, "decode_long_"));
  }
  if (!lowkv_cache.empty()) {
    j["decode_lowkv_cache"] = lowkv_cache;
    j.update(decode_times_to_json(decode_lowkv, "decode_lowkv_"));
  }
  if (!timed_with.empty()) j["decode_timed_with"] = timed_with;
  return j;
}

ShapeDecodeTimes ShapeDecodeTimes::from_json(const nlohmann::json& j) {
  ShapeDecodeTimes s{.decode = decode_times_from_json(j)};
  if (j.contains("decode_long_context")) {
    s.long_context = j["decode_long_context"].get<int64_t>();
    s.decode_long = decode_times_from_json(j, "decode_long_");
  }
  if (j.contains("decode_lowkv_cache")) {
    s.lowkv_cache = j["decode_lowkv_cache"].get<std::string>();
    s.decode_lowkv = decode_times_from_json(j, "decode_lowkv_");
  }
  if (j.contains("decode_timed_with")) s.timed_with = j["decode_timed_with"].get<std::string>();
  return s;
}

nlohmann::json CellResult::to_json() const {
  nlohmann::json j{{"id", cell.id()},
                   {"kind", cell_kind_name(cell.kind)},
                   {"kv_heads", cell.kv},
                   {"method", cell.method_name()},
                   {"alpha", cell.alpha},
                   {"seed", cell.seed},
                   {"steps", cell.steps},
                   {"schedule", schedule},
                   {"val_loss", val_loss},
                   {"loss_before", loss_before ? nlohmann::json(*loss_before) : nlohmann::json()},
                   {"perplexity", perplexity},
                   {"train_seconds", train_seconds},
                   {"params", params},
                   {"forward_flops_per_token", forward_flops_per_token},
                   {"kv_cache_bytes_per_token", kv_cache_bytes_per_token}};
  if (convert_seconds) j["convert_seconds"] = *convert_seconds;  // absent from older sweeps' files
  if (cell.distill) j["distill"] = true;                         // absent: not distilled
  if (cell.trainable != Trainable::all) j["train"] = to_string(cell.trainable);  // absent: every parameter
  if (!kv_layers.empty()) j["kv_heads_per_layer"] = kv_layers;   // absent: every layer has kv_heads
  for (const auto& [type, loss] : val_loss_kv) j["val_loss_kv_" + type] = loss;
  j.update(decode_times().to_json());
  return j;
}

CellResult CellResult::from_json(const nlohmann::json& j) {
  CellResult r;
  const CellKind kind = parse_cell_kind(j.at("kind").get<std::string>());
  r.cell = {kind,
            j.at("kv_heads").get<int64_t>(),
            kind == CellKind::convert ? Variant::parse(j.at("method").get<std::string>()) : Variant{},
            j.at("alpha").get<double>(),
            j.at("seed").get<int>(),
            j.at("steps").get<int64_t>(),
            j.contains("distill") && j["distill"].get<bool>(),
            j.contains("train") ? enum_from_name<Trainable>(j["train"].get<std::string>(), "cell file key train") : Trainable::all};
  r.schedule = j.at("schedule").get<std::string>();
  r.val_loss = j.at("val_loss").get<double>();
  for (const char* type : {"f16", "bf16", "q8"})
    if (j.contains(std::string("val_loss_kv_") + type)) r.val_loss_kv[type] = j[std::string("val_loss_kv_") + type].get<double>();
  if (j.at("loss_before").is_number()) r.loss_before = j["loss_before"].get<double>();
  r.perplexity = j.at("perplexity").get<double>();
  r.train_seconds = j.at("train_seconds").get<double>();
  if (j.contains("convert_seconds")) r.convert_seconds = j["convert_seconds"].get<double>();
  if (j.contains("kv_heads_per_layer")) r.kv_layers = j["kv_heads_per_layer"].get<std::vector<int64_t>>();
  r.params = j.at("params").get<int64_t>();
  r.forward_flops_per_token = j.at("forward_flops_per_token").get<double>();
  r.kv_cache_bytes_per_token = j.at("kv_cache_bytes_per_token").get<int64_t>();
  r.set_decode_times(ShapeDecodeTimes::from_json(j));
  return r;
}

}  // namespace tapelm
