// Data-parallel training under mpirun: the collectives, equivalence with one process of twice the
// batch, bit-exact resume, resuming with another number of ranks, and failures (a bad config on
// one rank, a killed rank, a signal).
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <optional>
#include <chrono>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <regex>
#include <cstring>
#include <fstream>
#include <thread>

#include "autograd/cpu.h"
#include "autograd/runtime.h"
#include "data/sampler.h"
#include "train/dist.h"
#include "train/trainer.h"
#include "test_util.h"
#include "train/train_config.h"

using namespace tapelm;
using namespace tapelm::test;
namespace fs = std::filesystem;

namespace tt = boost::test_tools;

namespace {

// mpirun, allowed as root and on fewer cores than ranks, with shared-memory copies that need no
// ptrace permission (containers often deny it). In the sanitizer build, OpenMPI's own
// allocations that outlive MPI_Finalize are suppressed (tests/lsan_mpi.supp); to name them, its
// plugins stay loaded and stacks are unwound in full. Our code's leaks are still reported.
// A job that hangs (a collective one rank never reaches) is killed after 300 s and fails.
std::string launcher(bool with_timeout = true) {
  return std::string(with_timeout ? "timeout -k 10 300 " : "") +
         "env OMPI_MCA_mca_base_component_disable_dlclose=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
         "ASAN_OPTIONS=\"${ASAN_OPTIONS}:fast_unwind_on_malloc=0\" "
         "LSAN_OPTIONS=suppressions=" +
         TAPELM_SOURCE_DIR + "/tests/lsan_mpi.supp:print_suppressions=0 " + TAPELM_MPIEXEC +
         " --allow-run-as-root --oversubscribe --bind-to none ";
}
// Two ranks of one thread each on however many cores CI has.
std::string mpirun(int np, bool with_timeout = true) {
  return launcher(with_timeout) + "-np " + std::to_string(np) + " ";
}
std::string binary() { return TAPELM_BINARY; }
std::string tiny_text() { return fixture_path("tiny.txt"); }

nlohmann::json small_config(int64_t iters, double dropout) {
  return {{"n_layer", 2},      {"n_head", 4},          {"n_kv_head", 2},       {"n_embd", 32},
          {"block_size", 16},  {"batch_size", 4},      {"max_iters", iters},   {"dropout", dropout},
          {"learning_rate", 3e-3}, {"min_lr", 3e-4},   {"warmup_iters", 6},    {"lr_decay_iters", 10},
          {"grad_clip", 0.5},  {"eval_interval", 5},   {"eval_iters", 3},      {"log_interval", 1},
          {"checkpoint_interval", 100}, {"seed", 7},   {"threads", 1}};
}

std::string write_config(const TempDir& d, const std::string& name, const nlohmann::json& j) {
  std::ofstream(d / name) << j.dump();
  return d / name;
}

std::string train_args(const std::string& config, const std::string& out) {
  return "train --config " + config + " --data " + tiny_text() + " --out " + out + " --quiet";
}

// Lines on stderr that tapelm itself wrote (mpirun may add its own banner).
int tapelm_error_lines(const std::string& err) {
  int n = 0;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) n += line.rfind("tapelm: error", 0) == 0;
  return n;
}

// A run that goes on until stopped, with a checkpoint every 10 steps.
std::string endless_config(const TempDir& d) {
  nlohmann::json j = small_config(100000000, 0.0);
  j["checkpoint_interval"] = 10;
  j["log_interval"] = 1000;
  j["eval_interval"] = 1000000;
  return write_config(d, "endless.json", j);
}

// Rank 0 and rank 1 started with different arguments (an MPMD launch).
Run mpmd(const std::string& rank0_args, const std::string& rank1_args) {
  return run_shell(launcher() + "-np 1 " + binary() + " " + rank0_args + " : -np 1 " + binary() + " " + rank1_args);
}

// The job failed with exit 1 and exactly one line from tapelm, containing `part`.
void expect_job_error(const Run& r, const std::string& part) {
  BOOST_TEST(r.code == 1, r.err);
  BOOST_TEST(tapelm_error_lines(r.err) == 1, r.err);
  BOOST_TEST(r.err.find(part) != std::string::npos, "stderr lacks '" << part << "': " << r.err);
}

std::vector<double> train_losses(const std::string& run_dir) {
  std::vector<double> out;
  for (const auto& rec : read_metrics(run_dir + "/metrics.jsonl"))
    if (rec.contains("train_loss")) out.push_back(rec["train_loss"].get<double>());
  return out;
}

GPT load_weights(const std::string& path) {
  H5File f = H5File::open_read(path);
  GPT m(read_model_config(f));
  read_model_weights(f, m);
  return m;
}

// A job started in the background: its process group, so a failing test can end all of it.
struct Job {
  pid_t pid = -1;
  explicit Job(const std::string& cmd, const std::string& log) {
    pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      const std::string line = "exec " + cmd + " >" + log + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  // The exit code, or -1 if it has not ended within `seconds`.
  int wait(double seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
  ~Job() {
    if (pid > 0) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

bool wait_for_file(const std::string& path, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (fs::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The pid of the tapelm process of MPI rank `rank` whose command line mentions `marker`.
pid_t find_rank(const std::string& marker, int rank) {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmd = slurp(e.path() / "cmdline"), env = slurp(e.path() / "environ");
    if (cmd.find(marker) == std::string::npos || cmd.find("mpiexec") != std::string::npos) continue;
    std::istringstream vars(env);
    for (std::string v; std::getline(vars, v, '\0');)
      if (v == want) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// Waits for a job that was sent a stop signal: it must end within 60 s with exit 0, saying it
// stopped; returns the step its checkpoint (d/run/checkpoint.h5) holds, which must be past 0.
int64_t stopped_at(Job& job, const TempDir& d) {
  const int code = job.wait(60);
  BOOST_TEST(code == 0, slurp(d / "log"));
  BOOST_TEST(slurp(d / "log").find("stopped by signal at step") != std::string::npos, slurp(d / "log"));
  H5File f = H5File::open_read(d / "run/checkpoint.h5");
  const int64_t step = f.read_attr_int("/train", "step");
  BOOST_TEST(step > 0);
  return step;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(mpi)

BOOST_AUTO_TEST_CASE(collectives_pass_their_checks) {
  Run r = run_shell(mpirun(2) + TAPELM_MPI_WORKER);
  BOOST_TEST(r.code == 0, r.out << r.err);
  BOOST_TEST(r.out.find("ok rank 0 (0 failures)") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("ok rank 1 (0 failures)") != std::string::npos, r.out);
}

// The BLAS core guard runs in every rank before MPI_Init: re-executing keeps the pid mpirun
// knows, each rank comes back on the best core, and the explanation is printed once.
BOOST_AUTO_TEST_CASE(the_blas_core_guard_works_under_mpirun) {
  TempDir d;
  const std::string cfg_path = write_config(d, "cfg.json", small_config(2, 0.0));
  const std::string best = best_blas_core(cpu_info());
  Run r = run_shell("env OPENBLAS_CORETYPE=Prescott TAPELM_BLAS_CORE=auto " + mpirun(2) + binary() + " train --config " +
                    cfg_path + " --data " + tiny_text() + " --out " + (d / "run"));
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  if (best.empty()) return;  // nothing better than Prescott on this CPU
  BOOST_TEST(r.out.find("OpenBLAS core " + best + " (OPENBLAS_CORETYPE, set by tapelm: OpenBLAS chose Prescott)") !=
                 std::string::npos,
             r.out);
  int said = 0;
  std::istringstream in(r.err);
  for (std::string line; std::getline(in, line);) said += line.find("had chosen its Prescott kernels") != std::string::npos;
  BOOST_TEST(said == 1, r.err);
}

// A two-rank run's steps in this process, from `model`'s weights: the rows 0..B-1 of each batch from
// rank 0's stream, B..2B-1 from rank 1's, one process with twice the batch. Trains `model` in place
// and returns the losses.
std::vector<double> two_ranks_in_one_process(GPT& model, const TrainConfig& cfg, const Corpus& c, int64_t steps) {
  std::optional<ThreadCount> one_thread(1);
  model.train();
  NamedParams params = model.named_parameters();
  auto optim = cfg.make_optimizer(params);
  const int64_t B = cfg.batch_size, T = cfg.model.block_size;
  BatchSampler s0(c.train, B, T, dist::rank_seed(cfg.seed, 0)), s1(c.train, B, T, dist::rank_seed(cfg.seed, 1));
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; step++) {
    Index x0, y0, x1, y1;
    s0.next(x0, y0);
    s1.next(x1, y1);
    Index x(x0.data, {2 * B, T}), y(y0.data, {2 * B, T});
    x.data.insert(x.data.end(), x1.data.begin(), x1.data.end());
    y.data.insert(y.data.end(), y1.data.begin(), y1.data.end());
    Var loss = model.loss(x, y);
    losses.push_back(loss.item());
    backward(loss);
    clip_grad_norm(params, cfg.grad_clip);
    optim->step(lr_at(step, cfg.schedule()));
    optim->zero_grad(false);
  }
  return losses;
}

// The largest relative difference of two loss curves and the largest weight difference of two models.
// Tolerance: the runs differ only in float32 summation order (one GEMM over 2B rows against two
// over B rows summed by the all-reduce), which Adam's normalised steps carry forward. Seen: 7e-8
// relative on the loss and 1.2e-7 on the weights after 10 steps; allowed: 1e-6 and 1e-5.
void expect_same_run(const std::vector<double>& got, const std::vector<double>& want, GPT& got_model, GPT& want_model) {
  BOOST_REQUIRE(got.size() == want.size());
  double worst_loss = 0;
  for (size_t i = 0; i < got.size(); i++) worst_loss = std::max(worst_loss, std::abs(got[i] - want[i]) / std::abs(want[i]));
  BOOST_TEST(worst_loss <= 1e-6, "largest relative loss difference " << worst_loss);
  double worst_w = 0;
  auto a = got_model.named_parameters(), b = want_model.named_parameters();
  BOOST_REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); i++) {
    BOOST_REQUIRE(a[i].second.numel() == b[i].second.numel());
    const float *p = a[i].second.val().data(), *q = b[i].second.val().data();
    for (int64_t k = 0; k < a[i].second.numel(); k++) worst_w = std::max(worst_w, double(std::abs(p[k] - q[k])));
  }
  BOOST_TEST(worst_w <= 1e-5, "largest weight difference " << worst_w);
  BOOST_TEST_MESSAGE("two ranks vs one process: loss rel diff " << worst_loss << ", weight abs diff " << worst_w);
}

// Two ranks with batch B against one process with batch 2B made of the same two streams.
BOOST_AUTO_TEST_CASE(two_ranks_match_one_process_with_twice_the_batch) {
  TempDir d;
  const int64_t steps = 10;
  const nlohmann::json j = small_config(steps, 0.0);
  const std::string cfg_path = write_config(d, "cfg.json", j);
  Run r = run_shell(mpirun(2) + binary() + " " + train_args(cfg_path, d / "run") + " --check-sync");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  const std::vector<double> mpi_losses = train_losses(d / "run");
  BOOST_REQUIRE(mpi_losses.size() == static_cast<size_t>(steps));

  Corpus c = load_corpus(tiny_text());
  nlohmann::json jj = j;
  jj["vocab_size"] = c.tok.vocab_size();
  TrainConfig cfg = TrainConfig::from_json(jj);
  GPT model(cfg.model, cfg.seed);
  const std::vector<double> ref_losses = two_ranks_in_one_process(model, cfg, c, steps);
  GPT trained = load_weights(d / "run/checkpoint.h5");
  expect_same_run(mpi_losses, ref_losses, trained, model);
  // The closing whole-split evaluation, dealt out across the ranks, is one process's figure for
  // the same weights (each batch is evaluated alike; only the double sums are regrouped).
  const double full = read_metrics(d / "run/metrics.jsonl").back()["val_loss_full"].get<double>();
  BOOST_TEST(full == evaluate_split(trained, c.val), tt::tolerance(1e-9));
}

// Gradient accumulation composes with the all-reduce: 2 ranks x 2 micro-batches of 2 windows
// draw the same windows as 2 ranks x 1 batch of 4, so the runs agree to float32 rounding.
BOOST_AUTO_TEST_CASE(gradient_accumulation_on_two_ranks_matches_a_larger_batch) {
  TempDir d;
  nlohmann::json j = small_config(6, 0.0);
  const std::string big = write_config(d, "big.json", j);
  j["batch_size"] = 2;
  j["grad_accum"] = 2;
  const std::string accum = write_config(d, "accum.json", j);
  BOOST_REQUIRE(run_shell(mpirun(2) + binary() + " " + train_args(big, d / "big")).code == 0);
  BOOST_REQUIRE(run_shell(mpirun(2) + binary() + " " + train_args(accum, d / "accum") + " --check-sync").code == 0);
  const auto a = train_losses(d / "big"), b = train_losses(d / "accum");
  BOOST_REQUIRE(a.size() == 6u);
  BOOST_REQUIRE(b.size() == 6u);
  for (size_t i = 0; i < a.size(); i++) BOOST_TEST(std::abs(a[i] - b[i]) <= 1e-6 * std::abs(a[i]), "step " << i + 1);
}

// 4 steps + --resume + 4 steps on two ranks equals 8 steps at once, bit for bit, dropout included.
BOOST_AUTO_TEST_CASE(resume_on_two_ranks_is_bit_exact) {
  TempDir d;
  const std::string cfg8 = write_config(d, "c8.json", small_config(8, 0.1));
  const std::string cfg4 = write_config(d, "c4.json", small_config(4, 0.1));
  BOOST_REQUIRE(run_shell(mpirun(2) + binary() + " " + train_args(cfg8, d / "straight") + " --check-sync").code == 0);
  BOOST_REQUIRE(run_shell(mpirun(2) + binary() + " " + train_args(cfg4, d / "split") + " --check-sync").code == 0);
  {
    H5File f = H5File::open_read(d / "split/checkpoint.h5");
    BOOST_TEST(f.read_attr_int("/train", "world_size") == 2);
    BOOST_TEST(f.exists("/train/rank_1/sampler_state"));
  }
  fs::copy(d / "split", d / "split_copy");
  Run r = run_shell(mpirun(2) + binary() + " " + train_args(cfg8, d / "split") + " --resume --check-sync");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto a = train_losses(d / "straight"), b = train_losses(d / "split");
  BOOST_REQUIRE(a.size() == 8u);
  BOOST_REQUIRE(b.size() == 8u);
  for (size_t i = 0; i < 8; i++) BOOST_TEST(a[i] == b[i], "step " << i + 1 << ": " << a[i] << " vs " << b[i]);
  GPT wa = load_weights(d / "straight/checkpoint.h5"), wb = load_weights(d / "split/checkpoint.h5");
  auto pa = wa.named_parameters(), pb = wb.named_parameters();
  for (size_t i = 0; i < pa.size(); i++)
    BOOST_TEST(std::memcmp(pa[i].second.val().data(), pb[i].second.val().data(), pa[i].second.numel() * 4) == 0,
               pa[i].first << " differs");

  // The same checkpoint resumed by one process: rank 0 continues its stream; no rank groups stay.
  Run one = run_cli(train_args(cfg8, d / "split_copy") + " --resume --set max_iters=6");
  BOOST_REQUIRE_MESSAGE(one.code == 0, one.err);
  H5File f = H5File::open_read(d / "split_copy/checkpoint.h5");
  BOOST_TEST(f.read_attr_int("/train", "step") == 6);
  BOOST_TEST(!f.has_attr("/train", "world_size"));
  BOOST_TEST(!f.exists("/train/rank_1"));
}

// Every tensor of two checkpoints' /model and /optim, bit for bit.
void expect_same_state(const std::string& a_path, const std::string& b_path) {
  H5File a = H5File::open_read(a_path), b = H5File::open_read(b_path);
  for (const char* group : {"/model", "/optim/exp_avg", "/optim/exp_avg_sq"}) {
    const auto names = a.list_datasets_recursive(group);
    BOOST_TEST(names == b.list_datasets_recursive(group), tt::per_element());
    BOOST_TEST(!names.empty(), group);
    for (const std::string& n : names)
      BOOST_TEST((a.read_tensor(std::string(group) + "/" + n).to_vector() == b.read_tensor(std::string(group) + "/" + n).to_vector()),
                 group << "/" << n);
  }
}

// Both sharding stages train the unsharded run bit for bit on two ranks (8 steps, dropout 0.1, clip
// 0.5): every loss, weight and (gathered to rank 0 for the one checkpoint file) every moment;
// interrupted after 4 steps and resumed on two ranks it is the straight run; its checkpoint resumes
// on three ranks (other shares) and in one process. Returns the config of 4 steps sharded so.
std::string expect_sharded_run_is_the_unsharded_one(const TempDir& d, const std::string& shard) {
  nlohmann::json j8 = small_config(8, 0.1), j4 = small_config(4, 0.1);
  const std::string plain = write_config(d, "plain.json", j8);
  j8["shard"] = j4["shard"] = shard;
  const std::string cfg8 = write_config(d, "c8.json", j8), cfg4 = write_config(d, "c4.json", j4);
  BOOST_REQUIRE(run_shell(mpirun(2) + binary() + " " + train_args(plain, d / "plain") + " --check-sync").code == 0);
  Run r = run_shell(mpirun(2) + binary() + " " + train_args(cfg8, d / "sharded") + " --check-sync");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST((train_losses(d / "plain") == train_losses(d / "sharded")), tt::per_element());
  expect_same_state(d / "plain/checkpoint.h5", d / "sharded/checkpoint.h5");

  BOOST_REQUIRE(run_shell(mpirun(2) + binary() + " " + train_args(cfg4, d / "split") + " --check-sync").code == 0);
  fs::copy(d / "split", d / "split3");
  fs::copy(d / "split", d / "split1");
  r = run_shell(mpirun(2) + binary() + " " + train_args(cfg8, d / "split") + " --resume --check-sync");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST((train_losses(d / "split") == train_losses(d / "sharded")), tt::per_element());
  expect_same_state(d / "sharded/checkpoint.h5", d / "split/checkpoint.h5");
  r = run_shell(mpirun(3) + binary() + " " + train_args(cfg8, d / "split3") + " --resume --check-sync");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST(H5File::open_read(d / "split3/checkpoint.h5").read_attr_int("/train", "step") == 8);
  r = run_cli(train_args(cfg8, d / "split1") + " --resume");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST(H5File::open_read(d / "split1/checkpoint.h5").read_attr_int("/train", "step") == 8);
  return cfg4;
}

// shard: optimizer (ZeRO stage 1): each rank keeps and updates the AdamW state of its share of the
// parameters and sends the new values to the others. The update of a parameter is the same
// arithmetic on the same all-reduced gradient whichever rank does it, so the run is the unsharded
// one bit for bit: every loss, every weight, and (gathered to rank 0 for the one checkpoint file)
// every moment. Interrupted and resumed on two ranks it is the straight run; its checkpoint
// resumes on three ranks (other shares) and in one process.
BOOST_AUTO_TEST_CASE(sharded_optimizer_state_trains_the_unsharded_run_bit_for_bit) {
  TempDir d;
  const std::string cfg4 = expect_sharded_run_is_the_unsharded_one(d, "optimizer");
  Run r;
  // the memory line: the state of a rank's share
  r = run_shell(mpirun(2) + binary() + " train --config " + cfg4 + " --data " + tiny_text() + " --out " + (d / "said"));
  BOOST_TEST(r.out.find("memory estimate a rank ") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("(shard optimizer: the state of this rank's share of the parameters; ") != std::string::npos, r.out);

  // bf16 moments: the random bits of a moment's rounding come from its parameter's name and the
  // step, not from the rank that updates it, so sharded they are still the unsharded run's
  nlohmann::json jb = small_config(8, 0.1);
  jb["moments"] = "bf16";
  const std::string plain16 = write_config(d, "plain16.json", jb);
  jb["shard"] = "optimizer";
  const std::string sharded16 = write_config(d, "sharded16.json", jb);
  BOOST_REQUIRE(run_shell(mpirun(2) + binary() + " " + train_args(plain16, d / "plain16") + " --check-sync").code == 0);
  r = run_shell(mpirun(2) + binary() + " " + train_args(sharded16, d / "sharded16") + " --check-sync");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST((train_losses(d / "plain16") == train_losses(d / "sharded16")), tt::per_element());
  BOOST_TEST((train_losses(d / "plain16") != train_losses(d / "plain")));
  expect_same_state(d / "plain16/checkpoint.h5", d / "sharded16/checkpoint.h5");
  const H5File f16 = H5File::open_read(d / "sharded16/checkpoint.h5");  // sent to rank 0 in bf16, written so
  const std::vector<std::string> names16 = f16.list_datasets_recursive("/optim/exp_avg_sq");
  BOOST_TEST(names16.size() > 5u);
  for (const std::string& n : names16) BOOST_TEST(f16.tensor_encoding("/optim/exp_avg_sq/" + n) == "BF16", n);
}

// shard: gradients (ZeRO stage 2): besides the optimizer state, each gradient is summed into the
// rank that keeps it as soon as backward is done with it (MPI_Reduce, where the unsharded run
// all-reduces one flat buffer) and dropped by the other ranks. On two ranks a sum of two floats is
// the same whichever collective makes it, the keeper scales it as the all-reduce's buffer is scaled,
// and the clipping norm adds the same per-parameter squares in the same order: the unsharded run
// bit for bit, every loss, weight and moment, straight and interrupted. Its checkpoint resumes on
// three ranks and in one process. With grad_accum 2 and recomputed blocks each micro-batch's
// gradients are reduced as they come ((a₁ + b₁) + (a₂ + b₂) where the unsharded run sums
// (a₁ + a₂) + (b₁ + b₂)): equal to float32 rounding, which Adam's normalised steps carry forward
// (as in gradient_accumulation_on_two_ranks_matches_a_larger_batch: 1e-6 relative).
BOOST_AUTO_TEST_CASE(sharded_gradients_train_the_unsharded_run_bit_for_bit) {
  TempDir d;
  expect_sharded_run_is_the_unsharded_one(d, "gradients");
  Run r;

  nlohmann::json ja = small_config(6, 0.0);
  ja["batch_size"] = 2;
  ja["grad_accum"] = 2;
  ja["recompute"] = "blocks";
  const std::string accum = write_config(d, "accum.json", ja);
  ja["shard"] = "gradients";
  const std::string accum_sharded = write_config(d, "accum_sharded.json", ja);
  BOOST_REQUIRE(run_shell(mpirun(2) + binary() + " " + train_args(accum, d / "accum")).code == 0);
  r = run_shell(mpirun(2) + binary() + " train --config " + accum_sharded + " --data " + tiny_text() + " --out " +
                (d / "accum_sharded") + " --check-sync");  // not --quiet: the memory line is read below
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto a = train_losses(d / "accum"), b = train_losses(d / "accum_sharded");
  BOOST_REQUIRE(a.size() == 6u);
  BOOST_REQUIRE(b.size() == 6u);
  for (size_t i = 0; i < a.size(); i++) BOOST_TEST(std::abs(a[i] - b[i]) <= 1e-6 * std::abs(a[i]), "step " << i + 1);
  // the memory line: a rank's share of the state and gradients, and no all-reduce buffer
  BOOST_TEST(r.out.find("(shard gradients: the state and gradients of this rank's share of the parameters; ") != std::string::npos, r.out);
  BOOST_TEST(r.out.find("all-reduce buffers") == std::string::npos, r.out);
}

// shard: parameters (ZeRO stage 3): besides stage 2's, each block's weights are kept between uses
// by one rank each (MPI_Ibcast to the others just before the block's forward and again before its
// backward, freed after each). The values gathered are the keeper's bits, so the run is stage 2's,
// which on two ranks is the unsharded one bit for bit: every loss, weight (sent to rank 0 for the
// checkpoint, one tensor at a time) and moment, straight, interrupted and resumed, and on three
// ranks and one process. With blocks recomputed in backward (the block's weights gathered before
// its recomputation) it is the same run again. Rank 0 holds a share of the blocks' weights, by its
// own count. The final evaluation's batches of the whole val split, dealt out unevenly over 3
// ranks, keep every rank gathering in step.
BOOST_AUTO_TEST_CASE(sharded_parameters_train_the_unsharded_run_bit_for_bit) {
  TempDir d;
  expect_sharded_run_is_the_unsharded_one(d, "parameters");
  nlohmann::json jr = small_config(8, 0.1);
  jr["shard"] = "parameters";
  jr["recompute"] = "blocks";
  const std::string recomputed = write_config(d, "recomputed.json", jr);
  Run r = run_shell(mpirun(2) + binary() + " train --config " + recomputed + " --data " + tiny_text() + " --out " + (d / "recomputed") +
                    " --check-sync");  // not --quiet: the memory line is read below
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST((train_losses(d / "plain") == train_losses(d / "recomputed")), tt::per_element());
  expect_same_state(d / "plain/checkpoint.h5", d / "recomputed/checkpoint.h5");
  BOOST_TEST(r.out.find("(shard parameters: the blocks' weights, the state and gradients of this rank's share of the parameters; ") !=
                 std::string::npos,
             r.out);
  // what rank 0 holds of the blocks' weights once training starts, counted from its values: a
  // share (here 2 layers' matrices and norms dealt over 2 ranks with the embedding), not all
  const std::regex held_line("rank 0 holds ([0-9.]+) KB of the blocks' ([0-9.]+) KB of weights");
  std::smatch m;
  BOOST_REQUIRE_MESSAGE(std::regex_search(r.out, m, held_line), r.out);
  const double held = std::stod(m[1]), all = std::stod(m[2]);
  BOOST_TEST(held > 0.2 * all);
  BOOST_TEST(held < 0.8 * all);
  r = run_shell(mpirun(3) + binary() + " " + train_args(recomputed, d / "three") + " --check-sync");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST(train_losses(d / "three").size() == 8u);
}

// `uptrain` under mpirun: rank 0 converts an MHA checkpoint (mean pooling, 4 -> 2 KV heads) and
// every rank uptrains from its weights. The run is one process's with twice the batch from the
// converted weights, which a one-process `uptrain --fraction 0` writes (the uptraining config, with
// its rewarmed schedule, is read from the job's checkpoint); the loss before uptraining, dealt out
// over the ranks, is the one process's figure. Sharded (ZeRO stage 2, training the attention only,
// dropout 0.1) it is the unsharded uptraining bit for bit.
BOOST_AUTO_TEST_CASE(uptrain_on_two_ranks_matches_one_process_with_twice_the_batch) {
  TempDir d;
  nlohmann::json j = small_config(20, 0.0);
  j["n_kv_head"] = 4;  // MHA
  const std::string src_cfg = write_config(d, "src.json", j);
  BOOST_REQUIRE(run_cli(train_args(src_cfg, d / "src")).code == 0);
  const std::string src = d / "src/checkpoint.h5";
  // the text 20 times, the same characters: a val split of 65 windows, three evaluation batches of
  // 32, so that rank 1 evaluates one of them (tiny.txt's val split fits in rank 0's one batch)
  std::string twenty;
  for (int i = 0; i < 20; i++) twenty += slurp(tiny_text());
  write_bytes(d / "long.txt", twenty);
  const std::string text = d / "long.txt";
  auto uptrain_args = [&](const std::string& out, const std::string& more, int kv = 2) {
    return "uptrain --from " + src + " --kv-heads " + std::to_string(kv) + " --method mean --data " + text + " --out " + out + " " + more;
  };
  Run r = run_shell(mpirun(2) + binary() + " " + uptrain_args(d / "up2", "--fraction 0.5"));
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST(r.out.find("data parallel over 2 ranks: rank 0 converts") != std::string::npos, r.out);
  Run zero = run_cli(uptrain_args(d / "converted", "--fraction 0"));
  BOOST_REQUIRE_MESSAGE(zero.code == 0, zero.err);
  // "(converted, before uptraining: X)": four decimals of one figure, printed once by each job
  auto before = [](const std::string& out) {
    const size_t at = out.find("before uptraining: ");
    return at == std::string::npos ? std::string("none") : out.substr(at + 19, 6);
  };
  BOOST_TEST(before(r.out) == before(zero.out), r.out << zero.out);

  const std::vector<double> mpi_losses = train_losses(d / "up2");
  BOOST_REQUIRE(mpi_losses.size() == 10u);
  Corpus c = load_corpus(text);
  BOOST_TEST(c.val.size() / 16 > 64u);
  const TrainConfig cfg = read_train_config(H5File::open_read(d / "up2/checkpoint.h5"));
  BOOST_TEST(cfg.max_iters == 10);
  GPT model = load_weights(d / "converted/checkpoint.h5");
  BOOST_TEST(model.config().n_kv_head == 2);
  const std::vector<double> ref_losses = two_ranks_in_one_process(model, cfg, c, 10);
  GPT trained = load_weights(d / "up2/checkpoint.h5");
  expect_same_run(mpi_losses, ref_losses, trained, model);
  // the loss after uptraining, dealt out over the ranks: one process's figure for the saved weights
  const size_t at = r.out.find(": val loss ");
  BOOST_REQUIRE(at != std::string::npos);
  BOOST_TEST(std::stod(r.out.substr(at + 11)) == evaluate_split(trained, c.val), tt::tolerance(1e-4));  // printed to 4 decimals

  // α = 0 under mpirun: the converted weights, written by rank 0 alone
  r = run_shell(mpirun(2) + binary() + " " + uptrain_args(d / "zero2", "--fraction 0 --quiet"));
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  GPT zero2 = load_weights(d / "zero2/checkpoint.h5"), zero1 = load_weights(d / "converted/checkpoint.h5");
  for (size_t i = 0; i < zero1.named_parameters().size(); i++)
    BOOST_TEST((zero2.named_parameters()[i].second.val().to_vector() == zero1.named_parameters()[i].second.val().to_vector()));
  // a conversion every rank refuses alike: one line, exit 1, no run directory
  expect_job_error(run_shell(mpirun(2) + binary() + " " + uptrain_args(d / "bad", "", 3)), "n_kv_head");
  BOOST_TEST(!fs::exists(d / "bad/checkpoint.h5"));
  // ranks given other uptraining arguments (here rank 1 would skip the training that rank 0 runs):
  // refused before any rank waits in a collective the other skips
  expect_job_error(mpmd(uptrain_args(d / "mixed", "--fraction 0.5"), uptrain_args(d / "mixed", "--fraction 0")),
                   "rank 1 of 2: its uptraining differs from rank 0's");
  BOOST_TEST(!fs::exists(d / "mixed/checkpoint.h5"));
  // a rank reads the source's weights (and compares their digest with rank 0's) only when the
  // source teaches there: two sources of one config and other weights (trained on other text)
  // are refused when distilling, and rank 1's is never read when not
  BOOST_REQUIRE(run_cli("train --config " + src_cfg + " --data " + text + " --out " + (d / "src2") + " --quiet").code == 0);
  auto from = [&](const std::string& source, const std::string& out, const std::string& more) {
    return "uptrain --from " + source + " --kv-heads 2 --method mean --data " + text + " --out " + out + " --quiet " + more;
  };
  const std::string src2 = d / "src2/checkpoint.h5";
  expect_job_error(mpmd(from(src, d / "taught", "--fraction 0.5 --distill"), from(src2, d / "taught", "--fraction 0.5 --distill")),
                   "rank 1 of 2: its uptraining differs from rank 0's");
  Run rank1_other = mpmd(from(src, d / "other", "--fraction 0.5"), from(src2, d / "other", "--fraction 0.5"));
  BOOST_REQUIRE_MESSAGE(rank1_other.code == 0, rank1_other.err);
  BOOST_TEST((train_losses(d / "other") == mpi_losses), tt::per_element());

  // ZeRO stage 2 with frozen weights and dropout: the unsharded uptraining, every loss, weight and moment
  const std::string partial = "--fraction 0.4 --train attention --set dropout=0.1 --set grad_clip=0.5";
  r = run_shell(mpirun(2) + binary() + " " + uptrain_args(d / "plain", partial + " --quiet"));
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  r = run_shell(mpirun(2) + binary() + " " + uptrain_args(d / "sharded", partial + " --quiet --set shard=gradients"));
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST(train_losses(d / "plain").size() == 8u);
  BOOST_TEST((train_losses(d / "plain") == train_losses(d / "sharded")), tt::per_element());
  expect_same_state(d / "plain/checkpoint.h5", d / "sharded/checkpoint.h5");
  // ZeRO stage 3: the frozen block weights are dealt out over the ranks with the trained ones;
  // rank 1 takes only its share of the converted model, and rank 0 alone evaluates it, the one
  // process's figure
  r = run_shell(mpirun(2) + binary() + " " + uptrain_args(d / "stage3", partial + " --set shard=parameters"));
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST(before(r.out) == before(zero.out), r.out << zero.out);
  BOOST_TEST((train_losses(d / "plain") == train_losses(d / "stage3")), tt::per_element());
  expect_same_state(d / "plain/checkpoint.h5", d / "stage3/checkpoint.h5");
  // the frozen block weights held in bf16 on every rank (rounded: this source is float32), unsharded
  // and under stage 2 (whose save widens them): the same run, another than float32's; under stage 3
  // a 16-bit type is refused in one line
  const std::string held = partial + " --set frozen_weights=bf16";
  r = run_shell(mpirun(2) + binary() + " " + uptrain_args(d / "bf16", held));
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST(r.out.find("frozen weights in bf16: ") != std::string::npos, r.out);
  r = run_shell(mpirun(2) + binary() + " " + uptrain_args(d / "bf16_sharded", held + " --quiet --set shard=gradients"));
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST((train_losses(d / "bf16") == train_losses(d / "bf16_sharded")), tt::per_element());
  BOOST_TEST(train_losses(d / "bf16") != train_losses(d / "plain"));
  expect_same_state(d / "bf16/checkpoint.h5", d / "bf16_sharded/checkpoint.h5");
  expect_job_error(run_shell(mpirun(2) + binary() + " " + uptrain_args(d / "bf16_stage3", held + " --quiet --set shard=parameters")),
                   "frozen_weights \"bf16\" is not combined with shard \"parameters\"");
  // a frozen weight beyond f16's 65504, asked for in f16: every rank holds it, one line says so
  {
    LoadedModel big = load_model(src);
    for (auto& [name, p] : big.model->named_parameters())
      if (name == "blocks.1.mlp.fc.weight") p.val()[7] = 1e6f;
    const TrainConfig c = read_train_config(H5File::open_read(src));
    save_training_checkpoint(d / "big.h5", *big.model, *c.make_optimizer(big.model->named_parameters()), c, TrainState{}, *big.tok);
    const std::string big_args = "uptrain --from " + (d / "big.h5") + " --kv-heads 2 --method mean --data " + text + " --out " + (d / "f16") + " " +
                                 partial + " --quiet --set frozen_weights=f16";
    expect_job_error(run_shell(mpirun(2) + binary() + " " + big_args), "blocks.1.mlp.fc.weight: value 1000000.000000 at index 7 is beyond what f16 holds");
    BOOST_TEST(!fs::exists(d / "f16/checkpoint.h5"));
  }
}

// An uptraining under mpirun stopped by SIGUSR1 part-way and resumed on two ranks is the straight
// one bit for bit (every loss, weight and moment), distilling from the source on every rank with
// sharded gradients: rank 0 converts again on --resume, and the checkpoint's state replaces it.
BOOST_AUTO_TEST_CASE(uptrain_on_two_ranks_resumes_bit_exact) {
  TempDir d;
  nlohmann::json j = small_config(20, 0.0);
  j["n_kv_head"] = 4;  // MHA
  BOOST_REQUIRE(run_cli(train_args(write_config(d, "src.json", j), d / "src")).code == 0);
  // 2000 steps (a few seconds on two ranks): long enough for the signal to land part-way
  const std::string args = " uptrain --from " + (d / "src/checkpoint.h5") + " --kv-heads 1 --method mean --data " + tiny_text() +
                           " --fraction 1 --set max_iters=2000 --set checkpoint_interval=100000 --set shard=gradients --set dropout=0.1"
                           " --distill --out ";
  Run r = run_shell(mpirun(2) + binary() + args + (d / "straight") + " --quiet");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_REQUIRE(train_losses(d / "straight").size() == 2000u);
  Job job(mpirun(2, false) + binary() + args + (d / "run"), d / "log");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // 50 steps logged (lines, whole or not)
  auto lines = [&] { const std::string m = fs::exists(d / "run/metrics.jsonl") ? slurp(d / "run/metrics.jsonl") : ""; return std::count(m.begin(), m.end(), '\n'); };
  while (std::chrono::steady_clock::now() < until && lines() < 50) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(job.pid, SIGUSR1);
  const int64_t step = stopped_at(job, d);
  BOOST_TEST(step >= 50);
  BOOST_TEST(step < 2000);
  BOOST_TEST(slurp(d / "log").find("uptraining stopped by signal; resume with --resume") != std::string::npos, slurp(d / "log"));
  r = run_shell(mpirun(2) + binary() + args + (d / "run") + " --quiet --resume");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST((train_losses(d / "run") == train_losses(d / "straight")), tt::per_element());
  expect_same_state(d / "straight/checkpoint.h5", d / "run/checkpoint.h5");
  BOOST_TEST_MESSAGE("uptraining stopped at step " << step << " of 2000 and resumed");
}

BOOST_AUTO_TEST_CASE(one_process_checkpoint_resumes_on_two_ranks) {
  TempDir d;
  const std::string cfg = write_config(d, "c.json", small_config(4, 0.1));
  BOOST_REQUIRE(run_cli(train_args(cfg, d / "run")).code == 0);
  Run r = run_shell(mpirun(2) + binary() + " " + train_args(cfg, d / "run") + " --resume --check-sync --set max_iters=7");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  {
    H5File f = H5File::open_read(d / "run/checkpoint.h5");
    BOOST_TEST(f.read_attr_int("/train", "step") == 7);
    BOOST_TEST(f.read_attr_int("/train", "world_size") == 2);
    // Rank 1 joined with a stream of its own, not a copy of rank 0's.
    BOOST_TEST(f.read_bytes("/train/rank_1/sampler_state") != f.read_bytes("/train/sampler_state"));
  }
  const auto losses = train_losses(d / "run");
  BOOST_TEST(losses.size() == 7u);
  for (double l : losses) BOOST_TEST(std::isfinite(l));

  // Grow to three ranks (rank 2 starts a stream; 0 and 1 continue theirs), then shrink to two.
  Run three = run_shell(mpirun(3) + binary() + " " + train_args(cfg, d / "run") + " --resume --check-sync --set max_iters=9");
  BOOST_REQUIRE_MESSAGE(three.code == 0, three.err);
  {
    H5File f = H5File::open_read(d / "run/checkpoint.h5");
    BOOST_TEST(f.read_attr_int("/train", "world_size") == 3);
    BOOST_TEST(f.exists("/train/rank_2/sampler_state"));
    BOOST_TEST(f.read_bytes("/train/rank_2/sampler_state") != f.read_bytes("/train/rank_1/sampler_state"));
  }
  Run two = run_shell(mpirun(2) + binary() + " " + train_args(cfg, d / "run") + " --resume --check-sync --set max_iters=10");
  BOOST_REQUIRE_MESSAGE(two.code == 0, two.err);
  H5File f = H5File::open_read(d / "run/checkpoint.h5");
  BOOST_TEST(f.read_attr_int("/train", "step") == 10);
  BOOST_TEST(f.read_attr_int("/train", "world_size") == 2);
  BOOST_TEST(!f.exists("/train/rank_2"));
}

// A bad config on one rank only (MPMD launch): that rank's message, once; no checkpoint.
BOOST_AUTO_TEST_CASE(a_bad_config_on_one_rank_ends_the_job) {
  TempDir d;
  const std::string good = write_config(d, "good.json", small_config(4, 0.0));
  nlohmann::json bad = small_config(4, 0.0);
  bad["bogus_key"] = 1;
  const std::string badp = write_config(d, "bad.json", bad);
  Run r = mpmd(train_args(good, d / "run"), train_args(badp, d / "run"));
  expect_job_error(r, "tapelm: error: rank 1 of 2:");
  BOOST_TEST(r.err.find("bogus_key") != std::string::npos, r.err);
  BOOST_TEST(!fs::exists(d / "run/checkpoint.h5"));
  // Two valid but different configs would train two different models: refused.
  expect_job_error(mpmd(train_args(good, d / "run2"), train_args(good, d / "run2") + " --set learning_rate=0.001"),
                   "rank 1 of 2: its training config differs from rank 0's");
  BOOST_TEST(!fs::exists(d / "run2/checkpoint.h5"));
}

// A bad flag, or another subcommand, on one rank only: one line from that rank, and no hang.
BOOST_AUTO_TEST_CASE(a_bad_command_line_on_one_rank_ends_the_job) {
  TempDir d;
  const std::string good = write_config(d, "good.json", small_config(4, 0.0));
  expect_job_error(mpmd(train_args(good, d / "run"), train_args(good, d / "run") + " --bogus-flag"), "--bogus-flag");
  expect_job_error(mpmd(train_args(good, d / "run"), "inspect " + fixture_path("parity/mha.h5")),
                   "rank 1 of 2: only `tapelm train`");
  // two commands that both run on many ranks would wait in different collectives
  expect_job_error(mpmd(train_args(good, d / "run"), "uptrain --from " + fixture_path("parity/mha.h5") + " --kv-heads 1 --data " +
                                                         tiny_text() + " --out " + (d / "up")),
                   "rank 1 of 2: it runs `tapelm uptrain` where rank 0 runs `tapelm train`");
  BOOST_TEST(!fs::exists(d / "run/checkpoint.h5"));
  BOOST_TEST(!fs::exists(d / "up"));
}

// Errors every rank meets alike are reported once.
BOOST_AUTO_TEST_CASE(errors_on_every_rank_are_reported_once) {
  TempDir d;
  const std::string cfg = write_config(d, "c.json", small_config(4, 0.0));
  Run missing = run_shell(mpirun(2) + binary() + " train --config " + cfg + " --data " + (d / "nope.txt") + " --out " +
                          (d / "run"));
  BOOST_TEST(missing.code == 1, missing.err);
  BOOST_TEST(tapelm_error_lines(missing.err) == 1, missing.err);
  BOOST_TEST(missing.err.find("nope.txt") != std::string::npos, missing.err);

  Run nan = run_shell(mpirun(2) + binary() + " " + train_args(cfg, d / "nan") + " --set learning_rate=1e12");
  BOOST_TEST(nan.code == 1, nan.err);
  BOOST_TEST(tapelm_error_lines(nan.err) == 1, nan.err);
  BOOST_TEST((nan.err.find("NaN") != std::string::npos || nan.err.find("Inf") != std::string::npos), nan.err);

  Run other = run_shell(mpirun(2) + binary() + " inspect " + fixture_path("parity/mha.h5"));
  BOOST_TEST(other.code == 1, other.err);
  BOOST_TEST(tapelm_error_lines(other.err) == 1, other.err);
  BOOST_TEST(other.err.find("only `tapelm train`") != std::string::npos, other.err);
}

// SIGKILL one rank mid-run: the job ends (no hang) with a failure and the checkpoint still loads.
BOOST_AUTO_TEST_CASE(a_killed_rank_ends_the_job_and_the_checkpoint_survives) {
  TempDir d;
  const std::string cfg = endless_config(d);
  Job job(mpirun(2, false) + binary() + " " + train_args(cfg, d / "killrun"), d / "log");
  BOOST_REQUIRE_MESSAGE(wait_for_file(d / "killrun/checkpoint.h5", 60), slurp(d / "log"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const pid_t victim = find_rank(d / "killrun", 1);
  BOOST_REQUIRE(victim > 0);
  ::kill(victim, SIGKILL);
  const int code = job.wait(60);
  BOOST_TEST(code != -1, "the job did not end within 60 s of losing a rank");
  BOOST_TEST(code != 0);
  GPT m = load_weights(d / "killrun/checkpoint.h5");  // throws if the file is damaged
  int64_t step = 0;
  {
    H5File f = H5File::open_read(d / "killrun/checkpoint.h5");
    step = f.read_attr_int("/train", "step");
  }
  BOOST_TEST(step % 10 == 0);
  BOOST_TEST(run_cli("inspect " + (d / "killrun/checkpoint.h5")).code == 0);
  // The run resumes (here as one process), and a temp file a killed write left is cleared away.
  Run r = run_cli(train_args(cfg, d / "killrun") + " --resume --set max_iters=" + std::to_string(step + 2));
  BOOST_TEST(r.code == 0, r.err);
  for (const auto& e : fs::directory_iterator(d / "killrun"))
    BOOST_TEST(e.path().filename().string().find(".tmp.") == std::string::npos, e.path());
}

// SIGUSR1 to mpirun reaches every rank: they finish the step, rank 0 saves, all exit 0.
BOOST_AUTO_TEST_CASE(sigusr1_stops_every_rank_cleanly) {
  TempDir d;
  const std::string cfg = endless_config(d);
  Job job(mpirun(2, false) + binary() + " train --config " + cfg + " --data " + tiny_text() + " --out " + (d / "run"), d / "log");
  BOOST_REQUIRE_MESSAGE(wait_for_file(d / "run/checkpoint.h5", 60), slurp(d / "log"));
  ::kill(job.pid, SIGUSR1);
  const int64_t step = stopped_at(job, d);
  Run r = run_shell(mpirun(2) + binary() + " " + train_args(cfg, d / "run") + " --resume --set max_iters=" +
                    std::to_string(step + 3));
  BOOST_TEST(r.code == 0, r.err);
  H5File f = H5File::open_read(d / "run/checkpoint.h5");
  BOOST_TEST(f.read_attr_int("/train", "step") == step + 3);
}

// A stop that reaches one rank only, in the middle of a step of 8 micro-batches: every rank
// agrees on it at the next micro-batch (one allreduce), abandons the step together, rank 0 saves
// the last completed step, and all exit 0; the run resumes from that checkpoint.
BOOST_AUTO_TEST_CASE(a_stop_on_one_rank_mid_step_stops_every_rank) {
  TempDir d;
  nlohmann::json j = small_config(100000000, 0.0);
  j["grad_accum"] = 8;
  j["checkpoint_interval"] = 5;
  j["log_interval"] = 1000;
  j["eval_interval"] = 1000000;
  const std::string cfg = write_config(d, "accum.json", j);
  Job job(mpirun(2, false) + binary() + " train --config " + cfg + " --data " + tiny_text() + " --out " + (d / "run"), d / "log");
  BOOST_REQUIRE_MESSAGE(wait_for_file(d / "run/checkpoint.h5", 60), slurp(d / "log"));
  const pid_t rank1 = find_rank(d / "run", 1);
  BOOST_REQUIRE(rank1 > 0);
  ::kill(rank1, SIGTERM);
  const int64_t step = stopped_at(job, d);
  for (const auto& e : fs::directory_iterator(d / "run"))
    BOOST_TEST(e.path().filename().string().find(".tmp.") == std::string::npos, e.path());
  Run r = run_shell(mpirun(2) + binary() + " " + train_args(cfg, d / "run") + " --resume --set max_iters=" + std::to_string(step + 1));
  BOOST_TEST(r.code == 0, r.err);
}

// Weights that turn non-finite between checkpoints (a learning rate of 1e39 is infinite in
// float): rank 0 refuses to save them, every rank stops with it, one error line, exit 1, and the
// checkpoint already in the directory is the one that stays.
BOOST_AUTO_TEST_CASE(non_finite_weights_are_not_saved_on_two_ranks) {
  TempDir d;
  nlohmann::json j = small_config(2, 0.0);
  j["checkpoint_interval"] = 1;
  const std::string cfg = write_config(d, "c.json", j);
  BOOST_REQUIRE(run_shell(mpirun(2) + binary() + " " + train_args(cfg, d / "run")).code == 0);
  const std::string before = slurp(d / "run/checkpoint.h5");
  Run r = run_shell(mpirun(2) + binary() + " " + train_args(cfg, d / "run") +
                    " --resume --set max_iters=4 --set learning_rate=1e39 --set min_lr=0 --set warmup_iters=0");
  BOOST_TEST(r.code == 1, r.err);
  BOOST_TEST(tapelm_error_lines(r.err) == 1, r.err);
  BOOST_TEST((r.err.find("Inf") != std::string::npos || r.err.find("NaN") != std::string::npos), r.err);
  BOOST_TEST(r.err.find("parameter") != std::string::npos, r.err);
  BOOST_TEST(r.err.find("not writing") != std::string::npos, r.err);
  BOOST_TEST((slurp(d / "run/checkpoint.h5") == before), "the step-2 checkpoint was replaced");
  for (const auto& e : fs::directory_iterator(d / "run"))
    BOOST_TEST(e.path().filename().string().find(".tmp.") == std::string::npos, e.path());
}

BOOST_AUTO_TEST_SUITE_END()
