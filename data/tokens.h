#pragma once
// llm.c token files: a header of 256 little-endian int32 ([0] = 20240520 magic, [1] = 1 version,
// [2] = token count), then the tokens as little-endian uint16.
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/error.h"

namespace tapelm {

inline constexpr int32_t token_file_magic = 20240520;
inline constexpr int32_t token_file_version = 1;
inline constexpr int64_t token_file_header_bytes = 256 * 4;

/// The first 12 bytes of a token file's header: magic, version, token count (little-endian).
std::string token_file_header(int32_t magic, int32_t version, uint32_t count);
/// The bytes of an llm.c token file holding ids (each in [0, 65535]); `path` is named in errors.
std::string token_file_bytes(const std::vector<int32_t>& ids, const std::string& path);
/// Writes ids (each in [0, 65535]) as an llm.c token file, atomically: nothing is left on error.
void write_token_file(const std::string& path, const std::vector<int32_t>& ids);
/// Reads an llm.c token file; a missing file, bad header or size/count mismatch -> data Error.
std::vector<int32_t> read_token_file(const std::string& path);

}  // namespace tapelm
