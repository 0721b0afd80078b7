#include "train/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "autograd/blas.h"
#include "data/sampler.h"
#include "nn/accounting.h"

namespace tapelm {

namespace fs = std::filesystem;

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop = true; }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt_duration(double s) {
  char b[32];
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(b, sizeof b, "%lds", t);
  return b;
}

// Keeps only the metrics of steps up to `step` (a resumed run re-logs the steps after it).
void trim_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t(0)) <= step) kept += line + "\n";
    } catch (const std::exception&) {
    }
  }
  in.close();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    if (!out) throw TrainError(path + ": cannot rewrite the metrics file");
  }
  fs::rename(tmp, path);
}

class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path) : path_(path), out_(path, std::ios::app) {
    if (!out_) throw TrainError(path + ": cannot open the metrics file for writing");
  }
  void write(const nlohmann::json& j) {
    out_ << j.dump() << "\n";
    out_.flush();
  }

 private:
  std::string path_;
  std::ofstream out_;
};
}  // namespace

void install_stop_handler() {
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool stop_requested() { return g_stop.load(); }
void clear_stop_request() { g_stop = false; }

double evaluate_windows(GPT& model, const std::vector<int32_t>& data, const std::vector<int64_t>& starts, int64_t T,
                        int64_t batch) {
  NoGrad ng;
  const bool was_training = model.is_training();
  model.eval();
  double total = 0;
  int64_t count = 0;
  Index x, y;
  for (size_t i = 0; i < starts.size(); i += batch) {
    std::vector<int64_t> chunk(starts.begin() + i, starts.begin() + std::min(starts.size(), i + batch));
    fill_windows(data, chunk, T, x, y);
    const double l = model.loss(x, y).item();
    total += l * static_cast<double>(chunk.size());
    count += static_cast<int64_t>(chunk.size());
  }
  model.train(was_training);
  return count ? total / static_cast<double>(count) : 0.0;
}

double measured_peak_flops() {
  static double peak = 0;
  static int at_threads = -1;
  if (peak > 0 && at_threads == get_num_threads()) return peak;
  // Large enough for OpenBLAS to reach its steady rate on every thread; best of several runs.
  const int64_t n = 1536;
  Tensor a = Tensor::full({n, n}, 0.5f), b = Tensor::full({n, n}, 0.25f), c = Tensor::zeros({n, n});
  double best = 1e30;
  for (int r = 0; r < 8; r++) {
    auto t0 = Clock::now();
    kern::sgemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    if (r >= 2) best = std::min(best, seconds_since(t0));
  }
  peak = 2.0 * n * n * n / best;
  at_threads = get_num_threads();
  return peak;
}

TrainResult train(const TrainConfig& cfg, const Corpus& corpus, const std::string& out_dir, const TrainOptions& opt) {
  const auto t_start = Clock::now();
  set_num_threads(static_cast<int>(cfg.threads));
  if (corpus.tok.vocab_size() > cfg.model.vocab_size)
    throw ConfigError("the corpus has " + std::to_string(corpus.tok.vocab_size()) + " symbols but vocab_size is " +
                      std::to_string(cfg.model.vocab_size));
  const int64_t B = cfg.batch_size, T = cfg.model.block_size;
  check_window_fits(static_cast<int64_t>(corpus.train.size()), T, "train split");
  check_window_fits(static_cast<int64_t>(corpus.val.size()), T, "val split");

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir)) throw TrainError(out_dir + ": cannot create the run directory");
  const std::string ck_path = (fs::path(out_dir) / "checkpoint.h5").string();
  const std::string metrics_path = (fs::path(out_dir) / "metrics.jsonl").string();
  {  // fail now, not after the first interval, when the directory is not writable
    const std::string probe = (fs::path(out_dir) / ".write_test").string();
    std::ofstream t(probe);
    if (!t) throw TrainError(out_dir + ": run directory is not writable");
    t.close();
    fs::remove(probe, ec);
  }

  GPT model(cfg.model, cfg.seed);
  if (opt.init_from) {
    auto src = opt.init_from->named_parameters();
    auto dst = model.named_parameters();
    if (src.size() != dst.size()) throw TrainError("init_from: parameter sets differ");
    for (size_t i = 0; i < src.size(); i++) {
      if (src[i].first != dst[i].first || src[i].second.shape() != dst[i].second.shape())
        throw TrainError("init_from: parameter " + src[i].first + " does not fit " + dst[i].first);
      dst[i].second.val() = src[i].second.val().clone();
    }
  }
  model.train();
  NamedParams params = model.named_parameters();
  std::unique_ptr<Optimizer> optim = cfg.make_optimizer(params);
  BatchSampler sampler(&corpus.train, B, T, cfg.seed, "train split");
  TrainState st;
  st.extra_json = opt.extra_json;

  if (opt.resume) {
    if (!fs::exists(ck_path)) throw TrainError(out_dir + ": --resume but there is no checkpoint.h5 to resume from");
    H5File f = H5File::open_read(ck_path);
    TrainConfig saved = read_train_config(f);
    if (!(saved.model == cfg.model))
      throw CheckpointError(ck_path + ": its model config differs from this run's: " + saved.model.to_json().dump());
    load_training_checkpoint(f, model, *optim, st);
    sampler.set_state(st.sampler_state);
    trim_metrics(metrics_path, st.step);
  } else {
    std::ofstream(metrics_path, std::ios::trunc);
  }
  MetricsLog metrics(metrics_path);

  // Fixed evaluation batches: the same windows at every evaluation.
  const int64_t n_eval = cfg.eval_iters * B;
  auto pick_windows = [&](const std::vector<int32_t>& data, uint64_t seed) {
    std::vector<int64_t> starts;
    Rng r(seed);
    for (int64_t i = 0; i < n_eval; i++) starts.push_back(static_cast<int64_t>(r.below(data.size() - T)));
    return starts;
  };
  const std::vector<int64_t> val_windows = pick_windows(corpus.val, cfg.seed + 7);
  const std::vector<int64_t> train_windows = pick_windows(corpus.train, cfg.seed + 11);

  const ModelCost cost = model_cost(cfg.model);
  const double peak = cfg.peak_flops > 0 ? cfg.peak_flops : measured_peak_flops();
  const double tokens_per_step = static_cast<double>(B * T * cfg.grad_accum);
  const LrSchedule sched = cfg.schedule();
  const float inv_accum = 1.0f / static_cast<float>(cfg.grad_accum);

  TrainResult res;
  std::vector<double> rates;
  auto save = [&] {
    st.dropout_rng = model.dropout_rng().state();
    st.sampler_state = sampler.state();
    save_training_checkpoint(ck_path, model, *optim, cfg, st, corpus.tok);
  };
  auto evaluate = [&](nlohmann::json& rec) {
    const double vl = evaluate_windows(model, corpus.val, val_windows, T, B);
    const double tl = evaluate_windows(model, corpus.train, train_windows, T, B);
    rec["val_loss"] = vl;
    rec["train_loss_eval"] = tl;
    res.val_loss = vl;
    if (!opt.quiet)
      std::printf("%sstep %ld: train loss %.4f, val loss %.4f\n", opt.label.c_str(), static_cast<long>(st.step), tl, vl);
  };

  if (!opt.resume && cfg.max_iters > 0) {
    nlohmann::json rec{{"step", 0}};
    evaluate(rec);
    metrics.write(rec);
  }
  auto t_log = Clock::now();
  int64_t steps_since_log = 0;
  const int64_t first_step = st.step;
  Index x, y;
  while (st.step < cfg.max_iters) {
    const double lr = lr_at(st.step, sched);
    double loss_sum = 0;
    for (int64_t m = 0; m < cfg.grad_accum; m++) {
      sampler.next(x, y);
      Var loss = model.loss(x, y);
      loss_sum += loss.item();
      backward(cfg.grad_accum > 1 ? mul(loss, inv_accum) : loss);
    }
    const double step_loss = loss_sum / static_cast<double>(cfg.grad_accum);
    if (!std::isfinite(step_loss)) {
      Tape::get().clear();
      throw TrainError("step " + std::to_string(st.step) + ": loss is " + (std::isnan(step_loss) ? "NaN" : "Inf") +
                       "; stopping (the last good checkpoint, if any, is " + ck_path + ")");
    }
    if (cfg.grad_clip > 0) clip_grad_norm(params, cfg.grad_clip);
    optim->step(lr);
    optim->zero_grad(false);
    st.step++;
    st.tokens_seen += static_cast<int64_t>(tokens_per_step);
    res.last_train_loss = step_loss;
    steps_since_log++;

    const bool last = st.step == cfg.max_iters;
    const bool stopping = stop_requested();
    if (st.step % cfg.log_interval == 0 || last || stopping || st.step % cfg.eval_interval == 0) {
      const double dt = seconds_since(t_log);
      const double tps = steps_since_log * tokens_per_step / std::max(dt, 1e-9);
      rates.push_back(tps);
      t_log = Clock::now();
      steps_since_log = 0;
      nlohmann::json rec{{"step", st.step}, {"train_loss", step_loss}, {"lr", lr}, {"tokens_per_s", tps}};
      if (st.step % cfg.eval_interval == 0 || last) evaluate(rec);
      metrics.write(rec);
      if (!opt.quiet) {
        const double done = static_cast<double>(st.step - first_step);
        const double eta = done > 0 ? seconds_since(t_start) / done * (cfg.max_iters - st.step) : 0;
        std::printf("%sstep %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | MFU %.1f%% | ETA %s\n", opt.label.c_str(),
                    static_cast<long>(st.step), static_cast<long>(cfg.max_iters), step_loss, lr, tps,
                    100.0 * tps * cost.train_flops_per_token / peak, fmt_duration(eta).c_str());
        std::fflush(stdout);
      }
    }
    if (st.step % cfg.checkpoint_interval == 0 || last || stopping) save();
    if (stopping && !last) {
      res.interrupted = true;
      if (!opt.quiet)
        std::printf("%sstopped by signal at step %ld; checkpoint written to %s\n", opt.label.c_str(),
                    static_cast<long>(st.step), ck_path.c_str());
      break;
    }
  }
  if (st.step >= cfg.max_iters && !fs::exists(ck_path)) save();  // max_iters = 0: weights as they start
  res.steps = st.step;
  res.seconds = seconds_since(t_start);
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    res.tokens_per_s = rates[rates.size() / 2];
  }
  return res;
}

}  // namespace tapelm
