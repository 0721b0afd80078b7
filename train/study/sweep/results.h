#pragma once
// What one cell of the study measured, as stored in cells/<id>.json: a re-run reads these files to
// skip finished cells, so their keys and values are a format (an old sweep directory resumes).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/study/sweep/plan.h"

namespace tapelm {

/// Greedy KV-cache decoding at one batch size: the median over runs, and the interquartile range
/// of the per-sample times (0 and runs 0 in files written before the spread was kept).
struct DecodeTime {
  double ms_per_token_step = 0;  // the whole batch, one position
  double ms_per_sample = 0;      // one sequence (prefill and generation): batch time / batch
  double sample_q1 = 0, sample_q3 = 0;  // first and third quartiles of ms_per_sample's runs
  int runs = 0;
};

/// Decoding times by batch size, as decode/kv<KV>.json and the cell files store them
/// (decode_ms_per_token_step_b<B>, decode_ms_per_sample_b<B>).
using DecodeTimes = std::map<int64_t, DecodeTime>;

/// The decode_ms_* keys of the times (prefix "decode_"; "decode_long_" for the long context's).
nlohmann::json decode_times_to_json(const DecodeTimes& d, const std::string& prefix = "decode_");
/// The <prefix>ms_* keys of j (other keys are ignored).
DecodeTimes decode_times_from_json(const nlohmann::json& j, const std::string& prefix = "decode_");

/// Decoding times of one model shape: at the trained context T by batch size, and for a RoPE
/// model also at 4·T (positions it was not trained on: a speed measurement only).
struct ShapeDecodeTimes {
  DecodeTimes decode;
  int64_t long_context = 0;  // 0: not timed (learned positions stop at T)
  DecodeTimes decode_long;   // at long_context, by batch size
  /// At the serving batch with the smallest KV cache that costs no quality ("q8" when the head
  /// dimension is a multiple of 32, else "f16"; "" in older sweeps' files, not timed).
  std::string lowkv_cache;
  DecodeTimes decode_lowkv;
  /// What the times depend on beyond the model: "2 threads, OpenMP wait: <how idle threads wait>"
  /// (a passive wait doubled batch-1 decoding on the tiny study); "" in older sweeps' files.
  std::string timed_with;
  nlohmann::json to_json() const;
  static ShapeDecodeTimes from_json(const nlohmann::json& j);
};

struct CellResult {
  Cell cell;
  std::string schedule;              // rewarm (uptraining) | cosine (training)
  double val_loss = 0;               // the val split (its first final_eval_tokens when set)
  /// By KV-cache type ("f16", "q8"): the val loss with K and V rounded as that cache stores them
  /// (q8 only when the head dimension is a multiple of 32; none in older sweeps' files).
  std::map<std::string, double> val_loss_kv;
  std::optional<double> loss_before;  // converted, before uptraining (none for trained cells)
  double perplexity = 0;
  double train_seconds = 0;
  std::optional<double> convert_seconds;  // converted cells: conversion wall time, calibration included
  /// A per-layer conversion's key/value heads, layer by layer (empty: every layer has cell.kv).
  std::vector<int64_t> kv_layers;
  int64_t params = 0;
  double forward_flops_per_token = 0;
  int64_t kv_cache_bytes_per_token = 0;
  DecodeTimes decode;
  int64_t decode_long_context = 0;  // see ShapeDecodeTimes
  DecodeTimes decode_long;
  std::string decode_lowkv_cache;   // see ShapeDecodeTimes
  DecodeTimes decode_lowkv;
  /// The decoding times above as their shape's, and from them.
  std::string decode_timed_with;    // see ShapeDecodeTimes
  ShapeDecodeTimes decode_times() const {
    return {decode, decode_long_context, decode_long, decode_lowkv_cache, decode_lowkv, decode_timed_with};
  }
  void set_decode_times(const ShapeDecodeTimes& t) {
    decode = t.decode;
    decode_long_context = t.long_context;
    decode_long = t.decode_long;
    decode_lowkv_cache = t.lowkv_cache;
    decode_lowkv = t.decode_lowkv;
    decode_timed_with = t.timed_with;
  }

  /// The cell file's object.
  nlohmann::json to_json() const;
  /// Reads a cell file's object; throws nlohmann::json's exceptions when a key is missing.
  static CellResult from_json(const nlohmann::json& j);
};

}  // namespace tapelm
