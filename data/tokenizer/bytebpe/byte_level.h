#pragma once
// The byte-level step of GPT-2's BPE: every byte stands for a visible character, so a vocabulary of
// strings covers all bytes; and the decoder that maps the characters back to bytes.
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace tapelm::bytebpe {

/// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes for
/// U+0100 onwards in byte order, so every byte has a visible, non-space character.
const std::array<char32_t, 256>& byte_to_char();
/// The byte each of those characters stands for.
const std::unordered_map<char32_t, uint8_t>& char_to_byte();
/// The bytes a token decodes to: each character through the byte map, or, when one is not a
/// byte character, the token's own UTF-8 (Hugging Face's ByteLevel decoder).
std::string decoded_bytes(const std::string& piece);

}  // namespace tapelm::bytebpe
