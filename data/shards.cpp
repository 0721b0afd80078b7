#include "data/shards.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "data/io.h"
#include "data/tokens.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {

int32_t le_i32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
}

}  // namespace

struct TokenSeq::Mapping {
  MappedFile file;
  const unsigned char* tokens = nullptr;  // first token
  int64_t n = 0;
  int width = 2;

  Mapping(const std::string& path, bool headerless) : file(path, "token file") {
    const std::string what = "token file " + path + ": ";
    const uint64_t bytes = file.size();
    const int64_t header = headerless ? 0 : token_file_header_bytes;
    if (static_cast<int64_t>(bytes) < header)
      throw Error(ErrorKind::data, what + "only " + std::to_string(bytes) + " bytes, shorter than the " +
                                       std::to_string(header) + "-byte header");
    const unsigned char* b = file.data();
    if (headerless) {
      if (bytes % 2) throw Error(ErrorKind::data, what + "odd size " + std::to_string(bytes) + " for headerless uint16 tokens");
      n = static_cast<int64_t>(bytes / 2);
      tokens = b;
      return;
    }
    const int32_t magic = le_i32(b), version = le_i32(b + 4), count = le_i32(b + 8);
    if (magic == token_file_magic && version == token_file_version) {
      width = 2;
    } else if (magic == wide_token_file_magic && version == wide_token_file_version) {
      width = 4;
    } else if (magic != token_file_magic && magic != wide_token_file_magic) {
      throw Error(ErrorKind::data, what + "bad magic number " + std::to_string(magic) + " (expected " +
                                       std::to_string(token_file_magic) + " or " + std::to_string(wide_token_file_magic) +
                                       "); not an llm.c token file");
    } else {
      throw Error(ErrorKind::data, what + "unsupported version " + std::to_string(version) + " for magic " + std::to_string(magic));
    }
    if (count < 0) throw Error(ErrorKind::data, what + "negative token count " + std::to_string(count) + " in the header");
    const int64_t expected = token_file_header_bytes + int64_t(width) * count;
    if (static_cast<int64_t>(bytes) != expected)
      throw Error(ErrorKind::data, what + "size " + std::to_string(bytes) + " bytes disagrees with the header's count of " +
                                       std::to_string(count) + " tokens (expected " + std::to_string(expected) + " bytes)");
    n = count;
    tokens = b + token_file_header_bytes;
    file.advise_random();  // windows are drawn at random: no read-ahead
  }

  int32_t at(int64_t i) const {
    const unsigned char* p = tokens + i * width;
    return width == 2 ? int32_t(p[0]) | int32_t(p[1]) << 8 : le_i32(p);
  }
  void release(int64_t begin, int64_t end) const {
    const uint64_t off = static_cast<uint64_t>(tokens - file.data());
    file.release(off + static_cast<uint64_t>(begin * width), off + static_cast<uint64_t>(end * width));
  }
};

TokenSeq::TokenSeq(std::vector<int32_t> ids)
    : mem_(std::make_shared<const std::vector<int32_t>>(std::move(ids))), n_(static_cast<int64_t>(mem_->size())) {}

TokenSeq TokenSeq::map_files(const std::vector<std::string>& paths, bool headerless) {
  TokenSeq s;
  for (const std::string& p : paths) {
    auto m = std::make_shared<const Mapping>(p, headerless);
    s.starts_.push_back(s.n_);
    s.n_ += m->n;
    s.maps_.push_back(std::move(m));
  }
  return s;
}

TokenSeq TokenSeq::concat(const TokenSeq& a, const TokenSeq& b) {
  if (a.mem_ || b.mem_ || a.empty() || b.empty()) {
    if (a.empty()) return b;
    if (b.empty()) return a;
    std::vector<int32_t> v = a.to_vector(), w = b.to_vector();
    v.insert(v.end(), w.begin(), w.end());
    return TokenSeq(std::move(v));
  }
  TokenSeq s = a;
  for (size_t k = 0; k < b.maps_.size(); k++) {
    s.starts_.push_back(a.n_ + b.starts_[k]);
    s.maps_.push_back(b.maps_[k]);
  }
  s.n_ = a.n_ + b.n_;
  return s;
}

int32_t TokenSeq::operator[](int64_t i) const {
  if (mem_) return (*mem_)[static_cast<size_t>(i)];
  const size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) - 1;
  return maps_[k]->at(i - starts_[k]);
}

void TokenSeq::copy(int64_t start, int64_t n, int32_t* out) const {
  if (start < 0 || n < 0 || start + n > n_)
    throw Error(ErrorKind::data, "token range [" + std::to_string(start) + ", " + std::to_string(start + n) +
                                     ") runs past the " + std::to_string(n_) + " tokens");
  if (mem_) {
    std::copy_n(mem_->data() + start, n, out);
    return;
  }
  size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin()) - 1;
  while (n > 0) {
    const Mapping& m = *maps_[k];
    const int64_t off = start - starts_[k], take = std::min(n, m.n - off);
    if (m.width == 2) {
      const unsigned char* p = m.tokens + off * 2;
      for (int64_t i = 0; i < take; i++) out[i] = int32_t(p[2 * i]) | int32_t(p[2 * i + 1]) << 8;
    } else {
      for (int64_t i = 0; i < take; i++) out[i] = m.at(off + i);
    }
    out += take, start += take, n -= take;
    k++;
  }
}

void TokenSeq::release(int64_t begin, int64_t end) const {
  if (mem_ || begin >= end) return;
  for (size_t k = 0; k < maps_.size(); k++) {
    const int64_t lo = std::max(begin, starts_[k]), hi = std::min(end, starts_[k] + maps_[k]->n);
    if (lo < hi) maps_[k]->release(lo - starts_[k], hi - starts_[k]);
  }
}

std::vector<int32_t> TokenSeq::to_vector() const {
  if (mem_) return *mem_;
  std::vector<int32_t> v(static_cast<size_t>(n_));
  copy(0, n_, v.data());
  return v;
}

void TokenSeq::check_below(int64_t vocab_size, const std::string& what) const {
  auto fail = [&](const std::string& where, int32_t id, int64_t pos) {
    throw Error(ErrorKind::data, where + ": token id " + std::to_string(id) + " at position " + std::to_string(pos) +
                                     (id < 0 ? " is negative" : " is >= vocab_size " + std::to_string(vocab_size)));
  };
  if (mem_) {
    for (size_t i = 0; i < mem_->size(); i++)
      if ((*mem_)[i] < 0 || (*mem_)[i] >= vocab_size) fail(what, (*mem_)[i], static_cast<int64_t>(i));
    return;
  }
  // In blocks whose pages are released after the scan, so checking a large corpus costs no memory.
  const int64_t block = 1 << 22;
  for (const auto& m : maps_) {
    for (int64_t b = 0; b < m->n; b += block) {
      const int64_t e = std::min(m->n, b + block);
      for (int64_t i = b; i < e; i++) {
        const int32_t id = m->at(i);
        if (id < 0 || id >= vocab_size) fail("token file " + m->file.path(), id, i);
      }
      m->release(b, e);
    }
  }
}

std::string TokenSeq::fingerprint() const {
  if (mem_) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
    for (int32_t v : *mem_) h = (h ^ static_cast<uint32_t>(v)) * 1099511628211ull;
    return std::to_string(n_) + ":" + std::to_string(h);
  }
  std::string s;
  for (const auto& m : maps_) s += fs::path(m->file.path()).filename().string() + "=" + std::to_string(m->n) + ";";
  return s;
}

bool TokenSeq::operator==(const std::vector<int32_t>& ids) const {
  return static_cast<int64_t>(ids.size()) == n_ && to_vector() == ids;
}

// ---- writing ------------------------------------------------------------------------------------

ShardWriter::ShardWriter(Place place, std::string prefix, bool wide, int64_t max_tokens)
    : place_(std::move(place)), prefix_(std::move(prefix)), wide_(wide), max_tokens_(std::max<int64_t>(1, max_tokens)) {}

ShardWriter::ShardWriter(const std::string& dir, std::string prefix, bool wide, int64_t max_tokens)
    : ShardWriter([dir](const std::string& name) { return (fs::path(dir) / name).string(); }, std::move(prefix), wide, max_tokens) {}

ShardWriter::~ShardWriter() {
  if (file_) std::fclose(static_cast<std::FILE*>(file_));
}

void ShardWriter::open_next() {
  char name[64];
  std::snprintf(name, sizeof name, "%s_%06zu.bin", prefix_.c_str(), shards_.size());
  path_ = place_(name);
  const std::string& path = path_;
  errno = 0;
  file_ = std::fopen(path.c_str(), "wb");
  if (!file_) throw Error(ErrorKind::data, "cannot write " + path + ": " + std::strerror(errno));
  const std::string zeros(token_file_header_bytes, '\0');  // the header, once the count is known
  if (std::fwrite(zeros.data(), 1, zeros.size(), static_cast<std::FILE*>(file_)) != zeros.size())
    throw Error(ErrorKind::data, "cannot write " + path + ": " + std::strerror(errno));
  shards_.emplace_back(name, 0);
  in_current_ = 0;
}

void ShardWriter::close_current() {
  auto* f = static_cast<std::FILE*>(file_);
  const std::string& path = path_;
  const std::string h = token_file_header(wide_ ? wide_token_file_magic : token_file_magic,
                                          wide_ ? wide_token_file_version : token_file_version, static_cast<uint32_t>(in_current_));
  bool ok = std::fseek(f, 0, SEEK_SET) == 0 && std::fwrite(h.data(), 1, h.size(), f) == h.size() && std::fflush(f) == 0 &&
            ::fsync(::fileno(f)) == 0;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  file_ = nullptr;
  if (!ok) throw Error(ErrorKind::data, "cannot write " + path + ": " + std::strerror(err));
  shards_.back().second = in_current_;
}

void ShardWriter::write(const std::vector<int32_t>& ids) {
  const int64_t limit = wide_ ? INT32_MAX : 65535;
  size_t i = 0;
  while (i < ids.size()) {
    if (!file_) open_next();
    const size_t take = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(ids.size() - i), max_tokens_ - in_current_));
    buf_.clear();
    for (size_t k = i; k < i + take; k++) {
      const int32_t v = ids[k];
      if (v < 0 || v > limit) throw Error(ErrorKind::data, "token id " + std::to_string(v) + " does not fit the shard's width");
      buf_ += static_cast<char>(v & 0xFF);
      buf_ += static_cast<char>((v >> 8) & 0xFF);
      if (wide_) {
        buf_ += static_cast<char>((v >> 16) & 0xFF);
        buf_ += static_cast<char>((v >> 24) & 0xFF);
      }
    }
    if (std::fwrite(buf_.data(), 1, buf_.size(), static_cast<std::FILE*>(file_)) != buf_.size())
      throw Error(ErrorKind::data, "cannot write " + path_ + ": " + std::strerror(errno));
    in_current_ += static_cast<int64_t>(take);
    total_ += static_cast<int64_t>(take);
    i += take;
    if (in_current_ == max_tokens_) close_current();
  }
}

void ShardWriter::finish() {
  if (!file_ && shards_.empty()) open_next();
  if (file_) close_current();
}

}  // namespace tapelm
