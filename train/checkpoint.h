#pragma once
// Model weights in HDF5 (SPEC.md §2): root attributes format, format_version, config and one
// float32 dataset per parameter under /model. Optimizer and training state live in train/state.
#include <memory>
#include <stdexcept>
#include <string>

#include "nn/gpt.h"
#include "train/h5file.h"

namespace tapelm {

/// A checkpoint that cannot be used: wrong format, version, config, or parameters.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr int64_t kFormatVersion = 1;

/// Checks the root attributes and returns the model config they hold.
GPTConfig read_model_config(const H5File& f);
/// Writes the root attributes and every parameter under `group` (default /model).
void write_model(H5File& f, const GPT& model, const std::string& group = "/model");
/// Loads every parameter from `group`, first checking the exact set of names and shapes: a
/// mismatch names every missing, extra or mis-shaped parameter, and nothing is loaded.
void read_model_weights(const H5File& f, GPT& model, const std::string& group = "/model");
/// Builds the model a checkpoint file describes and loads its weights.
std::unique_ptr<GPT> load_model(const std::string& path);
/// Writes a weights-only checkpoint atomically.
void save_model(const std::string& path, const GPT& model);

}  // namespace tapelm
