#pragma once
// Hugging Face transformers model directories (config.json + safetensors + tokenizer files), read
// and written for the architectures whose function tapelm's GPT computes exactly
// (docs/formats.md §3.9):
//
//   LlamaForCausalLM / MistralForCausalLM   rmsnorm + swiglu + rope (HF's rotate_half pairs
//                                           (j, j + hd/2) are tapelm's own), KV heads as given
//   Qwen2ForCausalLM                        the same with biases on q, k and v only (qkv_bias)
//   GPT2LMHeadModel                         layernorm + GELU (gelu_new: the tanh form) + learned
//                                           positions, biases everywhere, Conv1D weights (in, out)
//                                           and q|k|v fused in c_attn
//
// Any config field that would change the function in a way tapelm cannot compute (rope scaling,
// a sliding window shorter than the context, a head_dim other than hidden/heads, another
// activation, ...) is refused, naming the field and its value.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/config.h"
#include "train/formats/layout.h"
#include "train/formats/model_sink.h"
#include "train/formats/model_source.h"

namespace tapelm::hf {

/// What a config.json describes.
struct HfConfig {
  std::string architecture;  // "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "GPT2LMHeadModel"
  formats::Family family = formats::Family::llama;
  GPTConfig config;
  int64_t bos_token_id = -1, eos_token_id = -1;  // -1: not given
};

/// Reads config.json as the architecture it names (architectures[0], else model_type). A field of
/// the wrong type, a value tapelm cannot compute or an unknown architecture is a config Error
/// naming the file, the field and the value.
HfConfig read_config(const std::string& path);
/// Parses config.json's JSON text (`what` names it in errors).
HfConfig parse_config(const nlohmann::json& j, const std::string& what);

/// The architecture a tapelm config exports as, or a config Error starting with `what` naming
/// why there is none (e.g. a GQA model with learned positions: GPT-2 has one K/V head per head).
std::string architecture_for(const GPTConfig& c, const std::string& what);
/// The config.json of c as `architecture`, stored as torch dtype `dtype` ("float32", "bfloat16",
/// "float16"), with the tokenizer's BOS/EOS ids when >= 0.
nlohmann::ordered_json config_json(const GPTConfig& c, const std::string& architecture, const std::string& torch_dtype,
                                   int64_t bos, int64_t eos);

/// What import_model read.
struct ImportResult {
  HfConfig hf;
  std::vector<std::string> weight_files;  // the safetensors files, in order
  std::string dtypes;                     // the stored dtypes, e.g. "BF16" or "F32, BF16"
  std::string tokenizer_file;             // the tokenizer file stored with the weights, or "" for none
  WeightType kept = WeightType::f32;      // the checkpoint's weights: f32, bf16 or f16
};
/// Reads the model directory `dir` (config.json, model.safetensors or the shards its
/// model.safetensors.index.json names, and tokenizer.model when present) and writes a
/// weights-only checkpoint to out. Missing or extra tensors, a shape that disagrees with the
/// config, a shard named in the index but absent: a data Error naming the file and tensor, and
/// nothing is written.
ImportResult import_model(const std::string& dir, const std::string& out);
/// The directory opened and checked as import_model reads it, its tensors not yet read.
formats::OpenedModel open_model(const std::string& dir);

/// What export_model wrote.
struct ExportResult {
  std::string architecture;
  std::vector<std::string> files;  // every file written, in order
  std::string note;                // what the export could not carry, or "" (e.g. a char tokenizer)
};
/// Throws what write_model would refuse before writing (a dtype, an architecture HF has no config
/// for, an output that is not a directory), naming `what`.
void check_writable(const std::string& dir, const GPTConfig& c, WeightType dtype, const std::string& what);
/// Writes a model of config c as an HF model directory (as export_model), its parameters pushed
/// by fill in any order (a conversion streaming blocks) and written to their places in the shards
/// as they come. `what` names the model in refusals (an architecture HF has no form for).
ExportResult write_model(const std::string& dir, const GPTConfig& c, const Tokenizer* tok, WeightType dtype, const std::string& what,
                         const formats::SinkFill& fill, uint64_t max_shard_bytes = 5'000'000'000ULL);
/// Writes an opened model (formats::open_model: a checkpoint, or any model it reads), one tensor at a time, as an HF model directory: config.json, generation_config.json,
/// model.safetensors (dtype "f32", "bf16" or "f16"; shards of at most max_shard_bytes with
/// model.safetensors.index.json when larger, as transformers' save_pretrained does), and the
/// tokenizer's files. All files are committed together or none is.
ExportResult export_model(const formats::OpenedModel& m, const std::string& dir, WeightType dtype,
                          uint64_t max_shard_bytes = 5'000'000'000ULL);

}  // namespace tapelm::hf
