#include "data/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

namespace tapelm {

namespace {

constexpr char32_t max_code_point = 0x10FFFF;

bool is_surrogate(char32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}

// Decodes the code point starting at byte i and advances i past it, or throws naming offset i.
char32_t decode_one(const std::string& s, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const size_t start = i;
  const unsigned char b0 = byte(i);
  auto fail = [&](const std::string& why) -> Error {
    return Error(ErrorKind::data, "invalid UTF-8 at byte offset " + std::to_string(start) + " (byte " + hex_byte(b0) + "): " + why);
  };
  if (b0 < 0x80) {
    i++;
    return b0;
  }
  int len;
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, cp = b0 & 0x0F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, cp = b0 & 0x07;
  } else {
    throw fail(b0 >= 0x80 && b0 <= 0xBF ? "continuation byte without a lead byte" : "not a valid lead byte");
  }
  if (start + len > s.size()) throw fail("sequence truncated by the end of the text");
  for (int k = 1; k < len; k++) {
    const unsigned char b = byte(start + k);
    if ((b & 0xC0) != 0x80) throw fail("expected a continuation byte at offset " + std::to_string(start + k));
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr char32_t min_for_len[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_for_len[len]) throw fail("overlong encoding");
  if (is_surrogate(cp)) throw fail("encodes a surrogate");
  if (cp > max_code_point) throw fail("code point beyond U+10FFFF");
  i = start + len;
  return cp;
}

}  // namespace

std::vector<char32_t> utf8_decode(const std::string& utf8) {
  std::vector<char32_t> out;
  out.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) out.push_back(decode_one(utf8, i));
  return out;
}

void utf8_check(const std::string& utf8) {
  for (size_t i = 0; i < utf8.size();) {
    if (static_cast<unsigned char>(utf8[i]) < 0x80) {
      i++;
      continue;
    }
    decode_one(utf8, i);
  }
}

size_t utf8_first_invalid(std::string_view sv) {
  const std::string s(sv);
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      i++;
      continue;
    }
    const size_t at = i;
    try {
      decode_one(s, i);
    } catch (const Error&) {
      return at;
    }
  }
  return std::string::npos;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string describe_char(char32_t cp) {
  char code[16];
  std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(cp));
  static const std::pair<char32_t, const char*> escapes[] = {
      {'\n', "\\n"}, {'\r', "\\r"}, {'\t', "\\t"}, {'\'', "\\'"}, {'\\', "\\\\"}};
  std::string out = "'";
  for (const auto& [c, escaped] : escapes)
    if (cp == c) out += escaped;
  if (out.size() == 1) {
    // Control characters (C0, DEL, C1) have no printable form; everything else is shown as itself.
    if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) return code;
    utf8_append(out, cp);
  }
  out += "' (";
  out += code;
  out += ')';
  return out;
}

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
  return t;
}

CharTokenizer CharTokenizer::from_json(const std::string& json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::data, std::string("tokenizer JSON does not parse: ") + e.what());
  }
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
    const char32_t cp = decode_one(utf8, i);
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

std::string CharTokenizer::to_json() const {
  nlohmann::json j;
  j["type"] = "char";
  j["symbols"] = nlohmann::json::array();
  for (char32_t cp : symbols_) j["symbols"].push_back(static_cast<uint32_t>(cp));
  return j.dump();
}

}  // namespace tapelm
