#pragma once
// The normalizers of a byte-level tokenizer.json that tapelm runs exactly: none, NFC (Qwen2), and
// sequences of them. Any other is refused, naming the field.
#include <string>

#include "data/tokenizer/bytebpe/parse.h"

namespace tapelm::bytebpe {

class Normalizer {
 public:
  /// The normalizer a tokenizer.json's "normalizer" value asks for (null: none).
  static Normalizer parse(const Parser& p, const json& n, const std::string& field);
  /// True when normalizing changes some text.
  bool active() const { return nfc_; }
  /// The text normalized (NFC, by utf8proc).
  std::string apply(const std::string& utf8) const;

 private:
  void add(const Parser& p, const json& n, const std::string& field, int depth);
  bool nfc_ = false;
};

}  // namespace tapelm::bytebpe
