#pragma once
// Where a model is written one parameter at a time, in whatever order its producer makes them: a
// conversion streaming blocks, an export reading a checkpoint tensor by tensor. A tapelm
// checkpoint (ModelWriter, checkpoint.h) writes each as it comes; safetensors and GGUF files,
// whose headers are known from the config before any value, are written by PlacedWriter: each file
// tensor goes to its place in the file once every parameter it is made of has arrived (GPT-2's
// fused q|k|v waits for its three), and nothing else is held.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/tensor.h"
#include "nn/config.h"
#include "train/formats/layout.h"

namespace tapelm::formats {

/// Receives a model's parameters by tapelm name (as named_parameters() names them), each once.
class ModelSink {
 public:
  virtual ~ModelSink() = default;
  /// t is read during the call (and copied if it must wait): the caller may reuse it after.
  virtual void tensor(const std::string& name, const Tensor& t) = 0;
};
/// What fills a sink: pushes every parameter of the config once.
using SinkFill = std::function<void(ModelSink&)>;

/// "" when every element is finite, else the first that is not ("NaN at index 7").
std::string non_finite(const Tensor& t);
/// non_finite's words for the value v at index i ("-Inf at index 7").
std::string non_finite_at(float v, int64_t i);

/// One file tensor's place: which output file, the byte offset its data starts at, and how its
/// values (as file_values gives them) become the bytes written there.
struct Placement {
  FileTensor tensor;
  size_t file = 0;
  uint64_t offset = 0;
  std::function<std::string(const std::vector<float>&)> encode;
};
/// An output file whose header is known: its final path (for messages) and its header bytes.
struct PlacedFile {
  std::string path, header;
};

/// Writes the files (`whole`: path and all its bytes; `placed`: a header, then the placements'
/// bytes) committed together (commit_together: every file or none, whatever ends the process),
/// with fill pushing the parameters of c; `what` names the output in errors. A parameter the
/// config lacks, pushed twice or of another shape is an internal Error; a NaN or Inf a checkpoint
/// Error naming it (as ModelWriter's); a placement never written (a parameter never pushed) an
/// internal Error; in each case nothing is committed.
void write_placed(const std::string& what, const GPTConfig& c, const std::vector<std::pair<std::string, std::string>>& whole,
                  const std::vector<PlacedFile>& placed, const std::vector<Placement>& placements, const SinkFill& fill);

}  // namespace tapelm::formats
