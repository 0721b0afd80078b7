#pragma once
// The GGUF container (llama.cpp's ggml/src/gguf.cpp, version 3): a header, typed metadata
// key/values, a tensor table and aligned tensor data. Read as hostile input, written as llama.cpp
// writes it. Knows bytes, not models: gguf.cpp maps architectures onto it.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/io.h"
#include "train/formats/tensor_source.h"

namespace tapelm::gguf {

/// ggml's tensor types read and written here.
enum TensorType : uint32_t { T_F32 = 0, T_F16 = 1, T_Q8_0 = 8, T_BF16 = 30 };
/// "F32", "F16", "Q8_0", "BF16".
const char* type_name(uint32_t t);
/// Bytes `count` elements of a type take.
uint64_t tensor_bytes(uint32_t type, uint64_t count);

/// q8_0 as ggml stores it: blocks of 32 values, each an f16 scale d = max|x| / 127 and 32 int8
/// round(x / d) (34 bytes). n must be a multiple of 32. A block whose scale F16 cannot hold
/// (max|x| above 127 · 65504) -> data Error naming `what` and the value.
std::vector<uint8_t> quantize_q8_0(const float* x, int64_t n, const std::string& what = "q8_0");
/// The values a q8_0 block sequence stands for.
std::vector<float> dequantize_q8_0(const uint8_t* q, int64_t n);

/// A metadata value: scalars as a number (and an integer), strings, arrays of strings or numbers.
struct Value {
  uint32_t type = 0, elem = 0;
  double num = 0;
  bool is_int = false;
  int64_t i = 0;
  std::string str;
  std::vector<std::string> strs;
  std::vector<double> nums;
};

/// One tensor of the table: ne[0] is the row length.
struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t offset = 0, bytes = 0, count = 0;
};

/// A GGUF file (version 2 or 3), memory-mapped. Opening checks what the format promises: counts,
/// lengths and offsets within the file, dimensions whose product fits, aligned and non-overlapping
/// tensor data, known value and tensor types, no key or tensor twice; a data Error naming the
/// file and the key or tensor otherwise. It is a TensorSource (shapes row-major: ne reversed).
class File : public formats::TensorSource {
 public:
  explicit File(const std::string& path);
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& why) const;

  const Value* find_key(const std::string& key) const;
  /// The string at key ("" when absent and not required).
  std::string string(const std::string& key, bool required = true) const;
  /// A non-negative integer no larger than max, or dflt when absent (dflt < 0: required).
  int64_t count(const std::string& key, int64_t dflt = -1, int64_t max = int64_t(1) << 40) const;
  /// A finite number, or dflt when absent and not required.
  double real(const std::string& key, double dflt, bool required) const;
  bool flag(const std::string& key, bool dflt) const;
  /// An array of strings (required).
  const std::vector<std::string>& strings(const std::string& key) const;
  /// An array of n numbers (required).
  const std::vector<double>& numbers(const std::string& key, size_t n) const;
  /// A per-layer count: n values, each a count up to max — from an array of n integers, or one
  /// count for all (dflt when absent, dflt < 0: required).
  std::vector<int64_t> counts(const std::string& key, size_t n, int64_t dflt = -1, int64_t max = int64_t(1) << 40) const;
  /// The table, by name.
  const std::map<std::string, TensorInfo>& table() const { return table_; }
  const TensorInfo* tensor(const std::string& name) const;

  std::string what() const override { return "GGUF file " + path_; }
  const std::vector<Info>& tensors() const override { return infos_; }
  const Info* find(const std::string& name) const override;
  void read_f32(const Info& t, float* out) const override;
  /// The tensor's bytes in a window of their own (the whole file stays mapped beside it).
  std::shared_ptr<const MappedFile> map(const Info& t) const override;
  int64_t map_offset(const Info& t) const override;

 private:
  void parse();
  std::string path_;
  MappedFile map_;
  std::map<std::string, Value> kv_;
  std::map<std::string, TensorInfo> table_;
  std::vector<Info> infos_;
  std::map<std::string, size_t> info_at_;
  const uint8_t* data_ = nullptr;
};

/// The metadata section, serialized as it is built.
class Meta {
 public:
  void str(const std::string& key, const std::string& v);
  void u32(const std::string& key, uint64_t v);
  void f32(const std::string& key, double v);
  void flag(const std::string& key, bool v);
  void strs(const std::string& key, const std::vector<std::string>& v);
  void f32s(const std::string& key, const std::vector<float>& v);
  void i32s(const std::string& key, const std::vector<int32_t>& v);
  void u32s(const std::string& key, const std::vector<int64_t>& v);
  const std::string& bytes() const { return b_; }
  uint64_t count() const { return n_; }

 private:
  template <class T>
  void put(T v) {
    b_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void s(const std::string& v);
  void head(const std::string& key, uint32_t type);
  std::string b_;
  uint64_t n_ = 0;
};

/// One tensor to write: its name, ggml shape (ne[0] = row length), type, and its row-major
/// float values (called once, when its bytes are written).
struct OutTensor {
  std::string name;
  std::vector<uint64_t> ne;
  TensorType type;
  std::function<std::vector<float>()> values;
};

/// The whole file's size.
uint64_t file_size(const Meta& meta, const std::vector<OutTensor>& tensors);
/// The header, metadata and tensor table, padded to the alignment.
std::string head_bytes(const Meta& meta, const std::vector<OutTensor>& tensors);
/// Where each tensor's data starts in the file.
std::vector<uint64_t> tensor_offsets(const Meta& meta, const std::vector<OutTensor>& tensors);
/// One tensor's bytes as its type stores them (padded to the alignment), from its float32 values;
/// a value F16 cannot hold is a data Error naming the tensor, as write's.
std::string tensor_bytes(const OutTensor& t, const std::vector<float>& values, const std::string& what);
/// Writes the whole file to f (`what` names it in errors). A value F16 cannot hold -> data Error
/// naming the tensor and the value, as quantize_q8_0's.
void write(std::FILE* f, const Meta& meta, const std::vector<OutTensor>& tensors, const std::string& what);

}  // namespace tapelm::gguf
