// tapelm: the command line, a thin layer of flag parsing over the library.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "autograd/cpu.h"
#include "autograd/gradcheck.h"
#include "autograd/runtime.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "data/tokens.h"
#include "train/dist.h"
#include "nn/accounting.h"
#include "nn/generate.h"
#include "train/cli/cli.h"
#include "train/train_config.h"

using namespace tapelm;

namespace {
/// A flag that cannot be parsed as one line: CLI11's first line, the value in it cut.
std::string parse_error_line(const CLI::ParseError& e) {
  const std::string what = e.what();
  return cut_for_message(what.substr(0, what.find('\n')), 200);
}
}  // namespace

int main(int argc, char** argv) {
  // Before MPI and before any work: may re-execute this program with better BLAS kernels.
  try {
    guard_blas_core(argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "tapelm: error: %s\n", e.what());
    return 1;
  }
  dist::Session mpi(&argc, &argv);  // initialises MPI only under an MPI launcher
  CLI::App app{"tapelm: train small GPT language models with MHA, GQA or MQA attention"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  int threads = 0;
  app.add_option("--threads", threads, "threads for kernels and BLAS (0: all cores)")
      ->check(CLI::Range(0, static_cast<int>(max_threads)));
  // seeds follow the config's rule (TrainConfig's max_seed): 0 to 2^63 - 1
  const CLI::Range seed_range(uint64_t{0}, max_seed);

  cli::TrainArgs ta;
  auto* train = app.add_subcommand("train", "train a model (nanoGPT's train.py)");
  train->add_option("--config", ta.config, "training config JSON (model and training keys)");
  train->add_option("--set", ta.sets, "override a config key: key=value (repeatable)");
  train->add_option("--data", ta.data, "UTF-8 text file or a directory of token shards (`prepare`)")->required();
  train->add_option("--out", ta.out, "run directory (checkpoint.h5, metrics.jsonl)")->required();
  train->add_flag("--resume", ta.resume, "continue from RUN_DIR/checkpoint.h5");
  train->add_flag("--quiet", ta.quiet, "no progress lines");
  train->add_flag("--check-sync", ta.check_sync,
                  "under mpirun: compare every rank's weights after every step (debugging)");

  cli::EvalArgs ea;
  auto* eval = app.add_subcommand("eval", "loss of a checkpoint on text, tokens or a parity file");
  eval->add_option("--checkpoint", ea.checkpoint, "checkpoint (HDF5)")->required();
  eval->add_option("--data", ea.data, "text file, token file (.bin), prepared directory or parity file (.h5)")->required();
  eval->add_option("--split", ea.split, "for text: train, val or all")->check(CLI::IsMember({"train", "val", "all"}));
  eval->add_option("--grad-out", ea.grad_out, "write d loss / d parameter to this HDF5 file");
  eval->add_option("--batch", ea.batch, "windows per forward pass");
  eval->add_flag("--json", ea.json, "print one JSON line");

  cli::SampleArgs sa;
  auto* sample = app.add_subcommand("sample", "generate text from a checkpoint");
  sample->add_option("--checkpoint", sa.checkpoint, "checkpoint (HDF5) with a tokenizer")->required();
  sample->add_option("--prompt", sa.prompt, "text to continue (default: a newline)");
  sample->add_option("--tokens", sa.tokens, "tokens to generate");
  sample->add_option("--temperature", sa.temperature, "softmax temperature");
  sample->add_option("--top-k", sa.top_k, "sample among the k most likely tokens (0: all)");
  sample->add_option("--seed", sa.seed, "random seed")->check(seed_range);
  sample->add_flag("--greedy", sa.greedy, "always take the most likely token");

  cli::ConvertArgs ca;
  auto* convert = app.add_subcommand("convert", "convert MHA/GQA to fewer key/value heads");
  convert->add_option("--from", ca.from, "source checkpoint")->required();
  convert->add_option("--kv-heads", ca.kv_heads, "new number of key/value heads (divides the old)")->required();
  convert->add_option("--method", ca.method, "mean, first, random, mean-norm, aligned, fit or aligned-fit");
  convert->add_option("--grouping", ca.grouping, "contiguous or similar (similar K/V heads share a group)");
  convert->add_option("--calib", ca.calib, "calibration data for aligned, fit, aligned-fit and similar: what eval takes (text: its train split)");
  convert->add_option("--calib-tokens", ca.calib_tokens, "calibration tokens, drawn as seeded random windows");
  convert->add_option("--out", ca.out, "output checkpoint")->required();
  convert->add_option("--seed", ca.seed, "seed for --method random and the calibration windows")->check(seed_range);

  cli::UptrainArgs ua;
  auto* up = app.add_subcommand("uptrain", "convert to fewer kv heads, then train a fraction of the original steps");
  up->add_option("--from", ua.from, "full checkpoint of the original run")->required();
  up->add_option("--kv-heads", ua.kv_heads, "new number of key/value heads")->required();
  up->add_option("--method", ua.method, "mean, first, random, mean-norm, aligned, fit or aligned-fit");
  up->add_option("--grouping", ua.grouping, "contiguous or similar");
  up->add_option("--calib-tokens", ua.calib_tokens, "calibration tokens from the train split (aligned, fit, aligned-fit, similar)");
  up->add_option("--fraction", ua.fraction, "uptraining steps as a fraction of the original max_iters (0: convert and evaluate)");
  up->add_option("--schedule", ua.schedule, "rewarm (warmup + cosine) or continue (the original final lr)")
      ->check(CLI::IsMember({"rewarm", "continue"}));
  up->add_option("--data", ua.data, "the original run's text or prepared directory")->required();
  up->add_option("--out", ua.out, "run directory")->required();
  up->add_option("--config", ua.config,
                 "training config JSON for a weights-only source (an imported model); the model keys are the checkpoint's");
  up->add_option("--lr", ua.lr, "rewarm: peak learning rate (default: half the original run's peak)");
  up->add_option("--seed", ua.seed, "seed for batches, dropout and random init")->check(seed_range);
  up->add_flag("--resume", ua.resume, "continue an interrupted uptraining run");
  up->add_flag("--quiet", ua.quiet, "no progress lines");

  cli::SweepArgs sw;
  auto* sweep = app.add_subcommand("sweep", "the MHA -> GQA/MQA trade-off study with report and plots");
  sweep->add_option("--preset", sw.preset, "tiny (~10 min), small (~1 h) or paper (long)")
      ->check(CLI::IsMember({"tiny", "small", "paper", "micro"}));
  sweep->add_option("--data", sw.data, "UTF-8 text (or a prepared directory)")->required();
  sweep->add_option("--out", sw.out, "report directory (re-running resumes)")->required();
  sweep->add_option("--methods", sw.methods, "conversion methods, comma-separated (default: all; must include mean)");
  sweep->add_option("--groupings", sw.groupings, "groupings, comma-separated: contiguous,similar (default: contiguous)");
  sweep->add_flag("--quiet", sw.quiet, "no progress lines");

  std::string plot_dir;
  auto* plot = app.add_subcommand("plot", "draw RUN_DIR/loss.png from RUN_DIR/metrics.jsonl");
  plot->add_option("run_dir", plot_dir, "run directory")->required();

  std::string inspect_path;
  auto* inspect = app.add_subcommand("inspect", "config, parameters, FLOPs and KV-cache bytes of a checkpoint");
  bool inspect_system = false;
  inspect->add_option("checkpoint", inspect_path, "checkpoint (HDF5)");
  inspect->add_flag("--system", inspect_system, "the CPU, OpenBLAS core, GEMM backend and both FLOP/s peaks instead");

  PrepareOptions po;
  bool prep_quiet = false;
  auto* prepare_cmd = app.add_subcommand("prepare", "tokenize text files into llm.c token shards, meta.json and the tokenizer");
  prepare_cmd->add_option("--text", po.texts, "UTF-8 text files (each a document unless --doc-sep splits them)")->required();
  prepare_cmd->add_option("--out", po.out_dir, "output directory")->required();
  prepare_cmd->add_option("--tokenizer", po.tokenizer, "char (default), bpe or unigram (sentencepiece)")
      ->check(CLI::IsMember({"char", "bpe", "unigram"}));
  prepare_cmd->add_option("--vocab-size", po.vocab_size, "bpe/unigram: pieces in the trained model (default 4096)")
      ->check(CLI::Range(1, 1048576));
  prepare_cmd->add_option("--tokenizer-model", po.tokenizer_model, "use this sentencepiece .model instead of training one");
  prepare_cmd->add_option("--sample-bytes", po.sample_bytes, "bpe/unigram: train on at most this much text (default 100 MB)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  prepare_cmd->add_option("--doc-sep", po.doc_sep, "document separator, e.g. <|endoftext|> (default: one document per file)");
  prepare_cmd->add_option("--val-fraction", po.val_fraction, "fraction of the documents (of the tokens, for one) in val (default 0.1)")
      ->check(CLI::Range(0.0, 0.99));
  prepare_cmd->add_option("--shard-tokens", po.shard_tokens, "tokens per shard file (default 100000000)")
      ->check(CLI::Range(int64_t{1}, int64_t{2147483647}));
  prepare_cmd->add_flag("--quiet", prep_quiet, "no progress lines");

  cli::ExportArgs xa;
  auto* export_cmd = app.add_subcommand("export", "write a checkpoint's model in another program's format (llama2.c)");
  export_cmd->add_option("--checkpoint", xa.checkpoint, "checkpoint (HDF5)")->required();
  export_cmd->add_option("--format", xa.format, "llama2c")->required()->check(CLI::IsMember({"llama2c"}));
  export_cmd->add_option("--version", xa.version, "llama2.c file version: 0 (what run.c reads, default) or 1")
      ->check(CLI::IsMember({0, 1}));
  export_cmd->add_option("--out", xa.out, "model file (model.bin)")->required();

  cli::ImportArgs ia;
  auto* import_cmd = app.add_subcommand("import", "read another program's model file (llama2.c) into a checkpoint");
  import_cmd->add_option("--format", ia.format, "llama2c")->required()->check(CLI::IsMember({"llama2c"}));
  import_cmd->add_option("--model", ia.model, "llama2.c model file, version 0 or 1")->required();
  import_cmd->add_option("--tokenizer-model", ia.tokenizer_model, "sentencepiece model (.model) to store with the weights");
  import_cmd->add_option("--tokenizer-bin", ia.tokenizer_bin,
                         "run.c's tokenizer.bin for the model: checked to hold the --tokenizer-model's pieces and scores");
  import_cmd->add_option("--out", ia.out, "output checkpoint (HDF5, weights only)")->required();

  cli::BenchArgs ba;
  auto* bench = app.add_subcommand("bench", "speed of a training step or of KV-cache decoding");
  bench->add_option("--config", ba.config, "config JSON (model keys, batch_size)");
  bench->add_option("--set", ba.sets, "override a config key: key=value (repeatable)");
  bench->add_option("--mode", ba.mode, "train or decode")->check(CLI::IsMember({"train", "decode"}));
  bench->add_option("--batch", ba.batch, "batch (default: batch_size for train, 1 for decode)");
  bench->add_option("--decode-len", ba.decode_len, "decode: tokens per sequence (default: block_size)");
  bench->add_option("--iters", ba.iters, "timed iterations");
  bench->add_option("--warmup", ba.warmup, "untimed iterations first");
  bench->add_option("--seed", ba.seed, "seed for weights and tokens")->check(seed_range);
  bench->add_flag("--json", ba.json, "print one JSON line");

  auto* demo = app.add_subcommand("demo", "a tiny forward/backward with a gradient check");

  std::optional<CLI::ParseError> parse_error;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (!dist::multi() && e.get_exit_code() == 0) return app.exit(e);  // --help
    if (!dist::multi()) {
      std::fprintf(stderr, "tapelm: error: %s\n", parse_error_line(e).c_str());
      return 1;
    }
    parse_error = e;
  }
  if (dist::multi()) {  // one decision for the whole job: a rank that left alone would hang the rest
    std::string why;    // this rank's reason not to train, "" if none
    const bool help = parse_error && parse_error->get_exit_code() == 0;
    if (help) {
      std::ostringstream out, err;
      app.exit(*parse_error, out, err);
      why = out.str();
    } else if (parse_error) {
      why = parse_error_line(*parse_error);
    } else if (!*train) {
      why = "only `tapelm train` runs on more than one MPI rank (this job has " + std::to_string(dist::size()) + ")";
    }
    try {
      dist::agree(why);
    } catch (const dist::AgreedError& e) {
      if (e.print_here && help) std::fputs(why.c_str(), stdout);
      else if (e.print_here) std::fprintf(stderr, "tapelm: error: %s\n", e.what());
      return help ? 0 : 1;
    }
  }
  try {
    set_num_threads(threads);
    if (*train) return cli::run_train(ta, threads);
    if (*eval) return cli::run_eval(ea);
    if (*sample) return cli::run_sample(sa);
    if (*convert) return cli::run_convert(ca);
    if (*inspect && inspect_system) return cli::run_inspect_system();
    if (*inspect && inspect_path.empty()) throw Error(ErrorKind::usage, "inspect: give a checkpoint, or --system");
    if (*inspect) return cli::run_inspect(inspect_path);
    if (*prepare_cmd) {
      if (!prepare_cmd->count("--tokenizer") && !po.tokenizer_model.empty()) po.tokenizer = "bpe";
      po.progress = !prep_quiet;
      const PrepareResult r = prepare_corpus(po);
      std::printf("prepared %s: %s tokenizer of %d ids; train %ld tokens (%ld documents), val %ld tokens (%ld documents) "
                  "in %ld shards; %.1f MB of text encoded at %.2f MB/s (%.1fs in all)\n",
                  po.out_dir.c_str(), r.tok.kind_name().c_str(), r.tok.vocab_size(), (long)r.train_tokens, (long)r.train_docs,
                  (long)r.val_tokens, (long)r.val_docs, (long)r.shards, r.text_bytes / 1e6,
                  r.text_bytes / 1e6 / std::max(r.encode_seconds, 1e-9), r.seconds);
      return 0;
    }
    if (*bench) return cli::run_bench(ba);
    if (*export_cmd) return cli::run_export(xa);
    if (*import_cmd) return cli::run_import(ia);
    if (*up) return cli::run_uptrain(ua);
    if (*sweep) return cli::run_sweep(sw);
    if (*plot) return cli::run_plot(plot_dir);
    if (*demo) return cli::run_demo();
  } catch (const dist::AgreedError& e) {  // every rank has it; one reports
    if (e.print_here) std::fprintf(stderr, "tapelm: error: %s\n", e.what());
    return 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "tapelm: error: %s%s\n", dist::rank_prefix().c_str(), e.what());
    if (dist::multi()) dist::abort_job(1);  // the other ranks may be waiting in a collective
    return 1;
  } catch (const std::exception& e) {  // not tapelm's own: a library's error, or a broken invariant
    std::fprintf(stderr, "tapelm: error: %s%s\n", dist::rank_prefix().c_str(), e.what());
    if (dist::multi()) dist::abort_job(1);  // the other ranks may be waiting in a collective
    return 1;
  }
  return 0;
}
