#include "train/formats/gguf_file.h"


#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "autograd/runtime.h"
#include "autograd/float16.h"
#include "autograd/quant.h"

namespace tapelm::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlign = 32;  // general.alignment's default
enum ValueType : uint32_t { U32 = 4, I32 = 5, F32V = 6, BOOL = 7, STRING = 8, ARRAY = 9 };

struct Reader {
  const uint8_t* p;
  uint64_t n, pos = 0;
  std::string path;
  [[noreturn]] void fail(const std::string& why) const { throw Error(ErrorKind::data, "GGUF file " + path + ": " + why); }
  void need(uint64_t k, const std::string& what) const {
    if (k > n - pos)
      fail(what + " at byte " + std::to_string(pos) + " runs past the end of the file (" + std::to_string(n) + " bytes)");
  }
  template <class T> T get(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string str(const std::string& what) {
    const uint64_t len = get<uint64_t>(what + "'s length");
    need(len, what + " of " + std::to_string(len) + " bytes");
    std::string s(reinterpret_cast<const char*>(p + pos), len);
    pos += len;
    return s;
  }
};

// Bytes one element of a value type takes at least (strings: their length field).
uint64_t min_size(uint32_t t) {
  static const uint64_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 0, 8, 8, 8};
  return t < 13 && t != 9 ? sizes[t] : 0;
}

double scalar(Reader& r, uint32_t t, const std::string& what, bool& is_int, int64_t& iv) {
  is_int = t != 6 && t != 12 && t != 7;
  switch (t) {
    case 0: return double(iv = r.get<uint8_t>(what));
    case 1: return double(iv = r.get<int8_t>(what));
    case 2: return double(iv = r.get<uint16_t>(what));
    case 3: return double(iv = r.get<int16_t>(what));
    case 4: return double(iv = r.get<uint32_t>(what));
    case 5: return double(iv = r.get<int32_t>(what));
    case 6: return r.get<float>(what);
    case 7: {
      const uint8_t b = r.get<uint8_t>(what);
      if (b > 1) r.fail(what + " is a bool of value " + std::to_string(b));
      return b;
    }
    case 10: {
      const uint64_t u = r.get<uint64_t>(what);
      if (u > uint64_t(INT64_MAX)) r.fail(what + " is " + std::to_string(u) + ", beyond any count tapelm reads");
      return double(iv = static_cast<int64_t>(u));
    }
    case 11: return double(iv = r.get<int64_t>(what));
    case 12: return r.get<double>(what);
  }
  r.fail(what + " has value type " + std::to_string(t) + ", which GGUF does not define");
}

Value read_value(Reader& r, uint32_t t, const std::string& key) {
  Value v;
  v.type = t;
  if (t == 8) {
    v.str = r.str("the value of " + key);
  } else if (t == 9) {
    v.elem = r.get<uint32_t>("the element type of " + key);
    const uint64_t count = r.get<uint64_t>("the length of " + key);
    if (v.elem == 9) r.fail(key + " is an array of arrays, which tapelm does not read");
    const uint64_t m = min_size(v.elem);
    if (m == 0) r.fail(key + " is an array of value type " + std::to_string(v.elem) + ", which GGUF does not define");
    if (count > (r.n - r.pos) / m)
      r.fail(key + " claims " + std::to_string(count) + " elements, more than the rest of the file can hold");
    for (uint64_t k = 0; k < count; k++) {
      if (v.elem == 8) {
        v.strs.push_back(r.str(key + "[" + std::to_string(k) + "]"));
      } else {
        bool is_int;
        int64_t iv = 0;
        v.nums.push_back(scalar(r, v.elem, key + "[" + std::to_string(k) + "]", is_int, iv));
      }
    }
  } else {
    v.num = scalar(r, t, key, v.is_int, v.i);
  }
  return v;
}

}  // namespace

const char* type_name(uint32_t t) {
  switch (t) {
    case T_F32: return "F32";
    case T_F16: return "F16";
    case T_Q8_0: return "Q8_0";
    case T_BF16: return "BF16";
  }
  return "?";
}

uint64_t tensor_bytes(uint32_t type, uint64_t count) {
  return type == T_F32 ? 4 * count : type == T_Q8_0 ? count / 32 * 34 : 2 * count;
}

std::vector<uint8_t> quantize_q8_0(const float* x, int64_t n, const std::string& what) {
  std::vector<uint8_t> out(static_cast<size_t>(tapelm::q8_0_bytes(n)));
  const int64_t bad = tapelm::quantize_q8_0(out.data(), x, n);
  if (bad >= 0) {
    float amax = 0;
    for (int64_t j = 0; j < kQ8Block; j++) amax = std::max(amax, std::fabs(x[bad * kQ8Block + j]));
    throw Error(ErrorKind::data, what + ": the block of 32 values from element " + std::to_string(bad * kQ8Block) +
                                     " reaches " + std::to_string(amax) +
                                     ", beyond what a q8_0 block's F16 scale can hold (127 x 65504)");
  }
  return out;
}

std::vector<float> dequantize_q8_0(const uint8_t* q, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  tapelm::dequantize_q8_0(out.data(), q, n);
  return out;
}

// ---- reading --------------------------------------------------------------------------------------

File::File(const std::string& path) : path_(path), map_(path, "GGUF file") { parse(); }

void File::fail(const std::string& why) const { throw Error(ErrorKind::data, "GGUF file " + path_ + ": " + why); }

const Value* File::find_key(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::string File::string(const std::string& key, bool required) const {
  const Value* v = find_key(key);
  if (!v) {
    if (required) fail("key " + key + " is missing");
    return "";
  }
  if (v->type != STRING) fail("key " + key + " is not a string");
  return v->str;
}

int64_t File::count(const std::string& key, int64_t dflt, int64_t max) const {
  const Value* v = find_key(key);
  if (!v) {
    if (dflt < 0) fail("key " + key + " is missing");
    return dflt;
  }
  if (v->type == ARRAY) fail("key " + key + " is an array (per-layer values), which tapelm does not read");
  if (!v->is_int || v->i < 0 || v->i > max)
    fail("key " + key + " is " + (v->is_int ? std::to_string(v->i) : std::to_string(v->num)) + ", not a count up to " + std::to_string(max));
  return v->i;
}

double File::real(const std::string& key, double dflt, bool required) const {
  const Value* v = find_key(key);
  if (!v) {
    if (required) fail("key " + key + " is missing");
    return dflt;
  }
  if (v->type == STRING || v->type == ARRAY || v->type == BOOL || !std::isfinite(v->num)) fail("key " + key + " is not a finite number");
  return v->num;
}

bool File::flag(const std::string& key, bool dflt) const {
  const Value* v = find_key(key);
  if (!v) return dflt;
  if (v->type != BOOL) fail("key " + key + " is not a bool");
  return v->num != 0;
}

const std::vector<std::string>& File::strings(const std::string& key) const {
  const Value* v = find_key(key);
  if (!v || v->type != ARRAY || v->elem != STRING) fail("key " + key + " is missing or not an array of strings");
  return v->strs;
}

const std::vector<double>& File::numbers(const std::string& key, size_t n) const {
  const Value* v = find_key(key);
  if (!v || v->type != ARRAY || v->elem == STRING || v->elem == ARRAY || v->nums.size() != n)
    fail("key " + key + " is missing or not an array of " + std::to_string(n) + " numbers");
  return v->nums;
}

std::vector<int64_t> File::counts(const std::string& key, size_t n, int64_t dflt, int64_t max) const {
  const Value* v = find_key(key);
  if (!v || v->type != ARRAY) return std::vector<int64_t>(n, count(key, dflt, max));
  const std::vector<double>& xs = numbers(key, n);
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; i++) {
    if (!(xs[i] >= 0 && xs[i] <= static_cast<double>(max) && xs[i] == std::floor(xs[i])))
      fail("key " + key + "[" + std::to_string(i) + "] is " + std::to_string(xs[i]) + ", not a count up to " + std::to_string(max));
    out.push_back(static_cast<int64_t>(xs[i]));
  }
  return out;
}

const TensorInfo* File::tensor(const std::string& name) const {
  auto it = table_.find(name);
  return it == table_.end() ? nullptr : &it->second;
}

const formats::TensorSource::Info* File::find(const std::string& name) const {
  auto it = info_at_.find(name);
  return it == info_at_.end() ? nullptr : &infos_[it->second];
}

void File::parse() {
  const MappedFile& m = map_;
  Reader r{m.data(), m.size(), 0, path_};
  if (m.size() < 4 || r.get<uint32_t>("the magic") != kMagic) r.fail("does not start with GGUF's magic \"GGUF\"");
  const uint32_t version = r.get<uint32_t>("the version");
  if (version != 2 && version != 3) r.fail("version " + std::to_string(version) + ": tapelm reads GGUF 2 and 3");
  const uint64_t n_tensors = r.get<uint64_t>("the tensor count"), n_kv = r.get<uint64_t>("the metadata count");
  if (n_kv > (r.n - r.pos) / 13) r.fail("claims " + std::to_string(n_kv) + " metadata entries, more than the file can hold");
  for (uint64_t k = 0; k < n_kv; k++) {
    const std::string key = r.str("metadata key " + std::to_string(k));
    const uint32_t t = r.get<uint32_t>("the value type of " + key);
    Value v = read_value(r, t, key);
    if (!kv_.emplace(key, std::move(v)).second) r.fail("key " + key + " appears twice");
  }
  if (n_tensors > (r.n - r.pos) / 24) r.fail("claims " + std::to_string(n_tensors) + " tensors, more than the file can hold");
  std::vector<TensorInfo> order;
  for (uint64_t k = 0; k < n_tensors; k++) {
    TensorInfo t;
    t.name = r.str("tensor name " + std::to_string(k));
    const uint32_t nd = r.get<uint32_t>("the dimension count of " + t.name);
    if (nd < 1 || nd > 4) r.fail("tensor " + t.name + " has " + std::to_string(nd) + " dimensions (1 to 4 are read)");
    t.count = 1;
    for (uint32_t d = 0; d < nd; d++) {
      const uint64_t e = r.get<uint64_t>("a dimension of " + t.name);
      if (e == 0 || e > (uint64_t(1) << 40) || t.count > (uint64_t(1) << 40) / e)
        r.fail("tensor " + t.name + " has dimension " + std::to_string(e) + ": its element count is zero or overflows");
      t.ne.push_back(e);
      t.count *= e;
    }
    t.type = r.get<uint32_t>("the type of " + t.name);
    if (t.type != T_F32 && t.type != T_F16 && t.type != T_BF16 && t.type != T_Q8_0)
      r.fail("tensor " + t.name + " has ggml type " + std::to_string(t.type) + ": tapelm reads F32 (0), F16 (1), Q8_0 (8) and BF16 (30)");
    if (t.type == T_Q8_0 && t.ne[0] % 32) r.fail("tensor " + t.name + " is Q8_0 with rows of " + std::to_string(t.ne[0]) + ", not a multiple of 32");
    t.offset = r.get<uint64_t>("the offset of " + t.name);
    t.bytes = tensor_bytes(t.type, t.count);
    order.push_back(t);
  }
  uint64_t align = kAlign;
  if (const Value* a = find_key("general.alignment")) {
    if (!a->is_int || a->i <= 0 || a->i > 65536 || (a->i & (a->i - 1))) r.fail("general.alignment is not a power of two up to 65536");
    align = static_cast<uint64_t>(a->i);
  }
  const uint64_t data_start = (r.pos + align - 1) / align * align;
  if (data_start > m.size()) r.fail("the tensor data would start at byte " + std::to_string(data_start) + ", past the end of the file");
  const uint64_t data_bytes = m.size() - data_start;
  std::sort(order.begin(), order.end(), [](const TensorInfo& a, const TensorInfo& b) { return a.offset < b.offset; });
  uint64_t end = 0;
  for (const TensorInfo& t : order) {
    if (t.offset % align) r.fail("tensor " + t.name + " starts at data offset " + std::to_string(t.offset) + ", not a multiple of the alignment " + std::to_string(align));
    if (t.offset > data_bytes || t.bytes > data_bytes - t.offset)
      r.fail("tensor " + t.name + " (" + std::to_string(t.bytes) + " bytes at data offset " + std::to_string(t.offset) + ") runs past the end of the file");
    if (t.offset < end) r.fail("tensor " + t.name + " overlaps the tensor before it");
    end = t.offset + t.bytes;
    if (!table_.emplace(t.name, t).second) r.fail("tensor " + t.name + " appears twice");
  }
  data_ = m.data() + data_start;
  for (const auto& [name, t] : table_) {
    info_at_[name] = infos_.size();
    infos_.push_back({name, Shape(t.ne.rbegin(), t.ne.rend()), type_name(t.type)});  // ne reversed: row-major
  }
  // the source's order is the file's table order as written (by offset)
  std::sort(infos_.begin(), infos_.end(), [&](const Info& a, const Info& b) { return table_.at(a.name).offset < table_.at(b.name).offset; });
  for (size_t i = 0; i < infos_.size(); i++) info_at_[infos_[i].name] = i;
}

void File::read_f32(const Info& info, float* v) const {
  const TensorInfo& t = table_.at(info.name);
  map_.check_unchanged();  // and again once read (data/io.h)
  const uint8_t* b = data_ + t.offset;
  if (t.type == T_F32) {
    std::memcpy(v, b, t.count * 4);
  } else if (t.type == T_Q8_0) {
    tapelm::dequantize_q8_0(v, b, static_cast<int64_t>(t.count));
  } else {
    const int64_t n = static_cast<int64_t>(t.count), chunk = int64_t(1) << 20;
    parallel_for((n + chunk - 1) / chunk, [&](int64_t c) {
      for (int64_t i = c * chunk, end = std::min(n, i + chunk); i < end; i++) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        v[i] = t.type == T_F16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
    });
  }
  const uint64_t at = static_cast<uint64_t>(data_ - map_.data()) + t.offset;
  map_.release(at, at + t.bytes);  // read once: out of the resident set (safetensors.cpp)
  map_.check_unchanged();
  if (const int64_t i = formats::first_non_finite(v, static_cast<int64_t>(t.count)); i >= 0)
    fail("tensor " + t.name + " holds a non-finite value at element " + std::to_string(i));
}

int64_t File::map_offset(const Info& info) const {
  return static_cast<int64_t>(data_ - map_.data()) + static_cast<int64_t>(table_.at(info.name).offset);
}

std::shared_ptr<const MappedFile> File::map(const Info& info) const {
  const TensorInfo& t = table_.at(info.name);
  map_.check_unchanged();
  const uint64_t at = static_cast<uint64_t>(data_ - map_.data()) + t.offset;
  auto w = std::make_shared<const MappedFile>(path_, "GGUF file", at, t.bytes, true);
  if (!w->same_file_as(map_)) fail("is another file than the one opened (replaced while it was read): read it again once it is written whole");
  return w;
}

// ---- writing --------------------------------------------------------------------------------------

void Meta::s(const std::string& v) { put<uint64_t>(v.size()), b_ += v; }
void Meta::head(const std::string& key, uint32_t t) { s(key), put<uint32_t>(t), n_++; }
void Meta::str(const std::string& key, const std::string& v) { head(key, STRING), s(v); }
void Meta::u32(const std::string& key, uint64_t v) { head(key, U32), put<uint32_t>(static_cast<uint32_t>(v)); }
void Meta::f32(const std::string& key, double v) { head(key, F32V), put<float>(static_cast<float>(v)); }
void Meta::flag(const std::string& key, bool v) { head(key, BOOL), put<uint8_t>(v ? 1 : 0); }
void Meta::strs(const std::string& key, const std::vector<std::string>& v) {
  head(key, ARRAY), put<uint32_t>(STRING), put<uint64_t>(v.size());
  for (const std::string& x : v) s(x);
}
void Meta::f32s(const std::string& key, const std::vector<float>& v) {
  head(key, ARRAY), put<uint32_t>(F32V), put<uint64_t>(v.size());
  for (float x : v) put<float>(x);
}
void Meta::i32s(const std::string& key, const std::vector<int32_t>& v) {
  head(key, ARRAY), put<uint32_t>(I32), put<uint64_t>(v.size());
  for (int32_t x : v) put<int32_t>(x);
}
void Meta::u32s(const std::string& key, const std::vector<int64_t>& v) {
  head(key, ARRAY), put<uint32_t>(U32), put<uint64_t>(v.size());
  for (int64_t x : v) put<uint32_t>(static_cast<uint32_t>(x));
}

namespace {

uint64_t padded(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t out_bytes(const OutTensor& t) {
  uint64_t n = 1;
  for (uint64_t d : t.ne) n *= d;
  return tensor_bytes(t.type, n);
}

}  // namespace

std::string head_bytes(const Meta& meta, const std::vector<OutTensor>& tensors) {
  std::string head;
  auto put32 = [&](uint32_t v) { head.append(reinterpret_cast<const char*>(&v), 4); };
  auto put64 = [&](uint64_t v) { head.append(reinterpret_cast<const char*>(&v), 8); };
  put32(kMagic);
  put32(kVersion);
  put64(tensors.size());
  put64(meta.count());
  head += meta.bytes();
  uint64_t offset = 0;
  for (const OutTensor& t : tensors) {
    put64(t.name.size());
    head += t.name;
    put32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) put64(d);
    put32(t.type);
    put64(offset);
    offset += padded(out_bytes(t));
  }
  head.resize(padded(head.size()), '\0');
  return head;
}

std::string tensor_bytes(const OutTensor& t, const std::vector<float>& v, const std::string& what) {
  std::string b;
  if (t.type == T_F32) {
    b.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  } else if (t.type == T_Q8_0) {
    const std::vector<uint8_t> q = quantize_q8_0(v.data(), static_cast<int64_t>(v.size()), "cannot write " + what + ": tensor " + t.name);
    b.assign(q.begin(), q.end());
  } else {
    b.resize(v.size() * 2);
    for (size_t i = 0; i < v.size(); i++) {
      const uint16_t h = t.type == T_F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      if (t.type == T_F16 && (h & 0x7c00u) == 0x7c00u)
        throw Error(ErrorKind::data, "cannot write " + what + ": tensor " + t.name + " holds " + std::to_string(v[i]) + " at element " +
                                         std::to_string(i) + ", beyond F16's range (65504): export as bf16 or f32");
      std::memcpy(&b[2 * i], &h, 2);
    }
  }
  if (b.size() != out_bytes(t)) throw Error(ErrorKind::internal, what + ": tensor " + t.name + " came out the wrong size");
  b.resize(padded(b.size()), '\0');
  return b;
}

std::vector<uint64_t> tensor_offsets(const Meta& meta, const std::vector<OutTensor>& tensors) {
  uint64_t at = head_bytes(meta, tensors).size();
  std::vector<uint64_t> out;
  for (const OutTensor& t : tensors) {
    out.push_back(at);
    at += padded(out_bytes(t));
  }
  return out;
}

uint64_t file_size(const Meta& meta, const std::vector<OutTensor>& tensors) {
  uint64_t n = head_bytes(meta, tensors).size();
  for (const OutTensor& t : tensors) n += padded(out_bytes(t));
  return n;
}

void write(std::FILE* f, const Meta& meta, const std::vector<OutTensor>& tensors, const std::string& what) {
  auto put = [&](const std::string& b) {
    if (std::fwrite(b.data(), 1, b.size(), f) != b.size()) throw Error(ErrorKind::data, "cannot write " + what + ": " + std::strerror(errno));
  };
  put(head_bytes(meta, tensors));
  for (const OutTensor& t : tensors) put(tensor_bytes(t, t.values(), what));
}

}  // namespace tapelm::gguf
