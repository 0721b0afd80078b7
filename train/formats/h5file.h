#pragma once
// A small HDF5 layer for checkpoints and parity fixtures: float32 tensors, integer and byte
// datasets, string/int/double attributes, h5py-compatible. Every failure is an checkpoint Error whose
// message names the file and the object. Use one H5File from one thread at a time.
#include <concepts>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "autograd/error.h"
#include "autograd/tensor.h"

namespace tapelm {

/// One open HDF5 file. Object paths are absolute ("/group/name.weight"); a missing leading '/'
/// is implied. Dataset names may contain dots.
class H5File {
 public:
  H5File() = default;
  H5File(H5File&& o) noexcept : id_(std::exchange(o.id_, -1)), path_(std::move(o.path_)) {}
  H5File& operator=(H5File&& o) noexcept;
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;
  ~H5File();

  /// Opens an existing file read-only; throws if it is missing, unreadable, truncated or not HDF5.
  static H5File open_read(const std::string& path);
  /// Creates a file, truncating any existing one. `shown`, when given, is the name messages use
  /// (a temporary file's target: an f16 overflow named the temporary file, not --out).
  static H5File create(const std::string& path, const std::string& shown = "");

  /// The path the file was opened with.
  const std::string& path() const { return path_; }
  /// True while the file is open.
  bool is_open() const { return id_ >= 0; }

  /// True if the object exists; false (never an error) when any intermediate group is missing.
  bool exists(const std::string& obj) const;
  /// Names of the direct children of a group, sorted.
  std::vector<std::string> list(const std::string& group) const;
  /// Paths of all datasets below a group relative to it ("wte.weight", "sub/x"), sorted.
  std::vector<std::string> list_datasets_recursive(const std::string& group) const;
  /// Creates a group and any missing intermediate groups; an existing group is left as is.
  void create_group(const std::string& group);

  /// The dimensions of a dataset ({} for a scalar).
  Shape dataset_shape(const std::string& obj) const;
  /// Reads a numeric dataset as float32 (float64 and integer datasets are converted).
  Tensor read_tensor(const std::string& obj) const;
  /// read_tensor into out[numel] (numel must be the dataset's), without a tensor of its own: what
  /// a streamed read of a model uses, so that no block-sized buffer outlives it.
  void read_tensor_into(const std::string& obj, float* out, int64_t numel) const;
  /// Writes a float32 dataset, creating intermediate groups and replacing an existing dataset.
  void write_tensor(const std::string& obj, const Tensor& t);
  /// Writes t rounded to 16 bits: encoding "bf16" or "f16", stored as an unsigned 16-bit dataset
  /// with the attribute encoding naming it (HDF5 has no bfloat16 type). A value beyond f16's range
  /// is a data Error naming the dataset. read_tensor widens such a dataset back to float32.
  void write_tensor_16(const std::string& obj, const Tensor& t, const std::string& encoding);
  /// Writes bfloat16 values given as their bits (numel of shape), as write_tensor_16 stores "bf16".
  void write_bf16_bits(const std::string& obj, const uint16_t* bits, const Shape& shape);
  /// How a dataset's floats are stored: "F32" (or any HDF5 number type), "BF16" or "F16".
  std::string tensor_encoding(const std::string& obj) const;
  /// Reads an integer dataset as int32 (any integer type; values must fit); shape is optional.
  std::vector<int32_t> read_ints(const std::string& obj, Shape* shape = nullptr) const;
  /// Writes an int32 dataset of the given shape.
  void write_ints(const std::string& obj, const std::vector<int32_t>& v, const Shape& shape);
  /// Reads a 1-D dataset of 8-bit integers (an opaque blob such as RNG state).
  std::vector<uint8_t> read_bytes(const std::string& obj) const;
  /// Writes a 1-D uint8 dataset.
  void write_bytes(const std::string& obj, const std::vector<uint8_t>& v);

  /// True if the object exists and has the attribute ("/" is the root group).
  bool has_attr(const std::string& obj, const std::string& name) const;
  /// Reads a string attribute, variable-length (as h5py writes) or fixed-length.
  std::string read_attr_string(const std::string& obj, const std::string& name) const;
  /// Reads an attribute of any integer type.
  int64_t read_attr_int(const std::string& obj, const std::string& name) const;
  /// Reads an attribute of any float or integer type.
  double read_attr_double(const std::string& obj, const std::string& name) const;
  /// Reads a numeric attribute of any shape (h5py's array attributes), flattened, as float64.
  std::vector<double> read_attr_doubles(const std::string& obj, const std::string& name) const;
  /// Writes a scalar fixed-length, null-padded UTF-8 string attribute, replacing any old one.
  void write_attr(const std::string& obj, const std::string& name, const std::string& v);
  /// Writes a string literal as a string attribute.
  void write_attr(const std::string& obj, const std::string& name, const char* v) {
    write_attr(obj, name, std::string(v));
  }
  /// Writes a scalar int64 attribute.
  void write_attr(const std::string& obj, const std::string& name, int64_t v);
  /// Writes a scalar float64 attribute.
  void write_attr(const std::string& obj, const std::string& name, double v);
  /// Writes any other integer type as an int64 attribute (so `write_attr(o, n, 1)` is not ambiguous).
  template <std::integral T>
    requires(!std::same_as<T, bool> && !std::same_as<T, int64_t>)
  void write_attr(const std::string& obj, const std::string& name, T v) {
    if (!std::in_range<int64_t>(v)) fail("attribute " + name + " on " + obj + " does not fit in int64");
    write_attr(obj, name, static_cast<int64_t>(v));
  }

  /// Flushes buffered data to the file.
  void flush();
  /// Closes the file (idempotent); throws if HDF5 cannot finish writing it.
  void close();

 private:
  H5File(int64_t id, std::string path) : id_(id), path_(std::move(path)) {}
  [[noreturn]] void fail(const std::string& what) const;
  int64_t open_dataset(const std::string& obj) const;
  int64_t open_object(const std::string& obj) const;
  int64_t open_attr(const std::string& obj, const std::string& name) const;
  void write_dataset(const std::string& obj, const Shape& shape, int64_t file_type, int64_t mem_type,
                     const void* data);

  int64_t id_ = -1;  // hid_t
  std::string path_;
};

/// Writes a file atomically: fill() writes "<path>.tmp.<pid>", which is then flushed, closed,
/// fsynced and renamed over path. If anything throws, the temporary file is removed and the
/// exception rethrown, so path is either untouched or complete.
void write_h5_atomic(const std::string& path, const std::function<void(H5File&)>& fill);

}  // namespace tapelm
