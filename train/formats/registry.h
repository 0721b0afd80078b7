#pragma once
// The model formats tapelm imports and exports, one row each: their flags, their help text and
// what runs them. The CLI's import and export parse flags against this table and call the row.
#include <string>
#include <vector>

namespace tapelm::formats {

/// What `import` is asked.
struct ImportRequest {
  std::string model, out;
  std::string tokenizer_model, tokenizer_bin;  // formats whose tokenizer lives outside the model file
};
/// What `export` is asked.
struct ExportRequest {
  std::string checkpoint, out, dtype = "f32";
  int version = 0;
};

struct ModelFormat {
  const char* name;        // --format NAME
  const char* what;        // "llama2.c's model file": help text
  const char* model_help;  // what import's --model names
  const char* out_help;    // what export's --out names
  std::vector<std::string> dtypes;  // export --dtype values; empty: float32 only
  bool versions = false;            // export --version (llama2.c's file versions)
  bool tokenizer_files = false;     // import --tokenizer-model / --tokenizer-bin: the tokenizer is not in the model file
  bool directory = false;           // the model is a directory
  /// Each returns the line the CLI prints.
  std::string (*import_model)(const ImportRequest&) = nullptr;
  std::string (*export_model)(const ExportRequest&) = nullptr;
};

/// Every format, in the order help lists them.
const std::vector<ModelFormat>& model_formats();
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
