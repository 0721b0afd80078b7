#pragma once
// Tensor: float32, contiguous row-major, any rank, 64-byte-aligned shared storage.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "autograd/error.h"

namespace tapelm {

using Shape = std::vector<int64_t>;

/// "[2, 3, 4]"
std::string shape_str(const Shape& s);
/// Product of the dimensions (1 for rank 0).
int64_t shape_numel(const Shape& s);

/// Live tensor storage, for tests that check the tape frees what it saved.
struct AllocStats {
  int64_t live_blocks;
  int64_t live_bytes;
  int64_t total_allocs;
};
AllocStats alloc_stats();
/// Returns the freed blocks kept for reuse (and the heap's free top) to the system.
void release_cached_storage();

class Tensor {
 public:
  Tensor() = default;
  /// Uninitialised storage of the given shape.
  static Tensor empty(const Shape& shape);
  static Tensor zeros(const Shape& shape);
  static Tensor full(const Shape& shape, float v);
  static Tensor from(const Shape& shape, const std::vector<float>& values);
  static Tensor scalar(float v) { return from({}, {v}); }

  bool defined() const { return storage_ != nullptr; }
  float* data() { return storage_.get(); }
  const float* data() const { return storage_.get(); }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  /// Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  int64_t numel() const { return numel_; }
  float item() const;
  float& operator[](int64_t i) { return storage_.get()[i]; }
  float operator[](int64_t i) const { return storage_.get()[i]; }

  /// A view with another shape of the same size, sharing storage.
  Tensor reshape(const Shape& shape) const;
  /// A deep copy.
  Tensor clone() const;
  void fill(float v);
  /// Overwrites every element with src[i] * scale (src holds numel() floats); threaded like the
  /// kernels. For gradients that arrive in a flat buffer (the all-reduce).
  void assign_scaled(const float* src, float scale);
  /// Multiplies every element by s in place (gradient clipping).
  void scale_(float s);
  void zero();
  /// Number of Tensors sharing this storage (for tests).
  long use_count() const { return storage_.use_count(); }
  std::vector<float> to_vector() const { return {data(), data() + numel_}; }

 private:
  std::shared_ptr<float> storage_;
  Shape shape_;
  int64_t numel_ = 0;
};

/// Integer ids (token ids, targets; -1 marks an ignored target), row-major.
struct Index {
  std::vector<int32_t> data;
  Shape shape;
  Index() = default;
  Index(std::vector<int32_t> d, Shape s) : data(std::move(d)), shape(std::move(s)) {}
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
};

}  // namespace tapelm
