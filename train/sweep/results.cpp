#include "train/sweep/results.h"

namespace tapelm {

namespace {

const std::string step_key = "decode_ms_per_token_step_b", sample_key = "decode_ms_per_sample_b",
                  q1_key = "decode_ms_per_sample_q1_b", q3_key = "decode_ms_per_sample_q3_b", runs_key = "decode_runs_b";

}  // namespace

nlohmann::json decode_times_to_json(const DecodeTimes& d) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [b, t] : d) {
    j[step_key + std::to_string(b)] = t.ms_per_token_step;
    j[sample_key + std::to_string(b)] = t.ms_per_sample;
    if (t.runs > 0) {
      j[q1_key + std::to_string(b)] = t.sample_q1;
      j[q3_key + std::to_string(b)] = t.sample_q3;
      j[runs_key + std::to_string(b)] = t.runs;
    }
  }
  return j;
}

DecodeTimes decode_times_from_json(const nlohmann::json& j) {
  DecodeTimes d;
  for (const auto& [k, v] : j.items()) {
    if (k.starts_with(step_key)) d[std::stoll(k.substr(step_key.size()))].ms_per_token_step = v.get<double>();
    else if (k.starts_with(sample_key)) d[std::stoll(k.substr(sample_key.size()))].ms_per_sample = v.get<double>();
    else if (k.starts_with(q1_key)) d[std::stoll(k.substr(q1_key.size()))].sample_q1 = v.get<double>();
    else if (k.starts_with(q3_key)) d[std::stoll(k.substr(q3_key.size()))].sample_q3 = v.get<double>();
    else if (k.starts_with(runs_key)) d[std::stoll(k.substr(runs_key.size()))].runs = v.get<int>();
  }
  return d;
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
  j.update(decode_times_to_json(decode));
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
            j.at("steps").get<int64_t>()};
  r.schedule = j.at("schedule").get<std::string>();
  r.val_loss = j.at("val_loss").get<double>();
  if (j.at("loss_before").is_number()) r.loss_before = j["loss_before"].get<double>();
  r.perplexity = j.at("perplexity").get<double>();
  r.train_seconds = j.at("train_seconds").get<double>();
  if (j.contains("convert_seconds")) r.convert_seconds = j["convert_seconds"].get<double>();
  r.params = j.at("params").get<int64_t>();
  r.forward_flops_per_token = j.at("forward_flops_per_token").get<double>();
  r.kv_cache_bytes_per_token = j.at("kv_cache_bytes_per_token").get<int64_t>();
  r.decode = decode_times_from_json(j);
  return r;
}

}  // namespace tapelm
