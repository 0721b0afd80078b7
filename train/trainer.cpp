#include "train/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <tuple>

#include "autograd/kernels/blas.h"
#include "autograd/kernels/kernels.h"
#include "autograd/record.h"
#include "autograd/runtime.h"
#include "data/sampler.h"
#include "train/dist.h"
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
  // mpirun forwards SIGUSR1 to every rank without ending the job (Ctrl-C on mpirun sends SIGTERM
  // and, one second later, SIGKILL: too soon for a large model to finish its step and save).
  sigaction(SIGUSR1, &sa, nullptr);
}

bool stop_requested() { return g_stop.load(); }
void clear_stop_request() { g_stop = false; }

double evaluate_windows(GPT& model, const std::vector<int32_t>& data, const std::vector<int64_t>& starts, int64_t T,
                        int64_t batch, bool split_across_ranks) {
  NoGrad ng;
  const bool was_training = model.is_training();
  model.eval();
  const size_t stride = split_across_ranks ? static_cast<size_t>(dist::size()) : 1;
  const size_t first = split_across_ranks ? static_cast<size_t>(dist::rank()) : 0;
  double sums[2] = {0, 0};  // loss * windows, windows
  Index x, y;
  for (size_t i = first * batch; i < starts.size(); i += stride * batch) {
    std::vector<int64_t> chunk(starts.begin() + i, starts.begin() + std::min(starts.size(), i + batch));
    fill_windows(data, chunk, T, x, y);
    const double l = model.loss(x, y).item();
    sums[0] += l * static_cast<double>(chunk.size());
    sums[1] += static_cast<double>(chunk.size());
  }
  if (split_across_ranks) dist::allreduce_sum(sums, 2);
  model.train(was_training);
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

double evaluate_split(GPT& model, const std::vector<int32_t>& split, bool split_across_ranks) {
  const int64_t T = model.config().block_size;
  return evaluate_windows(model, split, eval_windows(split, T, "val split"), T, 32, split_across_ranks);
}

namespace {
// One flat buffer for the gradient all-reduce: every gradient, then the step's loss and the
// number of ranks asked to stop, so one MPI_Allreduce per step carries every decision.
class GradReducer {
 public:
  explicit GradReducer(const NamedParams& params) : params_(params) {
    for (const auto& [name, p] : params_) n_ += static_cast<size_t>(p.numel());
    buf_.resize(n_ + 2);
  }
  /// Averages the gradients over ranks in place; returns the mean loss and whether any rank stops.
  std::pair<double, bool> reduce(double loss, bool stop) {
    size_t off = 0;
    for (const auto& [name, p] : params_) {  // p.grad() allocates a zero gradient if p got none
      std::copy_n(p.grad().data(), p.numel(), buf_.data() + off);
      off += static_cast<size_t>(p.numel());
    }
    buf_[n_] = static_cast<float>(loss);
    buf_[n_ + 1] = stop ? 1.f : 0.f;
    dist::allreduce_sum(buf_.data(), buf_.size());
    const float inv = 1.0f / static_cast<float>(dist::size());
    off = 0;
    for (const auto& [name, p] : params_) {
      float* g = p.grad().data();
      const float* b = buf_.data() + off;
      const int64_t n = p.numel();
#pragma omp parallel for simd schedule(static) if (parallel: n >= kern::kParallelMin)
      for (int64_t i = 0; i < n; i++) g[i] = b[i] * inv;
      off += static_cast<size_t>(n);
    }
    return {static_cast<double>(buf_[n_]) * inv, buf_[n_ + 1] > 0};
  }
 private:
  const NamedParams& params_;
  size_t n_ = 0;
  std::vector<float> buf_;
};

// Rank 0's weights to every rank, and a check that every rank runs the same config on the same data.
// Every rank must also hold the same resumed state and options, or their collectives would differ.
void agree_on_start(const NamedParams& params, Optimizer& optim, const TrainState& st, const TrainConfig& cfg,
                    const Corpus& corpus, const TrainOptions& opt) {
  auto sum = [](const std::vector<int32_t>& v) { return std::to_string(dist::checksum(v.data(), v.size() * 4)); };
  const std::string data = corpus.tok.to_json() + "|" + sum(corpus.train) + "|" + sum(corpus.val);
  uint64_t moments = 0;
  for (const std::string& key : optim.state_keys())
    for (const auto& [name, t] : optim.state(key))
      moments = moments * 31 + dist::checksum(t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
  const std::string state = std::to_string(st.step) + "|" + std::to_string(st.tokens_seen) + "|" +
                            std::to_string(optim.steps()) + "|" + std::to_string(moments) + "|" +
                            std::to_string(opt.resume) + std::to_string(opt.check_sync);
  const std::string mine = cfg.to_json().dump() + "#" + data + "#" + state;
  std::string lead = mine;
  dist::broadcast(lead);
  std::string err;
  if (mine != lead) {
    const size_t a = lead.find('#'), b = lead.find('#', a + 1);
    if (cfg.to_json().dump() != lead.substr(0, a))
      err = "its training config differs from rank 0's (config: " + cfg.to_json().dump() + ")";
    else if (data != lead.substr(a + 1, b - a - 1))
      err = "its data differ from rank 0's (another corpus or tokenizer)";
    else
      err = "its resumed state or options differ from rank 0's (step " + std::to_string(st.step) +
            "; is RUN_DIR the same file on every rank? are --resume and --check-sync given to all?)";
  }
  dist::agree(err);
  for (const auto& [name, p] : params) dist::broadcast(p.val().data(), static_cast<size_t>(p.numel()));
}
}  // namespace

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

void check_ranks_in_sync(const NamedParams& params, int64_t step) {
  std::vector<uint64_t> lo, hi;
  for (const auto& [name, p] : params) lo.push_back(dist::checksum(p.val().data(), p.numel() * sizeof(float)));
  hi = lo;
  dist::allreduce_min(lo.data(), lo.size());
  dist::allreduce_max(hi.data(), hi.size());
  for (size_t i = 0; i < lo.size(); i++)
    if (lo[i] != hi[i])
      throw dist::AgreedError("step " + std::to_string(step) + ": parameter " + params[i].first +
                                  " differs between ranks (--check-sync)",
                              dist::rank() == 0);
}

TrainResult train(const TrainConfig& cfg, const Corpus& corpus, const std::string& out_dir, const TrainOptions& opt) {
  const auto t_start = Clock::now();
  const int rank = dist::rank(), world = dist::size();
  const bool lead = rank == 0, multi = world > 1;
  const bool quiet = opt.quiet || !lead;
  if (multi && opt.init_from) throw TrainError("init_from is for one-process runs");
  set_num_threads(static_cast<int>(cfg.threads));
  const std::string ck_path = (fs::path(out_dir) / "checkpoint.h5").string();
  const std::string metrics_path = (fs::path(out_dir) / "metrics.jsonl").string();
  const int64_t B = cfg.batch_size, T = cfg.model.block_size;
  GPT model(cfg.model, cfg.seed);
  NamedParams params = model.named_parameters();
  std::unique_ptr<Optimizer> optim;
  std::optional<BatchSampler> sampler;
  TrainState st;
  st.extra_json = opt.extra_json;
  std::optional<MetricsLog> metrics;

  // Set-up: anything that fails here fails before the first collective, so in a multi-rank job
  // every rank learns of it at dist::agree and the job ends with the failing rank's message.
  auto set_up = [&] {
    optim = cfg.make_optimizer(params);
    if (corpus.tok.vocab_size() > cfg.model.vocab_size)
      throw ConfigError("the corpus has " + std::to_string(corpus.tok.vocab_size()) + " symbols but vocab_size is " +
                        std::to_string(cfg.model.vocab_size));
    check_window_fits(static_cast<int64_t>(corpus.train.size()), T, "train split");
    check_window_fits(static_cast<int64_t>(corpus.val.size()), T, "val split");

    std::error_code ec;
    if (lead) fs::create_directories(out_dir, ec);
    if (ec || (lead && !fs::is_directory(out_dir))) throw TrainError(out_dir + ": cannot create the run directory");
    if (lead) {  // fail now, not after the first interval, when the directory is not writable
      const std::string probe = (fs::path(out_dir) / ".write_test").string();
      std::ofstream t(probe);
      if (!t) throw TrainError(out_dir + ": run directory is not writable");
      t.close();
      fs::remove(probe, ec);
      // Temp files of a checkpoint write that a killed job left behind (the checkpoint is intact).
      for (const auto& e : fs::directory_iterator(out_dir, ec))
        if (e.path().filename().string().rfind("checkpoint.h5.tmp.", 0) == 0) fs::remove(e.path(), ec);
    }

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
    // Each rank draws its own batches and dropout masks; rank 0's streams are a one-process run's.
    sampler.emplace(&corpus.train, B, T, dist::rank_seed(cfg.seed, rank), "train split");
    model.dropout_rng().set_state(dist::rank_seed(model.dropout_rng().state(), rank));

    if (opt.resume) {
      if (!fs::exists(ck_path)) throw TrainError(out_dir + ": --resume but there is no checkpoint.h5 to resume from");
      H5File f = H5File::open_read(ck_path);
      TrainConfig saved = read_train_config(f);
      if (!(saved.model == cfg.model))
        throw CheckpointError(ck_path + ": its model config differs from this run's: " + saved.model.to_json().dump());
      load_training_checkpoint(f, model, *optim, st);
      if (rank == 0) {
        sampler->set_state(st.sampler_state);
      } else if (rank < st.world_size) {  // this rank's own streams, where it left them
        sampler->set_state(st.rank_sampler_states.at(rank - 1));
        model.dropout_rng().set_state(st.rank_dropout_rngs.at(rank - 1));
      } else {  // a rank the saved run did not have: fresh streams, distinct from any used before
        const uint64_t epoch = static_cast<uint64_t>(st.step) + 1;
        sampler.emplace(&corpus.train, B, T, dist::rank_seed(cfg.seed, rank, epoch), "train split");
        model.dropout_rng().set_state(dist::rank_seed(cfg.seed ^ 0xD50D0u, rank, epoch));
      }
      if (lead && st.world_size != world && !quiet)
        std::printf("%sresuming a %d-rank run with %d rank%s: ranks below %d continue their data streams%s\n",
                    opt.label.c_str(), st.world_size, world, world > 1 ? "s" : "", std::min(st.world_size, world),
                    world > st.world_size ? ", the others start new ones" : "");
      if (lead) trim_metrics(metrics_path, st.step);
    } else if (lead) {
      std::ofstream(metrics_path, std::ios::trunc);
    }
    if (lead) metrics.emplace(metrics_path);
  };
  std::string setup_error;
  try {
    set_up();
  } catch (const std::exception& e) {
    if (!multi) throw;
    setup_error = *e.what() ? e.what() : "unknown error";
  }
  dist::agree(setup_error);
  if (multi) agree_on_start(params, *optim, st, cfg, corpus, opt);

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
  // The job's peak: every rank measures its own share at once (so they compete as in training).
  double peak = cfg.peak_flops > 0 ? cfg.peak_flops : measured_peak_flops();
  dist::allreduce_sum(&peak, 1);
  const double tokens_per_step = static_cast<double>(B * T * cfg.grad_accum * world);
  const LrSchedule sched = cfg.schedule();
  const float inv_accum = 1.0f / static_cast<float>(cfg.grad_accum);

  TrainResult res;
  std::vector<double> rates;
  std::optional<GradReducer> reducer;
  if (multi) reducer.emplace(params);
  auto save = [&] {  // a collective: rank 0 gathers every rank's streams, then writes alone
    const std::vector<std::string> streams = dist::gather(std::to_string(model.dropout_rng().state()) + "\n" + sampler->state());
    if (!lead) return;
    st.dropout_rng = model.dropout_rng().state();
    st.sampler_state = sampler->state();
    st.world_size = world;
    st.rank_dropout_rngs.clear();
    st.rank_sampler_states.clear();
    for (int r = 1; r < world; r++) {
      const size_t nl = streams[r].find('\n');
      st.rank_dropout_rngs.push_back(std::stoull(streams[r].substr(0, nl)));
      st.rank_sampler_states.push_back(streams[r].substr(nl + 1));
    }
    save_training_checkpoint(ck_path, model, *optim, cfg, st, corpus.tok);
  };
  auto evaluate = [&](nlohmann::json& rec) {
    const double vl = evaluate_windows(model, corpus.val, val_windows, T, B, multi);
    const double tl = evaluate_windows(model, corpus.train, train_windows, T, B, multi);
    rec["val_loss"] = vl;
    rec["train_loss_eval"] = tl;
    res.val_loss = vl;
    if (!quiet)
      std::printf("%sstep %ld: train loss %.4f, val loss %.4f\n", opt.label.c_str(), static_cast<long>(st.step), tl, vl);
  };

  if (!opt.resume && cfg.max_iters > 0) {
    nlohmann::json rec{{"step", 0}};
    evaluate(rec);
    if (lead) metrics->write(rec);
  }
  auto t_log = Clock::now();
  int64_t steps_since_log = 0;
  const int64_t first_step = st.step;
  Index x, y;
  while (st.step < cfg.max_iters) {
    const double lr = lr_at(st.step, sched);
    double loss_sum = 0;
    for (int64_t m = 0; m < cfg.grad_accum; m++) {
      sampler->next(x, y);
      Var loss = model.loss(x, y);
      loss_sum += loss.item();
      backward(cfg.grad_accum > 1 ? mul(loss, inv_accum) : loss);
    }
    double step_loss = loss_sum / static_cast<double>(cfg.grad_accum);
    bool stopping = false;
    if (multi) {  // every rank leaves with the same gradients, loss and decision to stop
      const auto t_comm = Clock::now();
      std::tie(step_loss, stopping) = reducer->reduce(step_loss, stop_requested());
      res.comm_seconds += seconds_since(t_comm);
    }
    if (!std::isfinite(step_loss)) {
      Tape::get().clear();
      const std::string msg = "step " + std::to_string(st.step) + ": loss is " + (std::isnan(step_loss) ? "NaN" : "Inf") +
                              "; stopping (the last good checkpoint, if any, is " + ck_path + ")";
      if (multi) throw dist::AgreedError(msg, lead);
      throw TrainError(msg);
    }
    if (cfg.grad_clip > 0) clip_grad_norm(params, cfg.grad_clip);
    optim->step(lr);
    optim->zero_grad(false);
    st.step++;
    st.tokens_seen += static_cast<int64_t>(tokens_per_step);
    res.last_train_loss = step_loss;
    steps_since_log++;
    if (multi && opt.check_sync) check_ranks_in_sync(params, st.step);

    const bool last = st.step == cfg.max_iters;
    if (!multi) stopping = stop_requested();
    if (st.step % cfg.log_interval == 0 || last || stopping || st.step % cfg.eval_interval == 0) {
      const double dt = seconds_since(t_log);
      const double tps = steps_since_log * tokens_per_step / std::max(dt, 1e-9);
      rates.push_back(tps);
      t_log = Clock::now();
      steps_since_log = 0;
      nlohmann::json rec{{"step", st.step}, {"train_loss", step_loss}, {"lr", lr}, {"tokens_per_s", tps}};
      if (st.step % cfg.eval_interval == 0 || last) evaluate(rec);
      if (last && opt.final_eval) {  // the figure to quote: every val position once, as `tapelm eval`
        res.val_loss_full = evaluate_split(model, corpus.val, multi);
        rec["val_loss_full"] = res.val_loss_full;
      }
      if (lead) metrics->write(rec);
      if (!quiet) {
        const double done = static_cast<double>(st.step - first_step);
        const double eta = done > 0 ? seconds_since(t_start) / done * (cfg.max_iters - st.step) : 0;
        std::string comm;
        if (multi) {
          char b[48];
          std::snprintf(b, sizeof b, " | all-reduce %.0f%%", 100.0 * res.comm_seconds / seconds_since(t_start));
          comm = b;
        }
        std::printf("%sstep %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | MFU %.1f%%%s | ETA %s\n", opt.label.c_str(),
                    static_cast<long>(st.step), static_cast<long>(cfg.max_iters), step_loss, lr, tps,
                    100.0 * tps * cost.train_flops_per_token / peak, comm.c_str(), fmt_duration(eta).c_str());
        if (res.val_loss_full >= 0 && last)
          std::printf("%sstep %ld: val loss on the whole val split %.4f\n", opt.label.c_str(), static_cast<long>(st.step),
                      res.val_loss_full);
        std::fflush(stdout);
      }
    }
    if (st.step % cfg.checkpoint_interval == 0 || last || stopping) save();
    if (stopping && !last) {
      res.interrupted = true;
      if (!quiet)
        std::printf("%sstopped by signal at step %ld; checkpoint written to %s\n", opt.label.c_str(),
                    static_cast<long>(st.step), ck_path.c_str());
      break;
    }
  }
  bool have_checkpoint = fs::exists(ck_path);
  if (multi) {  // only rank 0 need see the file
    double h = have_checkpoint && lead ? 1 : 0;
    dist::allreduce_sum(&h, 1);
    have_checkpoint = h > 0;
  }
  if (st.step >= cfg.max_iters && !have_checkpoint) save();  // max_iters = 0: weights as they start
  res.steps = st.step;
  res.seconds = seconds_since(t_start);
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    res.tokens_per_s = rates[rates.size() / 2];
  }
  return res;
}

}  // namespace tapelm
