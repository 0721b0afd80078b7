// import and export: other programs' model files, through the format registry.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "train/cli/commands.h"
#include "train/cli/common.h"
#include "data/outdir.h"
#include "train/formats/registry.h"

namespace tapelm::cli {

namespace fs = std::filesystem;

namespace {

struct ExportArgs {
  formats::ExportRequest r;
  std::string format, dtype = "f32";
  CLI::Option *version_opt = nullptr, *dtype_opt = nullptr;
};

std::string format_help(const char* formats::ModelFormat::*field) {
  std::string out;
  for (const formats::ModelFormat* f : formats::model_formats()) out += (out.empty() ? "" : "; ") + std::string(f->name) + ": " + f->*field;
  return out;
}

void export_flags(CLI::App& c, ExportArgs& a) {
  c.add_option("--checkpoint", a.r.checkpoint, "checkpoint (HDF5)")->required();
  c.add_option("--format", a.format, formats::describe_model_formats())->required()->check(CLI::IsMember(formats::model_format_names()));
  a.version_opt = c.add_option("--version", a.r.version, "llama2c: file version 0 (what run.c reads, default) or 1")->check(CLI::IsMember({0, 1}));
  a.dtype_opt = c.add_option("--dtype", a.dtype, "the weights' type (default f32); " + formats::describe_dtypes(formats::model_formats()))
                    ->check(CLI::IsMember(formats::dtype_names(formats::model_formats())));
  c.add_option("--out", a.r.out, format_help(&formats::ModelFormat::out_help))->required();
}

int run_export(const ExportArgs& a) {
  refuse_outputs_over_inputs({{"--out", a.r.out}}, {{"--checkpoint", a.r.checkpoint}});
  const formats::ModelFormat& f = formats::model_format(a.format);
  formats::ExportRequest r = a.r;
  r.dtype = enum_from_name<WeightType>(a.dtype, "--dtype");
  formats::check_export_flags(f, r, a.version_opt->count() > 0, a.dtype_opt->count() > 0);
  std::printf("%s\n", f.export_model(r).c_str());
  return 0;
}

struct ImportArgs {
  formats::ImportRequest r;
  std::string format;
};

void import_flags(CLI::App& c, ImportArgs& a) {
  c.add_option("--format", a.format, formats::describe_model_formats())->required()->check(CLI::IsMember(formats::model_format_names()));
  c.add_option("--model", a.r.model, format_help(&formats::ModelFormat::model_help))->required();
  CLI::Option* model = c.add_option("--tokenizer-model", a.r.tokenizer_model, "llama2c: sentencepiece model (.model) to store with the weights");
  c.add_option("--tokenizer-bin", a.r.tokenizer_bin,
               "llama2c: run.c's tokenizer.bin for the model, checked to hold the --tokenizer-model's pieces and scores")
      ->needs(model);
  c.add_option("--out", a.r.out, "output checkpoint (HDF5, weights only)")->required();
}

int run_import(const ImportArgs& a) {
  refuse_outputs_over_inputs({{"--out", a.r.out}},
                             {{"--model", a.r.model}, {"--tokenizer-model", a.r.tokenizer_model}, {"--tokenizer-bin", a.r.tokenizer_bin}});
  const formats::ModelFormat& f = formats::model_format(a.format);
  formats::check_import_flags(f, a.r);
  std::printf("%s\n", f.import_model(a.r).c_str());
  return 0;
}

}  // namespace

Command export_command(CLI::App& app) {
  return command(app, "export", "write a checkpoint's model in another program's format (" + format_list() + ")", export_flags,
                 run_export);
}

Command import_command(CLI::App& app) {
  return command(app, "import", "read another program's model (" + format_list() + ") into a checkpoint", import_flags, run_import);
}

}  // namespace tapelm::cli
