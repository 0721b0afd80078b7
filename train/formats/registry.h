#pragma once
// The model formats tapelm reads and writes, one row each: how a path is told to be one (sniff),
// how it is opened (one way to open a model everywhere: eval, sample, convert, uptrain and sweep
// --from), what an output in it can hold (check_writable) and how a model is written into it from
// a stream of tensors (write), with the flags and help text of import and export. The CLI parses
// flags against this table and calls the row; convert's output is a row's write.
#include <string>
#include <utility>
#include <vector>

#include "train/formats/model_sink.h"
#include "train/formats/model_source.h"

namespace tapelm::formats {

/// What `import` is asked.
struct ImportRequest {
  std::string model, out;
  std::string tokenizer_model, tokenizer_bin;  // formats whose tokenizer lives outside the model file
};
/// What `export` is asked.
struct ExportRequest {
  std::string checkpoint, out;
  WeightType dtype = WeightType::f32;
  int version = 0;
};

/// Where and how a model is written.
struct Output {
  std::string path;
  WeightType dtype = WeightType::f32;
  std::string what;  // names the model in errors ("checkpoint ck.h5 converted to 2 kv heads")
  std::string name;  // the model's name where the format keeps one (GGUF's general.name is its stem)
  std::pair<std::string, std::string> note;  // a checkpoint's record of where the model came from ("converted_from", JSON)
};

struct ModelFormat {
  const char* name;        // --format NAME
  const char* what;        // "llama2.c's model file": help text
  const char* model_help;  // what import's --model names
  const char* out_help;    // what export's --out names
  std::vector<WeightType> dtypes;   // the --dtype values it holds; empty: float32 only
  bool versions = false;            // export --version (llama2.c's file versions)
  bool tokenizer_files = false;     // import --tokenizer-model / --tokenizer-bin: the tokenizer is not in the model file
  bool directory = false;           // the model is a directory
  bool exchange = true;             // import and export take it (tapelm's own checkpoint is what they read into and from)
  /// The path is this format's, told by its kind and first bytes; null: never guessed (llama2.c's
  /// file has no magic in version 0 and its tokenizer lives beside it).
  bool (*sniff)(const std::string& path) = nullptr;
  OpenedModel (*open)(const std::string& path) = nullptr;
  /// Throws what write would refuse (a dtype, an output of the wrong kind, a model the format
  /// cannot hold), before any work.
  void (*check_writable)(const Output& o, const GPTConfig& c, const Tokenizer* tok) = nullptr;
  /// Writes the model fill pushes (all or nothing); returns what was written, for the CLI's line.
  std::string (*write)(const Output& o, const GPTConfig& c, const Tokenizer* tok, const SinkFill& fill) = nullptr;
  /// Each returns the line the CLI prints.
  std::string (*import_model)(const ImportRequest&) = nullptr;
  std::string (*export_model)(const ExportRequest&) = nullptr;
};

/// The formats import and export take, in the order help lists them.
const std::vector<const ModelFormat*>& model_formats();
/// The formats a model is written in by a stream of tensors (convert --format), the checkpoint first.
const std::vector<const ModelFormat*>& writable_formats();
/// The --dtype names any of `rows` holds, each once in the rows' order, and the help that lists
/// them by format ("hf: f32, bf16, f16; gguf: f32, f16, bf16, q8_0").
std::vector<std::string> dtype_names(const std::vector<const ModelFormat*>& rows);
std::string describe_dtypes(const std::vector<const ModelFormat*>& rows);
/// The row of a writable format; an unknown name is a usage Error naming `flag` and the names.
const ModelFormat& writable_format(const std::string& name, const std::string& flag);
/// Opens `path` as the format it is: the first row whose sniff says so (a directory with
/// config.json is Hugging Face's, a file starting with "GGUF" llama.cpp's), else a tapelm
/// checkpoint. Errors name the path and the key or tensor.
OpenedModel open_model(const std::string& path);
/// A digest of the model's files by content (file_digest; a directory's files the reader reads, by
/// name): what a run records of its --from, so that another model under the same path is told.
std::string model_digest(const std::string& path, const std::string& what);
/// The row of --format NAME; an unknown name is a usage Error listing the names.
const ModelFormat& model_format(const std::string& name);
/// The names, for CLI11's IsMember.
std::vector<std::string> model_format_names();
/// "llama2c (llama2.c's model file), hf (...), gguf (...)".
std::string describe_model_formats();
/// Throws a usage Error when a flag the request sets is not one the format takes.
void check_import_flags(const ModelFormat& f, const ImportRequest& r);
void check_export_flags(const ModelFormat& f, const ExportRequest& r, bool version_given, bool dtype_given);

}  // namespace tapelm::formats
