#pragma once
// karpathy/llama2.c's model files (its export.py and run.c), read and written exactly.
//
// Version 0 ("legacy", the one run.c reads): 7 little-endian int32 — dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size (negative: the classifier is not the embedding), max_seq_len —
// then fp32 tensors in PyTorch (out, in) order, each group for all layers before the next:
// tok_embeddings, attention_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, norm, the RoPE tables
// freq_cis_real and freq_cis_imag [max_seq_len, hd/2] (run.c skips them), output if not shared.
// Version 1: a 256-byte header (uint32 magic 0x616b3432, int32 1, the 7 ints with vocab_size
// positive, uint8 shared_classifier, zeros), then the norms (attention, ffn, final), tok_embeddings,
// wq, wk, wv, wo, w1, w2, w3, output if not shared; no RoPE tables.
//
// The architecture is tapelm's rmsnorm + swiglu + rope without biases, except that llama2.c's RoPE
// rotates interleaved pairs (x[2i], x[2i+1]) where tapelm rotates half-split pairs (x[i], x[i+hd/2]):
// the rows of wq and wk are permuted within each head on the way in and back on the way out.
// w1 is tapelm's mlp.gate, w3 mlp.up, w2 mlp.down.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "nn/gpt.h"
#include "train/formats/model_source.h"

namespace tapelm::llama2c {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42"
constexpr int64_t kHeaderBytesV1 = 256;

/// What a file's header says.
struct Header {
  int version = 0;  // 0 or 1
  int64_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, max_seq_len = 0;
  bool shared_classifier = true;
};

/// A model read from a llama2.c file.
struct Model {
  Header header;
  std::unique_ptr<GPT> gpt;
  /// Version 0: the file's RoPE tables [max_seq_len, hd/2], kept so that writing the model back
  /// gives the same bytes (PyTorch's float32 cos/sin are not reproducible bit for bit). Empty for v1.
  Tensor freq_cis_real, freq_cis_imag;
};

/// The tapelm config of a header: rmsnorm (eps 1e-5), swiglu, rope (theta 10000), no biases,
/// tied as the header says, block_size = max_seq_len.
GPTConfig to_config(const Header& h);

/// The header (version 0) of a tapelm config.
Header to_header(const GPTConfig& c);

/// Reads a version 0 or 1 file. A truncated file, a header whose sizes disagree with the file's,
/// n_heads not a multiple of n_kv_heads, a bad magic or version: a data Error naming the file.
Model read_model(const std::string& path);

/// Throws a config Error naming the first thing llama2.c cannot express (LayerNorm, GELU,
/// biases, learned positions, a head dim that is not n_embd / n_head, another RoPE theta or norm
/// eps); `what` (the checkpoint) starts the message.
void check_exportable(const GPTConfig& c, const std::string& what);

/// The bytes of a version 0 or 1 file of the model. Version 0 writes the given RoPE tables when
/// both are set, else tables computed as llama2.c's model.py does (to float32 rounding).
std::string model_bytes(const GPT& model, int version, const Tensor* freq_cis_real = nullptr,
                        const Tensor* freq_cis_imag = nullptr);

/// model.py's RoPE tables: cos and sin of p · 10000^(−2i/hd), [n_pos, hd/2] each.
std::pair<Tensor, Tensor> rope_tables(int64_t hd, int64_t n_pos);

/// llama2.c's tokenizer.bin of a sentencepiece tokenizer, as its tokenizer.py exports one: uint32
/// max_token_length, then per id float32 score, uint32 byte length and the piece's bytes (no NUL),
/// U+2581 written as a space, BOS and EOS as "\n<s>\n" and "\n</s>\n". run.c needs ids 0/1/2 =
/// unk/bos/eos and the 256 byte pieces at 3..258: a tokenizer without them, or a char tokenizer,
/// is a config Error starting with `what`.
std::string tokenizer_bytes(const Tokenizer& tok, const std::string& what);

/// The pieces and scores of a tokenizer.bin holding vocab_size pieces, as run.c reads it; a file
/// with fewer pieces (or cut inside one) is a data Error naming the file.
struct TokenizerBin {
  uint32_t max_token_length = 0;
  std::vector<float> scores;
  std::vector<std::string> pieces;
};
TokenizerBin read_tokenizer_bin(const std::string& path, int64_t vocab_size);

/// `tapelm import --format llama2c`: reads a llama2.c file and writes a weights-only checkpoint
/// (version 0's RoPE tables kept beside the weights), with the sentencepiece model at
/// tokenizer_model when it is not empty (its vocabulary must be the model's). tokenizer_bin, when
/// not empty, is run.c's tokenizer.bin for the same model: it must hold the pieces and scores the
/// sentencepiece model exports. Nothing is written on any error. Returns the file's header.
Header import_model(const std::string& model_path, const std::string& tokenizer_model, const std::string& tokenizer_bin,
                    const std::string& out);
/// `tapelm export --format llama2c`: writes a checkpoint's model as a llama2.c file of the given
/// version and, when the checkpoint holds a sentencepiece tokenizer, tokenizer.bin beside it, both
/// atomically; a model llama2.c cannot express (a char tokenizer included) is refused before
/// anything is written. Returns the header written; *tokenizer_path is set to the tokenizer.bin
/// written, or emptied.
Header export_model(const formats::OpenedModel& m, int version, const std::string& out, std::string* tokenizer_path);

/// wq or wk rows [nh·hd, d] from tapelm's half-split RoPE order to llama2.c's interleaved order
/// (row h·hd + 2i + j takes row h·hd + j·hd/2 + i), and back.
Tensor interleave_rope_rows(const Tensor& w, int64_t n_heads);
Tensor half_split_rope_rows(const Tensor& w, int64_t n_heads);

}  // namespace tapelm::llama2c
