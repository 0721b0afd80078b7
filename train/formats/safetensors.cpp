#include "train/formats/safetensors.h"


#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "autograd/error.h"
#include "autograd/runtime.h"
#include "data/io.h"
#include "nn/config.h"
#include "autograd/float16.h"

namespace tapelm::safetensors {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error(ErrorKind::data, "safetensors file " + path + ": " + why);
}

// Parses the header: a JSON object at most three levels deep (file -> entry -> shape), no key
// twice in one object (the reference's map would keep one silently; its parser refuses a key
// repeated inside an entry).
json parse_header(const std::string& path, std::string_view text) {
  std::unordered_set<std::string> names, entry;  // the top level's keys; the open entry's
  std::string tensor;                            // the entry being read
  auto check = [&](int depth, json::parse_event_t ev, json& v) {
    using E = json::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= 3) fail(path, "header JSON nests deeper than a tensor entry");
    if (ev == E::key && depth == 1) {
      tensor = v.get<std::string>();
      entry.clear();
      if (!names.insert(tensor).second) fail(path, "tensor '" + cut_for_message(tensor) + "' appears twice in the header");
    }
    if (ev == E::key && depth == 2 && !entry.insert(v.get<std::string>()).second)
      fail(path, "tensor '" + cut_for_message(tensor) + "' has the key '" + cut_for_message(v.get<std::string>()) + "' twice");
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
  // The header alone is mapped here; each tensor is mapped when it is read (read_f32), so the
  // address space a streamed run holds is one tensor's, not the model's.
  const MappedFile none(path, "safetensors file", 0, 0);  // no bytes: the file's size
  f.size_ = none.file_size();
  if (f.size_ < 8) fail(path, "truncated: " + std::to_string(f.size_) + " bytes, shorter than the 8-byte header length");
  const MappedFile length(path, "safetensors file", 0, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | length.data()[i];
  if (n > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(n) + " exceeds the format's limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > f.size_ - 8)
    fail(path, "header length " + std::to_string(n) + " runs past the file's end (" + std::to_string(f.size_) + " bytes)");
  f.data_start_ = 8 + n;
  f.head_.emplace(path, "safetensors file", 0, 8 + n);
  if (!f.head_->same_file_as(length)) fail(path, "changed while its header was read");
  const json h = parse_header(path, std::string_view(reinterpret_cast<const char*>(f.head_->data() + 8), n));
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

MappedFile File::window(const TensorInfo& t, bool populate) const {
  head_->check_unchanged();  // names how it changed since it was opened
  MappedFile w(path_, "safetensors file", data_start_ + t.begin, t.end - t.begin, populate);
  if (!w.same_file_as(*head_)) fail(path_, "is another file than the one opened (replaced while it was read): read it again once it is written whole");
  return w;
}

std::string File::bytes(const TensorInfo& t) const {
  const MappedFile w = window(t);
  std::string out(reinterpret_cast<const char*>(w.data()), static_cast<size_t>(w.size()));
  w.check_unchanged();
  return out;
}

std::shared_ptr<const MappedFile> File::map(const TensorInfo& t) const { return std::make_shared<const MappedFile>(window(t, true)); }

void File::read_f32(const TensorInfo& t, float* out) const {
  const MappedFile w = window(t);  // checked again once read: a file written under the read is never mixed in
  const unsigned char* p = w.data();
  const int64_t n = t.numel();
  if (t.dtype == "F32") {
    std::memcpy(out, p, static_cast<size_t>(n) * 4);
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    const bool bf = t.dtype == "BF16";
    const int64_t chunk = int64_t(1) << 20;  // a large tensor is widened (and its pages faulted in) on every thread
    parallel_for((n + chunk - 1) / chunk, [&](int64_t c) {
      for (int64_t i = c * chunk, end = std::min(n, i + chunk); i < end; i++) {
        const uint16_t h = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
        out[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
      }
    });
  } else if (t.dtype == "F64") {
    for (int64_t i = 0; i < n; i++) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    fail(path_, "tensor '" + cut_for_message(t.name) + "' has dtype " + t.dtype + "; weights are read from F32, F16, BF16 or F64");
  }
  // Read once: the window is unmapped (its pages stay in the page cache), so that reading a model
  // larger than memory tensor by tensor grows neither the resident set nor the address space.
  w.check_unchanged();
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

std::string encode(const OutTensor& t, const std::vector<float>& v, const std::string& dtype, const std::string& what) {
  const int esize = out_size(dtype);
  if (v.size() * static_cast<uint64_t>(esize) != out_bytes(t, esize))
    throw Error(ErrorKind::internal, what + ": tensor " + t.name + " came out the wrong size");
  if (esize == 4) return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  const bool bf = dtype == "BF16";
  std::string b(v.size() * 2, '\0');
  for (size_t j = 0; j < v.size(); j++) {
    const uint16_t h = bf ? f32_to_bf16(v[j]) : f32_to_f16(v[j]);
    if ((h & 0x7c00u) == 0x7c00u && !bf)
      throw Error(ErrorKind::data, "cannot write " + what + ": tensor " + t.name + " holds " + std::to_string(v[j]) + " at element " +
                                       std::to_string(j) + ", beyond F16's range (65504): export as bf16 or f32");
    std::memcpy(&b[2 * j], &h, 2);
  }
  return b;
}

std::vector<uint64_t> data_offsets(const std::vector<OutTensor>& tensors, const std::string& dtype, uint64_t header_size) {
  const int esize = out_size(dtype);
  std::vector<uint64_t> at;
  for (const OutTensor& t : tensors) {
    at.push_back(header_size);
    header_size += out_bytes(t, esize);
  }
  return at;
}

void write(std::FILE* f, const std::vector<OutTensor>& tensors, const std::string& dtype,
           const std::map<std::string, std::string>& metadata, const std::string& what) {
  auto put = [&](const std::string& b) {
    if (!b.empty() && std::fwrite(b.data(), 1, b.size(), f) != b.size())
      throw Error(ErrorKind::data, "cannot write " + what + ": " + std::strerror(errno));
  };
  put(header_bytes(tensors, dtype, metadata));
  for (const OutTensor& t : tensors) put(encode(t, t.values(), dtype, what));
}

ShardPlan plan_shards(const std::vector<OutTensor>& tensors, const std::string& dtype, uint64_t max_bytes) {
  const int esize = out_size(dtype);
  ShardPlan p;
  p.shards.emplace_back();
  uint64_t in_shard = 0, total = 0;
  for (const OutTensor& t : tensors) {
    const uint64_t n = out_bytes(t, esize);
    if (in_shard > 0 && in_shard + n > max_bytes) p.shards.emplace_back(), in_shard = 0;
    p.shards.back().push_back(t);
    in_shard += n;
    total += n;
  }
  if (p.shards.size() == 1) {
    p.names.push_back("model.safetensors");
    return p;
  }
  nlohmann::ordered_json idx;
  idx["metadata"] = {{"total_size", total}};
  nlohmann::ordered_json wm = nlohmann::ordered_json::object();
  for (size_t i = 0; i < p.shards.size(); i++) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, p.shards.size());
    p.names.push_back(name);
    for (const OutTensor& t : p.shards[i]) wm[t.name] = name;
  }
  idx["weight_map"] = wm;
  p.index_json = idx.dump(2) + "\n";
  return p;
}

// ---- a model directory ------------------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

// A plain file name inside the model directory (an index naming "../x" or "/etc/x" is refused).
std::string shard_path(const std::string& dir, const std::string& name, const std::string& index) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw Error(ErrorKind::data, index + ": weight_map names \"" + cut_for_message(name) + "\", not a file name in " + dir);
  return (fs::path(dir) / name).string();
}

// The index's tensor -> file map, and the files in the order it first names them.
std::map<std::string, std::string> read_index(const std::string& dir, const std::string& index, std::vector<std::string>& files) {
  const json j = read_config_file(index);
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) throw Error(ErrorKind::data, index + ": has no weight_map object");
  std::map<std::string, std::string> weight_map;
  std::unordered_set<std::string> seen;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw Error(ErrorKind::data, index + ": weight_map." + cut_for_message(it.key()) + " is not a file name");
    const std::string p = shard_path(dir, it.value().get<std::string>(), index);
    weight_map[it.key()] = p;
    if (seen.insert(p).second) files.push_back(p);
  }
  if (files.empty()) throw Error(ErrorKind::data, index + ": weight_map names no tensor");
  return weight_map;
}

}  // namespace

std::unique_ptr<ModelFiles> ModelFiles::open(const std::string& dir) {
  auto m = std::make_unique<ModelFiles>();
  m->dir_ = dir;
  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // from the index
  if (fs::exists(single) || !fs::exists(index)) m->paths_.push_back(single.string());
  else weight_map = read_index(dir, index.string(), m->paths_);
  for (const std::string& p : m->paths_) m->files_.push_back(File::open(p));
  for (size_t k = 0; k < m->files_.size(); k++)
    for (const TensorInfo& t : m->files_[k].tensors()) {
      if (auto [it, fresh] = m->where_.emplace(t.name, std::make_pair(k, &t)); !fresh)
        throw Error(ErrorKind::data, "safetensors file " + m->paths_[k] + ": tensor '" + cut_for_message(t.name) + "' is also in " +
                                         m->paths_[it->second.first]);
      m->infos_.push_back({t.name, t.shape, t.dtype});
    }
  for (const auto& [name, file] : weight_map) {  // the index and the files agree, both ways
    auto it = m->where_.find(name);
    if (it == m->where_.end() || m->paths_[it->second.first] != file)
      throw Error(ErrorKind::data, index.string() + ": puts tensor '" + cut_for_message(name) + "' in " + file + ", which does not hold it");
  }
  if (!weight_map.empty())
    for (const auto& [name, at] : m->where_)
      if (!weight_map.count(name))
        throw Error(ErrorKind::data, index.string() + ": does not name tensor '" + cut_for_message(name) + "', which " +
                                         m->paths_[at.first] + " holds");
  return m;
}

const formats::TensorSource::Info* ModelFiles::find(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return nullptr;
  for (const Info& i : infos_)
    if (i.name == name) return &i;
  return nullptr;
}

void ModelFiles::read_f32(const Info& t, float* out) const {
  const auto& [k, entry] = where_.at(t.name);
  files_[k].read_f32(*entry, out);
  if (const int64_t i = formats::first_non_finite(out, entry->numel()); i >= 0)
    throw Error(ErrorKind::data, "safetensors file " + paths_[k] + ": tensor '" + cut_for_message(t.name) + "' holds a non-finite value at element " +
                                     std::to_string(i));
}

std::string ModelFiles::bytes(const Info& t) const {
  const auto& [k, entry] = where_.at(t.name);
  return files_[k].bytes(*entry);
}

int64_t ModelFiles::map_offset(const Info& t) const {
  const auto& [k, entry] = where_.at(t.name);
  return static_cast<int64_t>(files_[k].offset(*entry));
}

std::shared_ptr<const MappedFile> ModelFiles::map(const Info& t) const {
  const auto& [k, entry] = where_.at(t.name);
  return files_[k].map(*entry);
}

}  // namespace tapelm::safetensors
