#pragma once
// UTF-8 as every tokenizer and message reads and writes it.
#include <string>
#include <string_view>
#include <vector>

#include "autograd/error.h"

namespace tapelm {

/// The largest Unicode code point.
inline constexpr char32_t max_code_point = 0x10FFFF;
/// True for U+D800..U+DFFF, which UTF-8 may not encode.
inline bool is_surrogate(char32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

/// The code points of UTF-8 text; invalid UTF-8 -> data Error naming the byte offset.
std::vector<char32_t> utf8_decode(const std::string& utf8);
/// The code point starting at byte i of s, advancing i past it; invalid UTF-8 -> data Error naming offset i.
char32_t utf8_next(const std::string& s, size_t& i);
/// Throws what utf8_decode would for invalid UTF-8, without building the code points.
void utf8_check(const std::string& utf8);
/// The byte offset of the first invalid UTF-8 sequence, or std::string::npos when s is valid.
size_t utf8_first_invalid(std::string_view s);
/// UTF-8 encoding of one code point appended to out.
void utf8_append(std::string& out, char32_t cp);
/// s with each invalid UTF-8 sequence replaced by U+FFFD, one per maximal invalid subpart (as
/// Rust's from_utf8_lossy and Python's errors="replace" do).
std::string utf8_repair(const std::string& s);
/// "'a' (U+0061)", "'\n' (U+000A)": how errors name a character.
std::string describe_char(char32_t cp);

}  // namespace tapelm
