#include "data/tokenizer/char.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "autograd/json_read.h"

namespace tapelm {

CharTokenizer CharTokenizer::from_text(const std::string& utf8) {
  if (utf8.empty()) throw Error(ErrorKind::data, "cannot build a tokenizer from empty text");
  std::vector<char32_t> cps = utf8_decode(utf8);
  std::sort(cps.begin(), cps.end());
  cps.erase(std::unique(cps.begin(), cps.end()), cps.end());
  return from_symbols(std::move(cps));
}

CharTokenizer CharTokenizer::from_symbols(std::vector<char32_t> symbols) {
  if (symbols.empty()) throw Error(ErrorKind::data, "tokenizer vocabulary is empty");
  for (size_t i = 0; i < symbols.size(); i++) {
    const char32_t cp = symbols[i];
    if (cp > max_code_point || is_surrogate(cp))
      throw Error(ErrorKind::data, "tokenizer symbol " + std::to_string(i) + " is not a valid code point: " + std::to_string(cp));
    if (i > 0 && cp <= symbols[i - 1])
      throw Error(ErrorKind::data, "tokenizer symbols are not strictly increasing at index " + std::to_string(i) + " (" +
                      std::to_string(symbols[i - 1]) + " then " + std::to_string(cp) + ")");
  }
  CharTokenizer t;
  t.symbols_ = std::move(symbols);
  t.ascii_ids_.assign(128, -1);
  for (size_t i = 0; i < t.symbols_.size() && t.symbols_[i] < 128; i++)
    t.ascii_ids_[t.symbols_[i]] = static_cast<int32_t>(i);
  nlohmann::json j;
  j["type"] = "char";
  j["symbols"] = nlohmann::json::array();
  for (char32_t cp : t.symbols_) j["symbols"].push_back(static_cast<uint32_t>(cp));
  t.json_ = j.dump();
  return t;
}

CharTokenizer CharTokenizer::from_json(const std::string& json) {
  nlohmann::json j;
  j = parse_json(json, "tokenizer JSON");
  if (!j.is_object()) throw Error(ErrorKind::data, "tokenizer JSON is not an object");
  if (!j.contains("type") || j["type"] != "char")
    throw Error(ErrorKind::data, "tokenizer JSON has type " + (j.contains("type") ? j["type"].dump() : std::string("(missing)")) +
                    ", expected \"char\"");
  if (!j.contains("symbols") || !j["symbols"].is_array()) throw Error(ErrorKind::data, "tokenizer JSON has no \"symbols\" array");
  std::vector<char32_t> symbols;
  for (const auto& s : j["symbols"]) {
    if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > int64_t(max_code_point))
      throw Error(ErrorKind::data, "tokenizer JSON symbol " + std::to_string(symbols.size()) + " is not a code point: " + s.dump());
    symbols.push_back(static_cast<char32_t>(s.get<int64_t>()));
  }
  return from_symbols(std::move(symbols));
}

int32_t CharTokenizer::id_of(char32_t cp) const {
  if (cp < 128) return ascii_ids_.empty() ? -1 : ascii_ids_[cp];
  auto it = std::lower_bound(symbols_.begin(), symbols_.end(), cp);
  return it != symbols_.end() && *it == cp ? static_cast<int32_t>(it - symbols_.begin()) : -1;
}

std::vector<int32_t> CharTokenizer::encode(const std::string& utf8) const {
  std::vector<int32_t> ids;
  ids.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) {
    const size_t offset = i;
    const char32_t cp = utf8_next(utf8, i);
    const int32_t id = id_of(cp);
    if (id < 0)
      throw Error(ErrorKind::data, "unknown character " + describe_char(cp) + " at position " + std::to_string(ids.size()) +
                      " (byte offset " + std::to_string(offset) + "): not in the tokenizer's vocabulary of " +
                      std::to_string(vocab_size()) + " symbols");
    ids.push_back(id);
  }
  return ids;
}

std::string CharTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); i++) {
    if (ids[i] < 0 || ids[i] >= vocab_size())
      throw Error(ErrorKind::data, "token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                      " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
    utf8_append(out, symbols_[ids[i]]);
  }
  return out;
}

std::string CharTokenizer::decode_next(int32_t, int32_t id) const { return piece(id); }

std::string CharTokenizer::piece(int32_t id) const {
  std::string s;
  utf8_append(s, symbols_.at(static_cast<size_t>(id)));
  return s;
}

}  // namespace tapelm
