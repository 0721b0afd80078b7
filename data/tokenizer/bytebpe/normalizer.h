#pragma once
// The normalizers of a tokenizer.json that tapelm runs exactly: none, NFC (Qwen2), Prepend and
// Replace of a string (Llama 2's and Gemma's "▁" for a space), and sequences of them. Any other is
// refused, naming the field.
#include <string>
#include <vector>

#include "data/tokenizer/bytebpe/parse.h"

namespace tapelm::bytebpe {

/// s with every occurrence of a (non-empty) replaced by b, left to right.
std::string replace_all(const std::string& s, const std::string& a, const std::string& b);

class Normalizer {
 public:
  /// The normalizer a tokenizer.json's "normalizer" value asks for (null: none).
  static Normalizer parse(const Parser& p, const json& n, const std::string& field);
  /// True when normalizing changes some text.
  bool active() const { return !steps_.empty(); }
  /// The text normalized, step by step (NFC by utf8proc).
  std::string apply(const std::string& utf8) const;
  /// True when a step prepends to every non-empty text (Llama 2's "▁").
  bool prepends() const;
  /// True when the normalizer never joins text across an ASCII space or newline, nor changes one.
  bool keeps_spaces() const;

 private:
  enum class Kind { nfc, prepend, replace };
  struct Step {
    Kind kind;
    std::string a, b;  // prepend: a; replace: a by b
  };
  void add(const Parser& p, const json& n, const std::string& field, int depth);
  std::vector<Step> steps_;
};

}  // namespace tapelm::bytebpe
