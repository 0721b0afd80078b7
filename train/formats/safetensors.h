#pragma once
// Hugging Face's safetensors files, read as hostile input and written as the reference library
// writes them (docs/formats.md §3.9).
//
// A file is: a little-endian uint64 N, N bytes of JSON — {"name": {"dtype": "F32", "shape":
// [..], "data_offsets": [begin, end]}, ..., optional "__metadata__": {string: string}} — then the
// data. Offsets count from the data's start; the tensors tile the data exactly (sorted, no gap,
// no overlap, the last ending at the file's end), each holding product(shape) · dtype size bytes,
// row-major, little-endian.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/io.h"
#include "train/formats/tensor_source.h"

namespace tapelm::safetensors {

/// The largest header read: the reference library's own limit.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// One tensor of a file, as its header describes it.
struct TensorInfo {
  std::string name;
  std::string dtype;  // "F32", "BF16", ... as the file spells it
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data
  int64_t numel() const;
};

/// A safetensors file, memory-mapped read-only. Opening checks everything the format promises
/// (above) and throws a data Error naming the file and the tensor or field at fault: a header
/// past the file or over 100 MB, JSON that is not an object of tensor entries, a duplicate name,
/// an unknown dtype, a shape whose element count overflows or disagrees with its byte range,
/// offsets that overlap, leave a gap or run past the end.
class File {
 public:
  static File open(const std::string& path);
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& path() const { return path_; }
  /// Every tensor, in the order of its data.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// The tensor called name, or null.
  const TensorInfo* find(const std::string& name) const;
  /// The header's __metadata__ (string values only; others are refused on open).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The tensor's bytes as stored (a copy: the file is mapped a tensor at a time).
  std::string bytes(const TensorInfo& t) const;
  /// The tensor's bytes, mapped for as long as the window lives (checked as bytes() is).
  std::shared_ptr<const MappedFile> map(const TensorInfo& t) const;
  /// Where the tensor's bytes start in the file.
  uint64_t offset(const TensorInfo& t) const { return data_start_ + t.begin; }
  /// Its values widened to float32 into out[numel]; F32, F16, BF16 and F64 (narrowed, values
  /// beyond float range refused) are read, any other dtype is a data Error naming the tensor.
  void read_f32(const TensorInfo& t, float* out) const;

 private:
  File() = default;
  std::string path_;
  MappedFile window(const TensorInfo& t, bool populate = false) const;
  std::optional<MappedFile> head_;  // the header, mapped while the file is open: its identity
  uint64_t size_ = 0, data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// Bytes per element of a dtype the format defines, or 0 for an unknown name.
int dtype_size(const std::string& dtype);

/// The weights of a model directory as transformers saves them: model.safetensors, or the shards
/// model.safetensors.index.json names. Every file is checked on open, and the index and the files
/// must agree (each tensor in the file the index names, each named tensor in a file). Messages
/// name the directory as "HF model DIR" and a tensor's file as "safetensors file F".
class ModelFiles : public formats::TensorSource {
 public:
  static std::unique_ptr<ModelFiles> open(const std::string& dir);
  std::string what() const override { return "HF model " + dir_; }
  const std::vector<Info>& tensors() const override { return infos_; }
  const Info* find(const std::string& name) const override;
  void read_f32(const Info& t, float* out) const override;
  std::string bytes(const Info& t) const override;
  std::shared_ptr<const MappedFile> map(const Info& t) const override;
  int64_t map_offset(const Info& t) const override;
  /// The safetensors files, in order.
  const std::vector<std::string>& files() const { return paths_; }

 private:
  std::string dir_;
  std::vector<std::string> paths_;
  std::vector<File> files_;
  std::vector<Info> infos_;
  std::map<std::string, std::pair<size_t, const TensorInfo*>> where_;  // name -> (file, entry)
};

/// A tensor to write: its shape and how to produce its values as float32 (called once, when its
/// bytes are written), stored as dtype "F32", "F16" or "BF16".
struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::function<std::vector<float>()> values;
};

/// The JSON header of a file holding `tensors` in this order as `dtype`, with __metadata__ (the
/// reference writer's layout: entries in data order, padded with spaces to a multiple of 8).
std::string header_bytes(const std::vector<OutTensor>& tensors, const std::string& dtype,
                         const std::map<std::string, std::string>& metadata);
/// One tensor's bytes as dtype stores them, from its float32 values (F16 overflow refused as write
/// refuses it).
std::string encode(const OutTensor& t, const std::vector<float>& values, const std::string& dtype, const std::string& what);
/// Where each tensor's data starts in the file, after a header of header_size bytes.
std::vector<uint64_t> data_offsets(const std::vector<OutTensor>& tensors, const std::string& dtype, uint64_t header_size);
/// Writes the whole file (header, then each tensor converted to dtype) to f; `what` names it in
/// errors. A value F16 cannot hold (beyond 65504) is refused, naming the tensor and the value.
void write(std::FILE* f, const std::vector<OutTensor>& tensors, const std::string& dtype,
           const std::map<std::string, std::string>& metadata, const std::string& what);

/// The files save_pretrained cuts a model into: shards of at most max_bytes of data each
/// (model-00001-of-0000N.safetensors with model.safetensors.index.json), or one model.safetensors.
struct ShardPlan {
  std::vector<std::string> names;               // the shard files
  std::vector<std::vector<OutTensor>> shards;   // their tensors
  std::string index_json;                       // "" for one file
};
ShardPlan plan_shards(const std::vector<OutTensor>& tensors, const std::string& dtype, uint64_t max_bytes);

}  // namespace tapelm::safetensors
