#pragma once
// The subcommands behind the `tapelm` binary: each parses nothing itself and returns an exit code.
#include <string>
#include <vector>

namespace tapelm::cli {

struct TrainArgs {
  std::string config, data, out;
  std::vector<std::string> sets;
  bool resume = false, quiet = false;
  bool check_sync = false;  // multi-rank: checksum every rank's weights after every step
};
struct EvalArgs {
  std::string checkpoint, data, split = "val", grad_out;
  int64_t batch = 16;
  bool json = false;
};
struct SampleArgs {
  std::string checkpoint, prompt = "\n";
  int64_t tokens = 500, top_k = 0;
  double temperature = 0.8;
  uint64_t seed = 1337;
  bool greedy = false;
};
struct ConvertArgs {
  std::string from, method = "mean", out, grouping = "contiguous", calib;
  int64_t kv_heads = 0, calib_tokens = 16384;
  uint64_t seed = 0;
};

struct BenchArgs {
  std::string config, mode = "train";
  std::vector<std::string> sets;
  int64_t batch = 0, decode_len = 0;
  int iters = 10, warmup = 3;
  uint64_t seed = 1337;
  bool json = false;
};

struct UptrainArgs {
  std::string from, method = "mean", data, out, schedule = "rewarm", grouping = "contiguous", config;
  int64_t kv_heads = 0, calib_tokens = 16384;
  double fraction = 0.05, lr = 0;
  uint64_t seed = 1;
  bool resume = false, quiet = false;
};
struct ExportArgs {
  std::string checkpoint, format = "llama2c", out;
  int version = 0;
};
struct ImportArgs {
  std::string format = "llama2c", model, tokenizer_model, tokenizer_bin, out;
};
struct SweepArgs {
  std::string preset = "tiny", data, out, methods, groupings;
  bool quiet = false;
};

int run_uptrain(const UptrainArgs& a);
int run_sweep(const SweepArgs& a);
int run_plot(const std::string& run_dir);
int run_bench(const BenchArgs& a);
int run_train(const TrainArgs& a, int threads);
int run_eval(const EvalArgs& a);
int run_sample(const SampleArgs& a);
int run_convert(const ConvertArgs& a);
int run_inspect(const std::string& path);
/// `inspect --system`: the CPU, BLAS core, GEMM backend and both peaks.
int run_inspect_system();
int run_export(const ExportArgs& a);
int run_import(const ImportArgs& a);
int run_demo();

}  // namespace tapelm::cli
