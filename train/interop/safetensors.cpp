#include "train/interop/safetensors.h"


#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "autograd/error.h"
#include "data/io.h"
#include "nn/config.h"
#include "train/interop/float16.h"

namespace tapelm::safetensors {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error(ErrorKind::data, "safetensors file " + path + ": " + why);
}

// Parses the header: a JSON object at most three levels deep (file -> entry -> shape), no name
// twice at the top (the reference's map would keep one silently).
json parse_header(const std::string& path, std::string_view text) {
  std::unordered_set<std::string> names;
  auto check = [&](int depth, json::parse_event_t ev, json& v) {
    using E = json::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= 3) fail(path, "header JSON nests deeper than a tensor entry");
    if (ev == E::key && depth == 1 && !names.insert(v.get<std::string>()).second)
      fail(path, "tensor '" + cut_for_message(v.get<std::string>()) + "' appears twice in the header");
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::parse_error& e) {
    fail(path, "header is not valid JSON: " + cut_for_message(e.what(), 200));
  }
}

// A JSON value as a non-negative integer that fits in uint64, or the error.
uint64_t as_count(const std::string& path, const std::string& where, const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  fail(path, where + " must be a non-negative integer, got " + echo_json(v));
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int dtype_size(const std::string& d) {
  static const std::map<std::string, int> sizes{{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                                {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                                {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  f.map_.emplace(path, "safetensors file");
  f.size_ = f.map_->size();
  if (f.size_ < 8) fail(path, "truncated: " + std::to_string(f.size_) + " bytes, shorter than the 8-byte header length");
  const unsigned char* map = f.map_->data();

  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | map[i];
  if (n > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(n) + " exceeds the format's limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > f.size_ - 8)
    fail(path, "header length " + std::to_string(n) + " runs past the file's end (" + std::to_string(f.size_) + " bytes)");
  f.data_start_ = 8 + n;
  const json h = parse_header(path, std::string_view(reinterpret_cast<const char*>(map + 8), n));
  if (!h.is_object()) fail(path, "header is not a JSON object");

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string()) fail(path, "__metadata__ value '" + cut_for_message(m.key()) + "' is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string at = "tensor '" + cut_for_message(name) + "'";
    if (!e.is_object()) fail(path, at + " is not an object with dtype, shape and data_offsets");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!e.contains(key)) fail(path, at + " has no " + key);
    TensorInfo t;
    t.name = name;
    if (!e["dtype"].is_string()) fail(path, at + " dtype must be a string, got " + echo_json(e["dtype"]));
    t.dtype = e["dtype"].get<std::string>();
    const int esize = dtype_size(t.dtype);
    if (esize == 0) fail(path, at + " has unknown dtype '" + cut_for_message(t.dtype) + "'");
    if (!e["shape"].is_array()) fail(path, at + " shape must be an array, got " + echo_json(e["shape"]));
    uint64_t numel = 1;
    for (const json& s : e["shape"]) {
      const uint64_t dim = as_count(path, at + " shape", s);
      if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel) ||
          numel > static_cast<uint64_t>(INT64_MAX))
        fail(path, at + " shape " + cut_for_message(e["shape"].dump()) + " has more elements than fit in 64 bits");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2) fail(path, at + " data_offsets must be [begin, end], got " + echo_json(off));
    t.begin = as_count(path, at + " data_offsets", off[0]);
    t.end = as_count(path, at + " data_offsets", off[1]);
    if (t.end < t.begin) fail(path, at + " data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] end before they begin");
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(esize), &nbytes) || nbytes != t.end - t.begin)
      fail(path, at + " shape " + cut_for_message(e["shape"].dump()) + " of " + t.dtype + " needs " + std::to_string(numel) + " x " +
                     std::to_string(esize) + " bytes, its data_offsets hold " + std::to_string(t.end - t.begin));
    f.tensors_.push_back(std::move(t));
  }
  std::sort(f.tensors_.begin(), f.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t at = 0;
  const uint64_t data = f.size_ - f.data_start_;
  for (const TensorInfo& t : f.tensors_) {
    if (t.begin != at)
      fail(path, "tensor '" + cut_for_message(t.name) + "' begins at data offset " + std::to_string(t.begin) + ", expected " +
                     std::to_string(at) + (t.begin < at ? " (it overlaps the tensor before it)" : " (a gap before it)"));
    at = t.end;
  }
  if (at != data)
    fail(path, "the tensors cover " + std::to_string(at) + " bytes of data, the file holds " + std::to_string(data) +
                   (at > data ? " (truncated)" : " (trailing bytes)"));
  for (size_t i = 0; i < f.tensors_.size(); i++) f.index_[f.tensors_[i].name] = i;
  return f;
}

File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

const TensorInfo* File::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::string_view File::bytes(const TensorInfo& t) const {
  return {reinterpret_cast<const char*>(map_->data() + data_start_ + t.begin), static_cast<size_t>(t.end - t.begin)};
}

void File::read_f32(const TensorInfo& t, float* out) const {
  const unsigned char* p = map_->data() + data_start_ + t.begin;
  const int64_t n = t.numel();
  if (t.dtype == "F32") {
    std::memcpy(out, p, static_cast<size_t>(n) * 4);
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    const bool bf = t.dtype == "BF16";
    for (int64_t i = 0; i < n; i++) {
      const uint16_t h = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
      out[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
    }
  } else if (t.dtype == "F64") {
    for (int64_t i = 0; i < n; i++) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    fail(path_, "tensor '" + cut_for_message(t.name) + "' has dtype " + t.dtype + "; weights are read from F32, F16, BF16 or F64");
  }
}

namespace {

int out_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  throw Error(ErrorKind::usage, "safetensors dtype '" + dtype + "': tapelm writes F32, F16 or BF16");
}

uint64_t out_bytes(const OutTensor& t, int esize) {
  uint64_t n = static_cast<uint64_t>(esize);
  for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
  return n;
}

}  // namespace

std::string header_bytes(const std::vector<OutTensor>& tensors, const std::string& dtype,
                         const std::map<std::string, std::string>& metadata) {
  const int esize = out_size(dtype);
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const OutTensor& t : tensors) {
    const uint64_t n = out_bytes(t, esize);
    h[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {at, at + n}}};
    at += n;
  }
  std::string s = h.dump();
  s.append((8 - s.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; i++) out[i] = static_cast<char>((static_cast<uint64_t>(s.size()) >> (8 * i)) & 0xff);
  return out + s;
}

uint64_t file_size(const std::vector<OutTensor>& tensors, const std::string& dtype,
                   const std::map<std::string, std::string>& metadata) {
  uint64_t n = header_bytes(tensors, dtype, metadata).size();
  for (const OutTensor& t : tensors) n += out_bytes(t, out_size(dtype));
  return n;
}

void write(std::FILE* f, const std::vector<OutTensor>& tensors, const std::string& dtype,
           const std::map<std::string, std::string>& metadata, const std::string& what) {
  auto put = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f) != n) throw Error(ErrorKind::data, "cannot write " + what + ": " + std::strerror(errno));
  };
  const std::string h = header_bytes(tensors, dtype, metadata);
  put(h.data(), h.size());
  const int esize = out_size(dtype);
  std::vector<uint16_t> buf;
  for (const OutTensor& t : tensors) {
    const uint64_t n = out_bytes(t, esize) / static_cast<uint64_t>(esize);
    if (esize == 4) {
      put(t.data, n * 4);
      continue;
    }
    const bool bf = dtype == "BF16";
    constexpr uint64_t chunk = 1 << 16;
    for (uint64_t i = 0; i < n; i += chunk) {
      const uint64_t m = std::min(chunk, n - i);
      buf.resize(m);
      for (uint64_t j = 0; j < m; j++) buf[j] = bf ? f32_to_bf16(t.data[i + j]) : f32_to_f16(t.data[i + j]);
      put(buf.data(), m * 2);
    }
  }
}

}  // namespace tapelm::safetensors
