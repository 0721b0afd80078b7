#pragma once
// The char tokenizer: character-level over Unicode code points; the vocabulary is the corpus's
// distinct characters sorted by code point (nanoGPT's shakespeare_char: tinyshakespeare gives 65).
// No BOS or EOS.
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"

namespace tapelm {

class CharTokenizer : public TokenizerModel {
 public:
  CharTokenizer() = default;
  /// Vocabulary = the distinct code points of the text, sorted; empty or invalid text -> data Error.
  static CharTokenizer from_text(const std::string& utf8);
  /// From a vocabulary that must be strictly increasing valid code points.
  static CharTokenizer from_symbols(std::vector<char32_t> symbols);
  /// Parses {"type":"char","symbols":[code points...]}, as written by to_json.
  static CharTokenizer from_json(const std::string& json);

  TokenizerKind kind() const override { return TokenizerKind::char_level; }
  /// Ids of the text's characters; an unknown character -> data Error naming it and its position.
  std::vector<int32_t> encode(const std::string& utf8) const override;
  /// UTF-8 text of the ids; an id outside [0, vocab_size) -> data Error.
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string decode_next(int32_t prev, int32_t id) const override;
  /// Number of symbols.
  int32_t vocab_size() const override { return static_cast<int32_t>(symbols_.size()); }
  std::string piece(int32_t id) const override;
  /// {"type":"char","symbols":[...]}, for tokenizer.json and checkpoint attributes.
  const std::string& serialized() const override { return json_; }
  /// One id per character: any character boundary.
  bool can_cut_before(std::string_view text, size_t i) const override {
    return (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
  }
  std::string to_json() const { return json_; }
  /// The vocabulary: symbol i is the code point of id i.
  const std::vector<char32_t>& symbols() const { return symbols_; }

  /// Same vocabulary.
  bool operator==(const CharTokenizer& o) const { return symbols_ == o.symbols_; }

 private:
  int32_t id_of(char32_t cp) const;

  std::vector<char32_t> symbols_;
  std::vector<int32_t> ascii_ids_;  // id of each code point < 128, or -1
  std::string json_;
};

}  // namespace tapelm
