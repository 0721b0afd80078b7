#include "train/formats/registry.h"

#include <algorithm>
#include <filesystem>

#include "autograd/error.h"
#include "train/formats/gguf.h"
#include "train/formats/hf.h"
#include "train/formats/llama2c.h"

namespace tapelm::formats {

namespace {

std::string header_line(const llama2c::Header& h) {
  return "version " + std::to_string(h.version) + ": dim " + std::to_string(h.dim) + ", " + std::to_string(h.n_layers) + " layers, " +
         std::to_string(h.n_heads) + " heads, " + std::to_string(h.n_kv_heads) + " kv heads, hidden " + std::to_string(h.hidden_dim) +
         ", vocab " + std::to_string(h.vocab_size) + ", max_seq_len " + std::to_string(h.max_seq_len) +
         (h.shared_classifier ? ", shared classifier" : ", own classifier");
}

std::string import_llama2c(const ImportRequest& r) {
  const llama2c::Header h = llama2c::import_model(r.model, r.tokenizer_model, r.tokenizer_bin, r.out);
  return "imported " + r.model + " (llama2.c " + header_line(h) + ")" +
         (r.tokenizer_model.empty() ? "" : " with tokenizer " + r.tokenizer_model) + " to " + r.out;
}

std::string export_llama2c(const ExportRequest& r) {
  std::string tok;
  const llama2c::Header h = llama2c::export_model(r.checkpoint, r.version, r.out, &tok);
  return "exported " + r.checkpoint + " to " + r.out + " (llama2.c " + header_line(h) + ")" + (tok.empty() ? "" : ", its tokenizer to " + tok);
}

std::string import_hf(const ImportRequest& r) {
  const hf::ImportResult i = hf::import_model(r.model, r.out);
  const GPTConfig& c = i.hf.config;
  return "imported " + r.model + " (" + i.hf.architecture + ": " + std::to_string(c.n_layer) + " layers, d " + std::to_string(c.n_embd) +
         ", " + std::to_string(c.n_head) + " heads, " + c.kv_heads_str() + " kv heads, vocab " + std::to_string(c.vocab_size) +
         "; " + i.dtypes + " in " + std::to_string(i.weight_files.size()) + " file" + (i.weight_files.size() == 1 ? "" : "s") + ")" +
         (i.tokenizer_file.empty() ? ", no tokenizer" : " with tokenizer " + i.tokenizer_file) + " to " + r.out + " (" + i.kept + ")";
}

std::string export_hf(const ExportRequest& r) {
  const hf::ExportResult e = hf::export_model(r.checkpoint, r.out, r.dtype);
  return "exported " + r.checkpoint + " to " + r.out + " (" + e.architecture + ", " + r.dtype + ", " + std::to_string(e.files.size()) +
         " files)" + (e.note.empty() ? "" : "; " + e.note);
}

std::string import_gguf(const ImportRequest& r) {
  const gguf::ImportResult i = gguf::import_model(r.model, r.out);
  return "imported " + r.model + " (GGUF, " + i.architecture + ", " + i.types + (i.dequantized ? ", Q8_0 dequantized to float32" : "") +
         ") with " + (i.tokenizer.empty() ? "no tokenizer" : "its " + i.tokenizer + " tokenizer") + " to " + r.out + " (" + i.kept + ")";
}

std::string export_gguf(const ExportRequest& r) {
  const gguf::ExportResult e = gguf::export_model(r.checkpoint, r.out, r.dtype);
  char mb[32];
  std::snprintf(mb, sizeof mb, "%.1f", static_cast<double>(e.bytes) / 1e6);
  return "exported " + r.checkpoint + " to " + r.out + " (GGUF, " + e.architecture + " with the " + e.tokenizer + " tokenizer, " + r.dtype +
         ", " + std::to_string(e.tensors) + " tensors, " + mb + " MB)";
}

const std::vector<ModelFormat> kFormats = {
    {"llama2c", "llama2.c's model file", "the model file, version 0 or 1", "the model file (model.bin; tokenizer.bin beside it)", {},
     true, true, false, import_llama2c, export_llama2c},
    {"hf", "a Hugging Face transformers model directory", "the model directory", "the model directory", {"f32", "bf16", "f16"}, false,
     false, true, import_hf, export_hf},
    {"gguf", "llama.cpp's GGUF file", "the .gguf file", "the .gguf file", {"f32", "f16", "bf16", "q8_0"}, false, false, false,
     import_gguf, export_gguf},
};

std::string names_of(const std::vector<const ModelFormat*>& fs) {
  std::string out;
  for (size_t i = 0; i < fs.size(); i++) out += (i == 0 ? "" : i + 1 == fs.size() ? " and " : ", ") + std::string(fs[i]->name);
  return out;
}

}  // namespace

const std::vector<ModelFormat>& model_formats() { return kFormats; }

const ModelFormat& model_format(const std::string& name) {
  for (const ModelFormat& f : kFormats)
    if (name == f.name) return f;
  throw Error(ErrorKind::usage, "--format " + cut_for_message(name) + ": the formats are " + describe_model_formats());
}

std::vector<std::string> model_format_names() {
  std::vector<std::string> out;
  for (const ModelFormat& f : kFormats) out.push_back(f.name);
  return out;
}

std::string describe_model_formats() {
  std::string out;
  for (const ModelFormat& f : kFormats) out += (out.empty() ? "" : ", ") + std::string(f.name) + " (" + f.what + ")";
  return out;
}

void check_import_flags(const ModelFormat& f, const ImportRequest& r) {
  if (!f.tokenizer_files && (!r.tokenizer_model.empty() || !r.tokenizer_bin.empty())) {
    std::vector<const ModelFormat*> with;
    for (const ModelFormat& o : kFormats)
      if (o.tokenizer_files) with.push_back(&o);
    throw Error(ErrorKind::usage, "--tokenizer-model and --tokenizer-bin are for " + names_of(with) + ": " + f.what + " holds its own tokenizer");
  }
  if (std::filesystem::is_directory(r.out))
    throw Error(ErrorKind::usage, "--out " + r.out + " is a directory; the checkpoint is one HDF5 file");
}

void check_export_flags(const ModelFormat& f, const ExportRequest& r, bool version_given, bool dtype_given) {
  if (version_given && !f.versions)
    throw Error(ErrorKind::usage, "--version is llama2.c's file version; --format " + std::string(f.name) + " has none");
  const bool float32_only = f.dtypes.empty();
  if (dtype_given && (float32_only ? r.dtype != "f32" : std::find(f.dtypes.begin(), f.dtypes.end(), r.dtype) == f.dtypes.end())) {
    std::vector<const ModelFormat*> with;
    for (const ModelFormat& o : kFormats)
      if (std::find(o.dtypes.begin(), o.dtypes.end(), r.dtype) != o.dtypes.end()) with.push_back(&o);
    throw Error(ErrorKind::usage, "--dtype " + cut_for_message(r.dtype) + (with.empty() ? " is no format's" : " is for --format " + names_of(with)) +
                                      (float32_only ? "; " + std::string(f.what) + " holds float32" : ""));
  }
}

}  // namespace tapelm::formats
