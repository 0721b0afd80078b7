#pragma once
// The one description every model format maps to (as llama.cpp's LLM_TENSOR_NAMES and gguf-py's
// tensor_mapping.py): the architecture families other programs know, what a tapelm config must
// be to be one of them, and for each tensor role its name in every format, with the transforms a
// format applies (q|k|v fused, Conv1D's transpose, RoPE's interleaved row order). The adapters
// (hf.cpp, gguf.cpp, llama2c.cpp) keep only their config keys and tokenizer metadata.
//
// The families, each with its own names where they differ from a format's base naming, are rows
// of families.cpp.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "autograd/tensor.h"
#include "nn/config.h"
#include "train/formats/families.h"

namespace tapelm {
class GPT;
}

namespace tapelm::formats {

/// One tensor of a file and where its values live in tapelm's model.
struct FileTensor {
  std::string name;                // the format's name for it
  Shape shape;                     // as the file holds it, row-major (a GGUF file's ne reversed)
  /// tapelm parameters stacked along their first dimension to form it ([out, in] for a matrix);
  /// one the model lacks stands for zeros (all_biases families).
  std::vector<std::pair<std::string, Shape>> parts;
  bool transpose = false;          // the file holds the matrix as [in, out] (GPT-2's Conv1D)
  int64_t rope_heads = 0;          // > 0: rows of that many heads, in interleaved RoPE order in the file
  bool matrix = false;             // a weight matrix (GGUF quantizes these; norms and biases stay f32)
  bool extra = false;              // no parameter: a tensor the format keeps beside them (llama2.c's RoPE tables)
  int64_t head_parts = 0;          // > 0: the parts' rows interleaved head by head in the file, over that many heads
                                   // (GPT-NeoX's query_key_value: head 0's q, k, v rows, then head 1's, ...)
  int64_t lead_rows = 0;           // > 0: the file's first rows are no parameter's (OPT's position offset):
                                   // skipped on reading, written as zeros
  bool plus_one = false;           // the file holds 1 + the parameter (a (1 + w) norm in llama.cpp's gemma)
};

/// How a format lays the tensors out beyond the table.
struct LayoutOptions {
  std::string hf_prefix;           // "transformer." before GPT-2's names, when the file has it
  int llama2c_version = 0;         // llama2.c's tensor order (0 or 1); version 0 keeps its RoPE tables
};

/// The tensors of a model of config c as format fmt holds them for family f, in the order the
/// format writes them.
std::vector<FileTensor> layout(const GPTConfig& c, Family f, Format fmt, const LayoutOptions& o = {});

/// A data Error starting with `what` when a config claims more layers than `tensors_held` tensors
/// can make (each layer's tensors in format fmt, and those outside the layers): checked before a
/// layout of c is built, so that a config claiming 10^9 layers over a 4-layer file is refused at
/// once instead of listing 10^10 tensors. fmt tapelm: the checkpoint's parameters.
void check_layer_count(const GPTConfig& c, Family f, Format fmt, const LayoutOptions& o, size_t tensors_held, const std::string& what);

/// tapelm's own layout of any config: each parameter under its own name, as it is.
std::vector<FileTensor> parameter_layout(const GPTConfig& c);

/// Rows [heads · hd, cols] from tapelm's half-split RoPE order (x[i], x[i + hd/2]) to the
/// interleaved order (x[2i], x[2i + 1]) of llama.cpp and llama2.c, or back (to_interleaved false).
void permute_rope_rows(const float* in, float* out, int64_t heads, int64_t rows, int64_t cols, bool to_interleaved);

/// Tensors by name: a model's parameters (handles sharing their storage) and any extras.
using TensorMap = std::map<std::string, Tensor>;
/// Every parameter of the model by name.
TensorMap tensors_of(const GPT& model);
/// The values of one file tensor as the file holds them (parts stacked, rows permuted,
/// transposed), from the named tensors; a part the map lacks is zeros.
std::vector<float> file_values(const FileTensor& t, const TensorMap& tensors);
/// The inverse: values as the file holds them, stored into the named tensors (an extra is added
/// to the map). The values hold product(t.shape) floats.
void store_file_values(const FileTensor& t, const float* values, TensorMap& tensors);

}  // namespace tapelm::formats
