#include "data/tokenizer/utf8.h"

#include <cstdio>
#include <utility>

namespace tapelm {

namespace {

std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}

}  // namespace

char32_t utf8_next(const std::string& s, size_t& i) {
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

std::vector<char32_t> utf8_decode(const std::string& utf8) {
  std::vector<char32_t> out;
  out.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) out.push_back(utf8_next(utf8, i));
  return out;
}

void utf8_check(const std::string& utf8) {
  for (size_t i = 0; i < utf8.size();) {
    if (static_cast<unsigned char>(utf8[i]) < 0x80) {
      i++;
      continue;
    }
    utf8_next(utf8, i);
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
      utf8_next(s, i);
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

std::string utf8_repair(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = u(i);
    if (b < 0x80) {
      out += static_cast<char>(b);
      i++;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (excludes overlongs and surrogates)
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) len = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) len = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    if (len > 0) {
      for (; k < static_cast<size_t>(len) && i + k < s.size(); k++) {
        const unsigned char c = u(i + k);
        if (k == 1 ? (c < lo || c > hi) : (c & 0xC0) != 0x80) break;
      }
      if (k == static_cast<size_t>(len)) {
        out.append(s, i, len);
        i += len;
        continue;
      }
    }
    out += "\xEF\xBF\xBD";  // U+FFFD for the maximal invalid subpart s[i, i + k)
    i += k;
  }
  return out;
}

}  // namespace tapelm
