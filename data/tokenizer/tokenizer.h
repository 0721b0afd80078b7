#pragma once
// The tokenizer interface. Every kind (data/tokenizer/char.h, sentencepiece.h, bytebpe/byte_bpe.h)
// implements TokenizerModel; a Tokenizer is a cheap handle over one, which checks ids and
// forwards. Kinds are registered once (tokenizer.cpp): the name stored in checkpoints and
// corpora, and how to rebuild one from its serialized bytes.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/error.h"
#include "data/tokenizer/utf8.h"

namespace tapelm {

/// The kinds of tokenizer tapelm runs.
/// byte_bpe: a byte-level tokenizer.json (GPT-2, Llama 3, Qwen2); fallback_bpe: a sentencepiece-style
/// one, BPE over characters with byte fallback (Llama 2's, Mistral's, Gemma's tokenizer.json).
enum class TokenizerKind { char_level, sentencepiece, byte_bpe, fallback_bpe };
/// "char", "sentencepiece", "byte_bpe" or "fallback_bpe": the kind's name in checkpoints and corpora.
const char* to_string(TokenizerKind k);
/// The file a corpus directory keeps a tokenizer of this kind in (tokenizer.json for char, ...).
const char* corpus_file_name(TokenizerKind k);

/// What a piece is, as sentencepiece (and llama.cpp's token types) classify them: control (BOS,
/// EOS; byte-level BPE's special added tokens), unknown, unused, byte, user_defined (byte-level
/// BPE's other added tokens) or normal.
enum class PieceKind { normal, unknown, control, user_defined, unused, byte };

/// One kind of tokenizer. Immutable once built, so one model may encode from many threads at
/// once. The ids it is given are in [0, vocab_size()) (Tokenizer checks them first).
class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  virtual TokenizerKind kind() const = 0;
  /// Ids of UTF-8 text (no BOS or EOS added); invalid UTF-8 -> data Error.
  virtual std::vector<int32_t> encode(const std::string& utf8) const = 0;
  /// The text of ids.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// The text id adds after prev when streaming (see Tokenizer::decode_next).
  virtual std::string decode_next(int32_t prev, int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const { return -1; }
  virtual int32_t eos_id() const { return -1; }
  /// The text of one id as the vocabulary stores it.
  virtual std::string piece(int32_t id) const = 0;
  virtual float score(int32_t) const { return 0.f; }
  virtual PieceKind piece_kind(int32_t) const { return PieceKind::normal; }
  /// True when encoding prefixes text with a space (sentencepiece's add_dummy_prefix).
  virtual bool adds_dummy_prefix() const { return false; }
  /// What to store to rebuild it (the registry's deserialize reads it back).
  virtual const std::string& serialized() const = 0;
  /// True when text may be cut before byte i (0 < i, i + 1 < text.size()) with encode(text[..i))
  /// followed by the continuation's ids (see Tokenizer::can_cut_before) equal to encode(text),
  /// for any text with these bytes around i: decided from the bytes next to i alone. False unless
  /// the kind can prove it (docs/tokenizers.md says why each rule is safe).
  virtual bool can_cut_before(std::string_view text, size_t i) const { return false; }
};

/// Any tokenizer tapelm trains with, behind one interface: the char tokenizer, a sentencepiece
/// model (BPE or unigram, as llama2.c and Llama 1/2 use) or byte-level BPE (GPT-2, Llama 3,
/// Qwen2). A cheap handle: copies share the model.
class Tokenizer {
 public:
  /// An empty tokenizer (vocab_size 0); assign a real one before use.
  Tokenizer() = default;
  explicit Tokenizer(std::shared_ptr<const TokenizerModel> m) : m_(std::move(m)) {}
  /// A model held by value, e.g. Tokenizer::of(CharTokenizer::from_text(text)).
  template <class Model>
  static Tokenizer of(Model m) {
    return Tokenizer(std::make_shared<const Model>(std::move(m)));
  }
  /// Inverse of kind_name() and serialized(): the registry. An unknown kind or bad bytes -> data Error.
  static Tokenizer deserialize(const std::string& kind, const std::string& bytes);

  bool empty() const { return !m_; }
  TokenizerKind kind() const;
  /// "char", "sentencepiece" or "byte_bpe" ("none" when empty).
  std::string kind_name() const;
  /// The model as kind T, or null when it is another kind.
  template <class T>
  const T* as() const {
    return dynamic_cast<const T*>(m_.get());
  }
  /// What to store to rebuild it (see deserialize).
  std::string serialized() const;

  /// Ids of UTF-8 text (no BOS or EOS added). Char: an unknown character -> data Error;
  /// sentencepiece and byte-level BPE: never fail on valid UTF-8, invalid UTF-8 -> data Error.
  std::vector<int32_t> encode(const std::string& utf8) const;
  /// The text of ids; an id outside [0, vocab_size) -> data Error. Sentencepiece drops BOS/EOS and
  /// the dummy-prefix space of the first piece, as its own decoder does; byte-level BPE drops BOS
  /// and EOS, keeps other added tokens' text, and replaces invalid UTF-8 with U+FFFD.
  std::string decode(const std::vector<int32_t>& ids) const;
  /// The text id adds after prev when streaming, as llama2.c prints: BOS, EOS and unused ids
  /// give nothing, a byte piece its byte, U+2581 a space, and after BOS (or prev < 0) the dummy
  /// prefix's space is dropped. Byte-level BPE gives the token's bytes, which may end inside a
  /// UTF-8 character that the next token completes. Concatenated over a document it equals
  /// decode() (for byte-level BPE, when the whole is valid UTF-8).
  std::string decode_next(int32_t prev, int32_t id) const;
  /// Number of ids.
  int32_t vocab_size() const { return m_ ? m_->vocab_size() : 0; }
  /// The begin-of-document id (each document starts with it), or -1 (char).
  int32_t bos_id() const { return m_ ? m_->bos_id() : -1; }
  /// The end-of-document id, or -1 (char).
  int32_t eos_id() const { return m_ ? m_->eos_id() : -1; }
  /// The text of one id as the vocabulary stores it (sentencepiece: "▁the", "<0x0A>", "<s>"; char: the character).
  std::string piece(int32_t id) const;
  /// The piece's score (sentencepiece's log probability or merge rank; 0 for the others).
  float score(int32_t id) const;
  /// True for sentencepiece's byte-fallback pieces <0x00> ... <0xFF>.
  bool is_byte(int32_t id) const;
  PieceKind piece_kind(int32_t id) const;
  /// True when encoding prefixes text with a space (sentencepiece's add_dummy_prefix): text
  /// encoded in pieces then must start each later piece at a space, dropping it (see prepare).
  bool adds_dummy_prefix() const { return m_ && m_->adds_dummy_prefix(); }
  /// True when text may be cut before byte i so that its two parts, encoded apart (the second as
  /// a continuation: without its first space when adds_dummy_prefix()), give the ids of the
  /// whole. Needs one byte of context after i: false when i == 0 or i + 1 >= text.size().
  bool can_cut_before(std::string_view text, size_t i) const {
    return m_ && i > 0 && i + 1 < text.size() && m_->can_cut_before(text, i);
  }

  /// Same kind and same serialized bytes.
  bool operator==(const Tokenizer& o) const;

 private:
  const TokenizerModel& model(const char* what) const;
  void check_id(int32_t id, const std::string& at = "") const;
  std::shared_ptr<const TokenizerModel> m_;
};

}  // namespace tapelm
