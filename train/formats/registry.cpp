#include "train/formats/registry.h"

#include <algorithm>
#include <filesystem>

#include "autograd/error.h"
#include "data/io.h"
#include "train/formats/checkpoint.h"
#include "train/formats/gguf.h"
#include "train/formats/hf.h"
#include "train/formats/llama2c.h"

namespace tapelm::formats {

namespace fs = std::filesystem;

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
  const llama2c::Header h = llama2c::export_model(open_model(r.checkpoint), r.version, r.out, &tok);
  return "exported " + r.checkpoint + " to " + r.out + " (llama2.c " + header_line(h) + ")" + (tok.empty() ? "" : ", its tokenizer to " + tok);
}

std::string import_hf(const ImportRequest& r) {
  const hf::ImportResult i = hf::import_model(r.model, r.out);
  const GPTConfig& c = i.hf.config;
  return "imported " + r.model + " (" + i.hf.architecture + ": " + std::to_string(c.n_layer) + " layers, d " + std::to_string(c.n_embd) +
         ", " + std::to_string(c.n_head) + " heads, " + c.kv_heads_str() + " kv heads, vocab " + std::to_string(c.vocab_size) +
         "; " + i.dtypes + " in " + std::to_string(i.weight_files.size()) + " file" + (i.weight_files.size() == 1 ? "" : "s") + ")" +
         (i.tokenizer_file.empty() ? ", no tokenizer" : " with tokenizer " + i.tokenizer_file) + " to " + r.out + " (" + to_string(i.kept) + ")";
}

std::string export_hf(const ExportRequest& r) {
  const hf::ExportResult e = hf::export_model(open_model(r.checkpoint), r.out, r.dtype);
  return "exported " + r.checkpoint + " to " + r.out + " (" + e.architecture + ", " + to_string(r.dtype) + ", " + std::to_string(e.files.size()) +
         " files)" + (e.note.empty() ? "" : "; " + e.note);
}

std::string import_gguf(const ImportRequest& r) {
  const gguf::ImportResult i = gguf::import_model(r.model, r.out);
  return "imported " + r.model + " (GGUF, " + i.architecture + ", " + i.types + (i.dequantized ? ", Q8_0 dequantized to float32" : "") +
         ") with " + (i.tokenizer.empty() ? "no tokenizer" : "its " + i.tokenizer + " tokenizer") + " to " + r.out + " (" + to_string(i.kept) + ")";
}

std::string gguf_line(const gguf::ExportResult& e, WeightType dtype) {
  char mb[32];
  std::snprintf(mb, sizeof mb, "%.1f", static_cast<double>(e.bytes) / 1e6);
  return "GGUF, " + e.architecture + " with the " + e.tokenizer + " tokenizer, " + to_string(dtype) + ", " + std::to_string(e.tensors) + " tensors, " + mb + " MB";
}

std::string export_gguf(const ExportRequest& r) {
  if (fs::is_directory(r.out)) throw Error(ErrorKind::usage, "--out " + r.out + " is a directory; GGUF is one file");
  const gguf::ExportResult e = gguf::export_model(open_model(r.checkpoint), r.out, r.dtype);
  return "exported " + r.checkpoint + " to " + r.out + " (" + gguf_line(e, r.dtype) + ")";
}

// The rows' reading and writing.
bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}
bool is_gguf(const std::string& path) { return file_starts_with(path, "GGUF"); }

void check_checkpoint(const Output& o, const GPTConfig&, const Tokenizer*) {
  if (o.dtype == WeightType::q8_0) throw Error(ErrorKind::usage, "--dtype q8_0: only --format gguf holds q8_0 weights");
}
std::string write_checkpoint(const Output& o, const GPTConfig& c, const Tokenizer* tok, const SinkFill& fill) {
  write_streamed(o.path, c, tok, o.note, o.dtype, fill);
  return "tapelm checkpoint, " + to_string(o.dtype);
}
void check_hf(const Output& o, const GPTConfig& c, const Tokenizer*) { hf::check_writable(o.path, c, o.dtype, o.what); }
std::string write_hf(const Output& o, const GPTConfig& c, const Tokenizer* tok, const SinkFill& fill) {
  const hf::ExportResult e = hf::write_model(o.path, c, tok, o.dtype, o.what, fill);
  return e.architecture + ", " + to_string(o.dtype) + ", " + std::to_string(e.files.size()) + " files" + (e.note.empty() ? "" : "; " + e.note);
}
void check_gguf(const Output& o, const GPTConfig& c, const Tokenizer* tok) { gguf::check_writable(o.path, c, tok, o.dtype, o.what); }
std::string write_gguf(const Output& o, const GPTConfig& c, const Tokenizer* tok, const SinkFill& fill) {
  return gguf_line(gguf::write_model(o.path, c, tok, o.dtype, o.name.empty() ? o.what : o.name, fill), o.dtype);
}

const std::vector<ModelFormat> kFormats = {
    {.name = "tapelm", .what = "tapelm's HDF5 checkpoint", .model_help = "the checkpoint", .out_help = "the checkpoint",
     .dtypes = {WeightType::f32, WeightType::bf16, WeightType::f16}, .exchange = false, .sniff = starts_with_hdf5, .open = open_checkpoint,
     .check_writable = check_checkpoint, .write = write_checkpoint},
    {.name = "llama2c", .what = "llama2.c's model file", .model_help = "the model file, version 0 or 1",
     .out_help = "the model file (model.bin; tokenizer.bin beside it)", .versions = true, .tokenizer_files = true,
     .import_model = import_llama2c, .export_model = export_llama2c},
    {.name = "hf", .what = "a Hugging Face transformers model directory", .model_help = "the model directory", .out_help = "the model directory",
     .dtypes = {WeightType::f32, WeightType::bf16, WeightType::f16}, .directory = true, .sniff = is_hf_dir, .open = hf::open_model, .check_writable = check_hf,
     .write = write_hf, .import_model = import_hf, .export_model = export_hf},
    {.name = "gguf", .what = "llama.cpp's GGUF file", .model_help = "the .gguf file", .out_help = "the .gguf file",
     .dtypes = {WeightType::f32, WeightType::f16, WeightType::bf16, WeightType::q8_0}, .sniff = is_gguf, .open = gguf::open_model, .check_writable = check_gguf, .write = write_gguf,
     .import_model = import_gguf, .export_model = export_gguf},
};

// The rows for which keep(row) holds, in the table's order.
std::vector<const ModelFormat*> rows_where(bool (*keep)(const ModelFormat&)) {
  std::vector<const ModelFormat*> out;
  for (const ModelFormat& f : kFormats)
    if (keep(f)) out.push_back(&f);
  return out;
}

// The rows import and export take.
const std::vector<const ModelFormat*>& exchanged() {
  static const std::vector<const ModelFormat*> rows = rows_where([](const ModelFormat& f) { return f.exchange; });
  return rows;
}

std::string names_of(const std::vector<const ModelFormat*>& fs) {
  std::string out;
  for (size_t i = 0; i < fs.size(); i++) out += (i == 0 ? "" : i + 1 == fs.size() ? " and " : ", ") + std::string(fs[i]->name);
  return out;
}

}  // namespace

const std::vector<const ModelFormat*>& model_formats() { return exchanged(); }

std::vector<std::string> dtype_names(const std::vector<const ModelFormat*>& rows) {
  std::vector<std::string> out;
  for (const ModelFormat* f : rows)
    for (WeightType t : f->dtypes)
      if (std::find(out.begin(), out.end(), to_string(t)) == out.end()) out.push_back(to_string(t));
  return out;
}

std::string describe_dtypes(const std::vector<const ModelFormat*>& rows) {
  std::string out;
  for (const ModelFormat* f : rows) {
    if (f->dtypes.empty()) continue;
    out += (out.empty() ? "" : "; ") + std::string(f->name) + ":";
    for (size_t i = 0; i < f->dtypes.size(); i++) out += (i ? ", " : " ") + to_string(f->dtypes[i]);
  }
  return out;
}

const std::vector<const ModelFormat*>& writable_formats() {
  static const std::vector<const ModelFormat*> rows = rows_where([](const ModelFormat& f) { return f.write != nullptr; });
  return rows;
}

const ModelFormat& writable_format(const std::string& name, const std::string& flag) {
  for (const ModelFormat* f : writable_formats())
    if (name == f->name) return *f;
  throw Error(ErrorKind::usage, flag + " " + cut_for_message(name) + ": the formats a model is written in are " + names_of(writable_formats()));
}

OpenedModel open_model(const std::string& path) {
  for (const ModelFormat& f : kFormats)
    if (f.sniff && f.open && f.sniff(path)) return f.open(path);
  return open_checkpoint(path);  // its error names what the file is not
}

std::string model_digest(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return file_digest(path, what);
  // a directory: the digests of its regular files by name (config, weights, tokenizer: what a
  // reader reads, and whatever lies beside them), in name order, digested again
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file(ec) && e.path().filename().string().front() != '.') names.push_back(e.path().filename().string());
  if (ec) throw Error(ErrorKind::io, what + " " + path + ": cannot list: " + ec.message());
  std::sort(names.begin(), names.end());
  std::string all;
  for (const std::string& n : names) all += n + "\n" + file_digest((fs::path(path) / n).string(), what) + "\n";
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the list: names and file digests
  for (unsigned char b : all) h = (h ^ b) * 0x100000001b3ull;
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

const ModelFormat& model_format(const std::string& name) {
  for (const ModelFormat* f : exchanged())
    if (name == f->name) return *f;
  throw Error(ErrorKind::usage, "--format " + cut_for_message(name) + ": the formats are " + describe_model_formats());
}

std::vector<std::string> model_format_names() {
  std::vector<std::string> out;
  for (const ModelFormat* f : exchanged()) out.push_back(f->name);
  return out;
}

std::string describe_model_formats() {
  std::string out;
  for (const ModelFormat* f : exchanged()) out += (out.empty() ? "" : ", ") + std::string(f->name) + " (" + f->what + ")";
  return out;
}

void check_import_flags(const ModelFormat& f, const ImportRequest& r) {
  if (!f.tokenizer_files && (!r.tokenizer_model.empty() || !r.tokenizer_bin.empty())) {
    std::vector<const ModelFormat*> with;
    for (const ModelFormat* o : exchanged())
      if (o->tokenizer_files) with.push_back(o);
    throw Error(ErrorKind::usage, "--tokenizer-model and --tokenizer-bin are for " + names_of(with) + ": " + f.what + " holds its own tokenizer");
  }
  if (std::filesystem::is_directory(r.out))
    throw Error(ErrorKind::usage, "--out " + r.out + " is a directory; the checkpoint is one HDF5 file");
}

void check_export_flags(const ModelFormat& f, const ExportRequest& r, bool version_given, bool dtype_given) {
  if (version_given && !f.versions)
    throw Error(ErrorKind::usage, "--version is llama2.c's file version; --format " + std::string(f.name) + " has none");
  const bool float32_only = f.dtypes.empty();
  if (dtype_given && (float32_only ? r.dtype != WeightType::f32 : std::find(f.dtypes.begin(), f.dtypes.end(), r.dtype) == f.dtypes.end())) {
    std::vector<const ModelFormat*> with;
    for (const ModelFormat* o : exchanged())
      if (std::find(o->dtypes.begin(), o->dtypes.end(), r.dtype) != o->dtypes.end()) with.push_back(o);
    throw Error(ErrorKind::usage, "--dtype " + to_string(r.dtype) + (with.empty() ? " is no format's" : " is for --format " + names_of(with)) +
                                      (float32_only ? "; " + std::string(f.what) + " holds float32" : ""));
  }
}

}  // namespace tapelm::formats
