#include "autograd/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <mutex>
#include <new>
#include <unordered_map>
#include <sstream>

#include "autograd/error.h"
#include "autograd/kernels/elementwise.h"

namespace tapelm {

namespace {
std::atomic<int64_t> g_live_blocks{0}, g_live_bytes{0}, g_total_allocs{0};

// Freed blocks are kept by size and handed out again: a training step allocates the same sizes
// every time, so after the first step nothing reaches the system allocator, and large blocks are
// not returned to the kernel only to fault in, zeroed, on the next step.
class BlockCache {
 public:
  void* take(size_t bytes) {
#ifdef __SANITIZE_ADDRESS__
    return nullptr;  // let AddressSanitizer see every use after free
#endif
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= bytes;
    return p;
  }
  void give(void* p, size_t bytes) {
#ifndef __SANITIZE_ADDRESS__
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + bytes <= kMaxCached) {
        free_[bytes].push_back(p);
        cached_ += bytes;
        return;
      }
    }
#endif
    std::free(p);
  }
  /// Frees every cached block: what was freed for good (a model's weights another rank now
  /// keeps) should not stay in this process's memory waiting for a block of its size.
  void trim() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [bytes, v] : free_)
      for (void* p : v) std::free(p);
    free_.clear();
    cached_ = 0;
  }
  ~BlockCache() {
    for (auto& [bytes, v] : free_)
      for (void* p : v) std::free(p);
  }

 private:
  static constexpr size_t kMaxCached = size_t(2) << 30;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

BlockCache& cache() {
  static BlockCache* c = new BlockCache();  // never destroyed: tensors may outlive static destructors
  return *c;
}

}  // namespace

void release_cached_storage() {
  cache().trim();
#ifdef __GLIBC__
  malloc_trim(0);  // glibc keeps freed heap pages otherwise
#endif
}

namespace {
std::shared_ptr<float> alloc_storage(int64_t n) {
  // Round up to whole cache lines: aligned_alloc needs a multiple of the alignment,
  // and SIMD tails may then read (never use) a few floats past the end.
  size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = cache().take(bytes);
  if (!p) p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  g_live_blocks++;
  g_live_bytes += static_cast<int64_t>(bytes);
  g_total_allocs++;
  return std::shared_ptr<float>(static_cast<float*>(p), [bytes](float* q) {
    g_live_blocks--;
    g_live_bytes -= static_cast<int64_t>(bytes);
    cache().give(q, bytes);
  });
}
}  // namespace

AllocStats alloc_stats() { return {g_live_blocks.load(), g_live_bytes.load(), g_total_allocs.load()}; }

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << '[';
  for (size_t i = 0; i < s.size(); i++) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) fail("shape", "negative dimension in " + shape_str(s));
    n *= d;
  }
  return n;
}

Tensor Tensor::empty(const Shape& shape) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.storage_ = alloc_storage(t.numel_);
  return t;
}

Tensor Tensor::zeros(const Shape& shape) {
  Tensor t = empty(shape);
  t.zero();
  return t;
}

Tensor Tensor::full(const Shape& shape, float v) {
  Tensor t = empty(shape);
  t.fill(v);
  return t;
}

Tensor Tensor::from(const Shape& shape, const std::vector<float>& values) {
  Tensor t = empty(shape);
  if (static_cast<int64_t>(values.size()) != t.numel_)
    fail("Tensor::from", std::to_string(values.size()) + " values for shape " + shape_str(shape));
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  int j = i < 0 ? i + n : i;
  if (j < 0 || j >= n) fail("dim", std::to_string(i) + " out of range for shape " + shape_str(shape_));
  return shape_[j];
}

float Tensor::item() const {
  if (numel_ != 1) fail("item", "a tensor of shape " + shape_str(shape_) + " is not a single value");
  return data()[0];
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == -1) {
      if (infer >= 0) fail("reshape", "more than one -1 in " + shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0 && known > 0 && numel_ % known == 0) s[infer] = numel_ / known;
  if (shape_numel(s) != numel_)
    fail("reshape", "cannot view " + shape_str(shape_) + " as " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_);
  if (numel_) std::memcpy(t.data(), data(), numel_ * sizeof(float));
  return t;
}

void Tensor::fill(float v) {
  float* p = data();
  for (int64_t i = 0; i < numel_; i++) p[i] = v;
}

void Tensor::assign_scaled(const float* src, float scale) {
  kern::unary_fwd(kern::UnaryOp::MulScalar, scale, data(), src, numel_);
}

void Tensor::scale_(float s) { kern::unary_fwd(kern::UnaryOp::MulScalar, s, data(), data(), numel_); }

void Tensor::zero() {
  if (numel_) std::memset(data(), 0, numel_ * sizeof(float));
}

}  // namespace tapelm
