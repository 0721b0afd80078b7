#pragma once
// Character-level tokenizer over Unicode code points: the vocabulary is the corpus's distinct
// characters sorted by code point (nanoGPT's shakespeare_char: tinyshakespeare gives 65).
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/error.h"

namespace tapelm {

/// The code points of UTF-8 text; invalid UTF-8 -> data Error naming the byte offset.
std::vector<char32_t> utf8_decode(const std::string& utf8);
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
