#pragma once
// A model of any format tapelm reads — a tapelm checkpoint, a Hugging Face directory, a GGUF
// file — opened and checked but not loaded: its config, tokenizer and tensor source, so that a
// command may read the whole model (import, eval) or one block at a time (a conversion of a model
// larger than memory). Every tensor's name and shape is checked against the config when the model
// is opened, before any memory is committed to it.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/ops.h"
#include "data/tokenizer/tokenizer.h"
#include "nn/config.h"
#include "train/formats/layout.h"
#include "train/formats/tensor_source.h"

namespace tapelm {
class GPT;
}

namespace tapelm::formats {

class ModelSink;

struct OpenedModel {
  std::string path;
  std::string format;  // "tapelm", "hf", "gguf"
  std::string what;    // how messages name it: "HF model DIR", "GGUF file F", "checkpoint F"
  GPTConfig config;
  std::optional<Tokenizer> tok;
  std::unique_ptr<TensorSource> src;  // owns the open files
  std::vector<FileTensor> layout;     // the config's tensors as the source names them
  LoadRules rules;
  nlohmann::json from;                // what the file was: written as a checkpoint's imported_from
  std::string dtypes;                 // the stored dtypes of the layout's tensors, e.g. "BF16"

  /// Reads every tensor of `into` (tapelm parameter names → tensors of their shapes) the layout
  /// maps: the whole model, or a part of it (one block). A file tensor is read whole when any of
  /// its parts is asked for (GPT-2's fused q|k|v holds one block's three).
  void read(TensorMap& into) const;
  /// Reads the model one file tensor at a time and pushes each parameter to the sink: what an
  /// export or a streamed import holds is one tensor.
  void push_each(ModelSink& sink) const;
  /// Builds the whole model in float32 and reads it (after the memory check, naming the model).
  std::unique_ptr<GPT> load() const;
  /// The dtype a checkpoint keeps its weights in without losing or doubling bytes: "bf16" or "f16"
  /// when every tensor is stored so, else "f32".
  WeightType kept_dtype() const;
  /// The type the blocks' matrices and an untied head are all stored in when it is bf16 or f16
  /// (what GPT::pack_weights can hold them in exactly), else f32.
  WeightType matrices_dtype() const;
  /// The file tensor holding parameter `param` (a matrix) alone and as it is, stored in `type`
  /// (BF16, F16 or Q8_0; rows in RoPE's interleaved order allowed), or null: what map_matrix maps.
  const FileTensor* mappable(const std::string& param, WeightType type) const;
  /// Parameter `param` as a PackedMatrix over the file's own bytes, mapped read-only (no copy;
  /// every value checked finite), and the window that maps them; nullopt when it is not mappable
  /// in `type`, or the source does not map (a tapelm checkpoint).
  struct MappedMatrix {
    PackedMatrix matrix;
    std::shared_ptr<const MappedFile> window;
  };
  std::optional<MappedMatrix> map_matrix(const std::string& param, WeightType type) const;
  /// The bytes of the block matrices and an untied head that map_matrix maps in `type`.
  double mappable_bytes(WeightType type) const;
  /// What `import` does with it: a weights-only checkpoint with the tokenizer and `from` as
  /// imported_from, written one tensor at a time in kept_dtype() (a BF16 model stays BF16).
  void write_imported(const std::string& out) const;
};

/// Opens `path` as a tapelm checkpoint (any model: formats::open_model, registry.h).
OpenedModel open_checkpoint(const std::string& path);
/// `path` is a regular file whose first bytes are `magic` (a FIFO is never read to tell: it would wait).
bool file_starts_with(const std::string& path, const std::string& magic);
/// The file starts with HDF5's signature (a tapelm checkpoint, or another HDF5 file).
bool starts_with_hdf5(const std::string& path);

}  // namespace tapelm::formats
