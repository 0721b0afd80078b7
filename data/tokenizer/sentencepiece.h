#pragma once
// Sentencepiece models (BPE, unigram), as llama2.c and Llama 1/2 use them, run by the
// sentencepiece library itself.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"

namespace tapelm {

/// What a sentencepiece model is trained with: llama2.c's options for small models (byte fallback,
/// digits split, identity normalization, whitespace-only pieces, character coverage 1.0, ids
/// 0/1/2 = unk/bos/eos, no pad).
struct SentencePieceOptions {
  std::string model_type = "bpe";  // "bpe" or "unigram"
  int32_t vocab_size = 4096;       // at least 259 (256 byte pieces + unk, bos, eos)
  int threads = 1;                 // the trainer's threads
};

/// One piece of a vocabulary given piece by piece (llama.cpp's "llama" vocabulary).
struct SentencePiecePiece {
  std::string piece;
  float score = 0;
  PieceKind kind = PieceKind::normal;
};

class SentencePiece : public TokenizerModel {
 public:
  /// A model from its serialized proto (a `.model` file's bytes); unparsable -> data Error.
  static Tokenizer load(const std::string& model_bytes);
  /// A model from a `.model` file; errors name the file.
  static Tokenizer load_file(const std::string& path);
  /// Trains a model on the given sentences (lines); a vocabulary the sample cannot support, or
  /// below 259 -> data Error (one line, sentencepiece's reason).
  static Tokenizer train(const std::vector<std::string>& sentences, const SentencePieceOptions& o);
  /// A BPE model from its pieces (scores are merge priorities), as llama.cpp stores one: ids
  /// bos/eos/unk (-1: none), whether it adds a dummy prefix; byte fallback when it has byte pieces.
  static Tokenizer from_pieces(const std::vector<SentencePiecePiece>& pieces, int64_t unk, int64_t bos, int64_t eos,
                               bool add_dummy_prefix);

  TokenizerKind kind() const override { return TokenizerKind::sentencepiece; }
  std::vector<int32_t> encode(const std::string& utf8) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string decode_next(int32_t prev, int32_t id) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  std::string piece(int32_t id) const override;
  float score(int32_t id) const override;
  PieceKind piece_kind(int32_t id) const override;
  bool adds_dummy_prefix() const override { return dummy_prefix_; }
  /// The `.model` file's bytes.
  const std::string& serialized() const override { return bytes_; }
  /// Before a space that follows a character other than a space or newline: sentencepiece's
  /// pieces never cross a word's leading space (its ▁), and the continuation's dummy prefix
  /// stands for the space it is cut at.
  bool can_cut_before(std::string_view text, size_t i) const override {
    return text[i] == ' ' && text[i - 1] != ' ' && text[i - 1] != '\n';
  }

  ~SentencePiece() override;

 private:
  SentencePiece();
  struct Processor;
  std::unique_ptr<Processor> sp_;
  std::string bytes_;
  bool dummy_prefix_ = false;
};

}  // namespace tapelm
