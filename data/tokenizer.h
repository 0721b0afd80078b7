#pragma once
// Tokenizers. CharTokenizer: character-level over Unicode code points; the vocabulary is the
// corpus's distinct characters sorted by code point (nanoGPT's shakespeare_char: tinyshakespeare
// gives 65). Tokenizer: the one interface over it and sentencepiece models (BPE, unigram).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/error.h"

namespace tapelm {

/// The code points of UTF-8 text; invalid UTF-8 -> data Error naming the byte offset.
std::vector<char32_t> utf8_decode(const std::string& utf8);
/// Throws what utf8_decode would for invalid UTF-8, without building the code points.
void utf8_check(const std::string& utf8);
/// The byte offset of the first invalid UTF-8 sequence, or std::string::npos when s is valid.
size_t utf8_first_invalid(std::string_view s);
/// UTF-8 encoding of one code point appended to out.
void utf8_append(std::string& out, char32_t cp);
/// "'a' (U+0061)", "'\n' (U+000A)": how errors name a character.
std::string describe_char(char32_t cp);

class CharTokenizer {
 public:
  CharTokenizer() = default;
  /// Vocabulary = the distinct code points of the text, sorted; empty or invalid text -> data Error.
  static CharTokenizer from_text(const std::string& utf8);
  /// From a vocabulary that must be strictly increasing valid code points.
  static CharTokenizer from_symbols(std::vector<char32_t> symbols);
  /// Parses {"type":"char","symbols":[code points...]}, as written by to_json.
  static CharTokenizer from_json(const std::string& json);

  /// Ids of the text's characters; an unknown character -> data Error naming it and its position.
  std::vector<int32_t> encode(const std::string& utf8) const;
  /// UTF-8 text of the ids; an id outside [0, vocab_size) -> data Error.
  std::string decode(const std::vector<int32_t>& ids) const;
  /// Number of symbols.
  int32_t vocab_size() const { return static_cast<int32_t>(symbols_.size()); }
  /// The vocabulary: symbol i is the code point of id i.
  const std::vector<char32_t>& symbols() const { return symbols_; }
  /// {"type":"char","symbols":[...]}, for tokenizer.json and checkpoint attributes.
  std::string to_json() const;

  /// Same vocabulary.
  bool operator==(const CharTokenizer& o) const { return symbols_ == o.symbols_; }

 private:
  int32_t id_of(char32_t cp) const;

  std::vector<char32_t> symbols_;
  std::vector<int32_t> ascii_ids_;  // id of each code point < 128, or -1
};

}  // namespace tapelm

namespace tapelm {

struct SentencePieceModel;  // a loaded sentencepiece model (data/subword.cpp)
class ByteBpe;              // byte-level BPE from a Hugging Face tokenizer.json (data/bytebpe.h)

/// What a sentencepiece model is trained with: llama2.c's options for small models (byte fallback,
/// digits split, identity normalization, whitespace-only pieces, character coverage 1.0, ids
/// 0/1/2 = unk/bos/eos, no pad).
struct SentencePieceOptions {
  std::string model_type = "bpe";  // "bpe" or "unigram"
  int32_t vocab_size = 4096;       // at least 259 (256 byte pieces + unk, bos, eos)
  int threads = 1;                 // the trainer's threads
};

/// Any tokenizer tapelm trains with, behind one interface: the char tokenizer (ids are a
/// corpus's sorted code points, no BOS/EOS), a sentencepiece model (BPE or unigram, as
/// llama2.c and Llama 1/2 use) or byte-level BPE (GPT-2, Llama 3, Qwen2). A cheap handle: copies share the model, which is immutable, so one
/// Tokenizer may encode from many threads at once.
class Tokenizer {
 public:
  /// An empty tokenizer (vocab_size 0); assign a real one before use.
  Tokenizer() = default;
  /// The char tokenizer c.
  static Tokenizer from_char(CharTokenizer c);
  /// A sentencepiece model from its serialized proto (a `.model` file's bytes); unparsable -> data Error.
  static Tokenizer from_sentencepiece(const std::string& model_bytes);
  /// Trains a sentencepiece model on the given sentences (lines); a vocabulary the sample cannot
  /// support, or below 259 -> data Error (one line, sentencepiece's reason).
  static Tokenizer train_sentencepiece(const std::vector<std::string>& sentences, const SentencePieceOptions& o);
  /// Byte-level BPE.
  static Tokenizer from_byte_bpe(std::shared_ptr<const ByteBpe> b);
  /// A tokenizer file as Hugging Face and sentencepiece ship them: a sentencepiece `.model`, a
  /// `tokenizer.json` (byte-level BPE), or GPT-2's `vocab.json` with `merges.txt` beside it. A
  /// tokenizer.json takes its BOS/EOS from `tokenizer_config.json` beside it (bos_token,
  /// eos_token), else from `config.json` (bos_token_id, eos_token_id), else `<|endoftext|>`; with
  /// no BOS its EOS starts each document (as GPT-2 and Qwen2 pretrain). Bad file -> data Error.
  static Tokenizer from_file(const std::string& path);
  /// Inverse of kind_name() and serialized(): "char" with the JSON, "sentencepiece" with the model
  /// bytes, "byte_bpe" with ByteBpe::serialized().
  static Tokenizer deserialize(const std::string& kind, const std::string& bytes);

  /// "char", "sentencepiece" or "byte_bpe".
  std::string kind_name() const;
  /// True for the char tokenizer.
  bool is_char() const { return static_cast<bool>(ch_); }
  /// The char tokenizer, or null for the others.
  const CharTokenizer* char_tokenizer() const { return ch_.get(); }
  /// The byte-level BPE tokenizer, or null for the others.
  const ByteBpe* byte_bpe() const { return bb_.get(); }
  /// What to store to rebuild it: the char tokenizer's JSON, or the sentencepiece model's bytes.
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
  int32_t vocab_size() const;
  /// The begin-of-document id (each document starts with it), or -1 (char).
  int32_t bos_id() const;
  /// The end-of-document id, or -1 (char).
  int32_t eos_id() const;
  /// The text of one id as the vocabulary stores it (sentencepiece: "▁the", "<0x0A>", "<s>"; char: the character).
  std::string piece(int32_t id) const;
  /// The piece's score (sentencepiece's log probability or merge rank; 0 for char).
  float score(int32_t id) const;
  /// True for sentencepiece's byte-fallback pieces <0x00> ... <0xFF>.
  bool is_byte(int32_t id) const;
  /// What a piece is, as sentencepiece (and llama.cpp's token types) classify them: control
  /// (BOS, EOS; byte-level BPE's special added tokens), unknown, unused, byte, user_defined
  /// (byte-level BPE's other added tokens) or normal.
  enum class PieceKind { normal, unknown, control, user_defined, unused, byte };
  PieceKind piece_kind(int32_t id) const;
  /// True when encoding prefixes text with a space (sentencepiece's add_dummy_prefix): text
  /// encoded in pieces then must start each later piece at a space, dropping it (see prepare).
  bool adds_dummy_prefix() const;

  /// Same kind and same serialized bytes.
  bool operator==(const Tokenizer& o) const;

 private:
  std::shared_ptr<const CharTokenizer> ch_;
  std::shared_ptr<const SentencePieceModel> sp_;
  std::shared_ptr<const ByteBpe> bb_;
};

}  // namespace tapelm
