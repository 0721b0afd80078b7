#include "data/tokenizer/bytebpe/byte_level.h"

#include <vector>

#include "data/tokenizer/utf8.h"

namespace tapelm::bytebpe {

const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> m = [] {
    std::array<char32_t, 256> t{};
    int n = 0;
    for (int b = 0; b < 256; b++) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? char32_t(b) : char32_t(256 + n++);
    }
    return t;
  }();
  return m;
}

const std::unordered_map<char32_t, uint8_t>& char_to_byte() {
  static const std::unordered_map<char32_t, uint8_t> m = [] {
    std::unordered_map<char32_t, uint8_t> t;
    for (int b = 0; b < 256; b++) t[byte_to_char()[b]] = static_cast<uint8_t>(b);
    return t;
  }();
  return m;
}

std::string decoded_bytes(const std::string& piece) {
  std::string out;
  std::vector<char32_t> cps;
  try {
    cps = utf8_decode(piece);
  } catch (const Error&) {
    return piece;
  }
  for (char32_t c : cps) {
    auto it = char_to_byte().find(c);
    if (it == char_to_byte().end()) return piece;
    out += static_cast<char>(it->second);
  }
  return out;
}

}  // namespace tapelm::bytebpe
