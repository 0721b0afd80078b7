#pragma once
// Reading a model from any format: a TensorSource finds a file's tensors by name and reads one at
// a time (safetensors, GGUF, llama2.c and tapelm's own checkpoints implement it), and load() fills
// a model's parameters from one as a layout (layout.h) names them, with one rule and one message:
// no tensor missing, none left over, every shape as the config makes it, checked before any
// memory is committed to the model.
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "autograd/error.h"
#include "data/io.h"
#include "train/formats/layout.h"

namespace tapelm::formats {

class TensorSource {
 public:
  struct Info {
    std::string name;
    Shape shape;        // row-major
    std::string dtype;  // as stored: "F32", "BF16", "Q8_0", ...
  };
  virtual ~TensorSource() = default;
  /// How messages name the source: "HF model DIR", "GGUF file F".
  virtual std::string what() const = 0;
  /// Every tensor, in the source's order.
  virtual const std::vector<Info>& tensors() const = 0;
  /// The tensor called name, or null.
  virtual const Info* find(const std::string& name) const = 0;
  /// Its values widened to float32 into out[numel]; a value that is not finite -> data Error naming it.
  virtual void read_f32(const Info& t, float* out) const = 0;
  /// Its bytes as stored (to compare two tensors), or empty when the source cannot tell.
  virtual std::string bytes(const Info&) const { return {}; }
  /// Where its bytes start in their file when map() maps them, or -1 when the source does not
  /// map (a tapelm checkpoint): what a plan counts as mapped before mapping (a 16-bit value at an
  /// odd offset is not).
  virtual int64_t map_offset(const Info&) const { return -1; }
  /// Its bytes as stored, mapped read-only while the window lives (decoding straight from a
  /// file's 16-bit or q8_0 matrices, without a copy), or null when the source does not map them.
  virtual std::shared_ptr<const MappedFile> map(const Info&) const { return nullptr; }
};

/// The index of the first element of v[n] that is not finite, or -1: a branch-free scan of the
/// exponent bits on every thread (a model's weights, checked as they are read).
int64_t first_non_finite(const float* v, int64_t n);

/// What a load checks against, beyond the layout.
struct LoadRules {
  std::string against;  // how messages name what the tensors must match: "LlamaForCausalLM as config.json describes it"
  ErrorKind kind = ErrorKind::data;
  /// A tensor the layout does not list that may stay unread (buffers, a tied head stored anyway).
  std::function<bool(const TensorSource::Info&)> ignorable;
};

/// Throws one Error naming every tensor that is missing, left over or of the wrong shape (the
/// first few of each), unless the source holds exactly the layout's tensors.
void check_tensors(const std::vector<FileTensor>& layout, const TensorSource& src, const LoadRules& rules);
/// check_tensors, then reads every tensor, one at a time, into the named tensors (a model's
/// parameters; extras are added). A read that fails leaves the earlier tensors read.
void load(const std::vector<FileTensor>& layout, const TensorSource& src, const LoadRules& rules, TensorMap& into);
/// The stored dtypes of the layout's tensors, e.g. "F32, BF16" (sorted, each once).
std::string stored_dtypes(const std::vector<FileTensor>& layout, const TensorSource& src);

}  // namespace tapelm::formats
