#include "data/tokens.h"

#include "data/io.h"

namespace tapelm {

namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int k = 0; k < 4; k++) out += static_cast<char>((v >> (8 * k)) & 0xFF);
}

int32_t get_i32(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) v |= uint32_t(static_cast<unsigned char>(b[at + k])) << (8 * k);
  return static_cast<int32_t>(v);
}

}  // namespace

std::string token_file_header(int32_t magic, int32_t version, uint32_t count) {
  std::string h;
  put_u32(h, static_cast<uint32_t>(magic));
  put_u32(h, static_cast<uint32_t>(version));
  put_u32(h, count);
  return h;
}

std::string token_file_bytes(const std::vector<int32_t>& ids, const std::string& path) {
  const std::string what = "token file " + path + ": ";
  if (ids.size() > size_t(INT32_MAX))
    throw Error(ErrorKind::data, what + std::to_string(ids.size()) + " tokens do not fit the header's int32 count");
  for (size_t i = 0; i < ids.size(); i++)
    if (ids[i] < 0 || ids[i] > 65535)
      throw Error(ErrorKind::data, what + "token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                      " does not fit uint16 [0, 65535]");
  std::string bytes;
  bytes.reserve(token_file_header_bytes + 2 * ids.size());
  bytes += token_file_header(token_file_magic, token_file_version, static_cast<uint32_t>(ids.size()));
  bytes.resize(token_file_header_bytes, '\0');
  for (int32_t id : ids) {
    bytes += static_cast<char>(id & 0xFF);
    bytes += static_cast<char>((id >> 8) & 0xFF);
  }
  return bytes;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& ids) {
  write_file_atomic(path, token_file_bytes(ids, path));
}

std::vector<int32_t> read_token_file(const std::string& path) {
  const std::string bytes = read_file_bytes(path, "token file");
  const std::string what = "token file " + path + ": ";
  if (int64_t(bytes.size()) < token_file_header_bytes)
    throw Error(ErrorKind::data, what + "only " + std::to_string(bytes.size()) + " bytes, shorter than the " +
                    std::to_string(token_file_header_bytes) + "-byte header");
  const int32_t magic = get_i32(bytes, 0), version = get_i32(bytes, 4), count = get_i32(bytes, 8);
  if (magic != token_file_magic)
    throw Error(ErrorKind::data, what + "bad magic number " + std::to_string(magic) + " (expected " +
                    std::to_string(token_file_magic) + "); not an llm.c token file");
  if (version != token_file_version)
    throw Error(ErrorKind::data, what + "unsupported version " + std::to_string(version) + " (expected " +
                    std::to_string(token_file_version) + ", uint16 tokens)");
  if (count < 0) throw Error(ErrorKind::data, what + "negative token count " + std::to_string(count) + " in the header");
  const int64_t expected = token_file_header_bytes + 2 * int64_t(count);
  if (int64_t(bytes.size()) != expected)
    throw Error(ErrorKind::data, what + "size " + std::to_string(bytes.size()) + " bytes disagrees with the header's count of " +
                    std::to_string(count) + " tokens (expected " + std::to_string(expected) + " bytes)");
  std::vector<int32_t> ids(count);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + token_file_header_bytes;
  for (int32_t i = 0; i < count; i++) ids[i] = int32_t(p[2 * i]) | (int32_t(p[2 * i + 1]) << 8);
  return ids;
}

}  // namespace tapelm
