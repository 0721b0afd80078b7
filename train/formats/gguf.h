#pragma once
// GGUF (llama.cpp's model file, version 3), written for the architectures llama.cpp runs with the
// function tapelm's GPT computes (docs/formats.md §3.10):
//
//   llama   rmsnorm + swiglu + rope; q/k rows permuted from tapelm's rotate_half pairs
//           (j, j + hd/2) to llama.cpp's interleaved ones (2j, 2j + 1), as its converter does
//   qwen2   the same with biases on q, k and v only; llama.cpp rotates qwen2 as rotate_half: no
//           permutation
//   gpt2    layernorm + the tanh GELU + learned positions, biases everywhere, q|k|v fused
//
// with the tokenizer as metadata: sentencepiece as llama.cpp's "llama" vocabulary (pieces,
// scores, token types), byte-level BPE as its "gpt2" vocabulary (tokens, merges, and the
// pre-tokenizer named as llama.cpp knows it: gpt-2, llama-bpe, qwen2, smollm).
#include <cstdint>
#include <string>
#include <vector>

#include "train/formats/model_sink.h"
#include "train/formats/model_source.h"

namespace tapelm {
class GPT;
}

namespace tapelm::gguf {

/// What export_model wrote.
struct ExportResult {
  std::string architecture;  // "llama", "qwen2", "gpt2"
  std::string tokenizer;     // "llama" (sentencepiece) or "gpt2" (byte-level BPE)
  int64_t tensors = 0;
  uint64_t bytes = 0;
};

/// Throws what write_model would refuse before writing (a dtype, a family or a tokenizer llama.cpp
/// has no form for), naming `what`.
void check_writable(const std::string& out, const GPTConfig& c, const Tokenizer* tok, WeightType dtype, const std::string& what);
/// Writes a model of config c and its tokenizer as one GGUF file (as export_model), its parameters
/// pushed by fill in any order and written to their places as they come; `what` names the model
/// in refusals and general.name is its stem.
ExportResult write_model(const std::string& out, const GPTConfig& c, const Tokenizer* tok, WeightType dtype, const std::string& what,
                         const formats::SinkFill& fill);
/// Writes an opened model (formats::open_model: a checkpoint, or any model it reads) and its tokenizer as one GGUF file,
/// atomically, one tensor at a time. dtype: "f32", "f16",
/// "bf16" or "q8_0" for the matrices (norm weights and biases stay f32, as llama.cpp's converter
/// keeps them; a q8_0 matrix whose rows are not a multiple of 32 is written f16). A model llama.cpp
/// cannot run as it is (another combination of norm, MLP and positions; the exact GELU; a
/// tokenizer it has no form for) is refused naming why, and nothing is written.
ExportResult export_model(const formats::OpenedModel& m, const std::string& out, WeightType dtype);

/// What import_model read.
struct ImportResult {
  std::string architecture;  // "llama", "qwen2", "gpt2"
  std::string tokenizer;     // "llama", "gpt2", or "" when the file has none
  std::string types;         // the stored tensor types, e.g. "F32, Q8_0"
  bool dequantized = false;  // q8_0 tensors were widened to float32
  WeightType kept = WeightType::f32;  // the checkpoint's weights: f32, bf16 or f16
};
/// Reads a GGUF file (llama, qwen2 or gpt2 architecture; F32, F16, BF16 and Q8_0 tensors,
/// widened to float32) and writes a weights-only checkpoint with its tokenizer: llama.cpp's
/// "llama" vocabulary as a sentencepiece model, its "gpt2" vocabulary as byte-level BPE with the
/// pre-tokenizer its name stands for. The file is read as hostile: counts, lengths and offsets
/// past the file, dimensions whose product overflows, misaligned or overlapping tensor data,
/// unknown value or tensor types, duplicate keys or tensors, missing or extra tensors, rope
/// scaling: a data Error naming the file and the key or tensor, and nothing is written.
ImportResult import_model(const std::string& path, const std::string& out);
/// The file opened and checked as import_model reads it, its tensors not yet read.
formats::OpenedModel open_model(const std::string& path);

/// Rounds every matrix of the model as export_model stores it in dtype (norm weights and biases
/// untouched): what llama.cpp's weights hold, for comparing its logits with tapelm's.
void round_like_export(GPT& model, WeightType dtype);

}  // namespace tapelm::gguf
