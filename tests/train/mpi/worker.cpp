// Checks of the collectives in train/dist, run by the dist test suite as `mpirun -np 2 worker`.
// Each rank prints "FAIL: ..." for every failed check and "ok rank R" at the end; it exits 1 if
// any check failed on it.
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <string>
#include <thread>

#include "autograd/cpu.h"
#include "autograd/runtime.h"
#include "train/dist.h"
#include "nn/gpt.h"
#include "train/trainer.h"

using namespace tapelm;

namespace {
int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL rank %d: %s\n", dist::rank(), what.c_str());
    failures++;
  }
}
}  // namespace

int main(int argc, char** argv) {
  tapelm::guard_blas_core(argv);
  dist::Session mpi(&argc, &argv);
  const int r = dist::rank(), n = dist::size();
  check(n == 2, "world size is " + std::to_string(n) + ", expected 2");
  check(dist::launched_by_mpi(), "launched_by_mpi() is false under mpirun");
  set_num_threads(1);

  // Sums: a float buffer longer than one message piece would be slow to test; exact small sums.
  std::vector<float> f(1000);
  for (size_t i = 0; i < f.size(); i++) f[i] = static_cast<float>(i) * (r + 1);
  dist::allreduce_sum(f.data(), f.size());
  bool ok = true;
  for (size_t i = 0; i < f.size(); i++) ok = ok && f[i] == static_cast<float>(i) * 3;
  check(ok, "allreduce_sum(float) of i*(rank+1) is not 3i");
  double d[2] = {0.25 * (r + 1), -1.0};
  dist::allreduce_sum(d, 2);
  check(d[0] == 0.75 && d[1] == -2.0, "allreduce_sum(double)");
  uint64_t lo[2] = {uint64_t(10 + r), uint64_t(100 - r)}, hi[2] = {lo[0], lo[1]};
  dist::allreduce_min(lo, 2);
  dist::allreduce_max(hi, 2);
  check(lo[0] == 10 && lo[1] == 99 && hi[0] == 11 && hi[1] == 100, "allreduce_min/max(uint64)");

  // Broadcasts and gather.
  std::string s = r == 0 ? std::string("from rank zero\n\0with a nul", 26) : "other";
  dist::broadcast(s);
  check(s == std::string("from rank zero\n\0with a nul", 26), "broadcast(string) did not deliver rank 0's bytes");
  std::vector<float> w(5, static_cast<float>(r + 7));
  dist::broadcast(w.data(), w.size());
  check(w == std::vector<float>(5, 7.f), "broadcast(float) did not deliver rank 0's values");
  std::vector<std::string> all = dist::gather("state of " + std::to_string(r) + std::string(r * 3, 'x'));
  if (r == 0)
    check(all.size() == 2 && all[0] == "state of 0" && all[1] == "state of 1xxx", "gather() on rank 0");
  else
    check(all.empty(), "gather() returned data on a rank other than 0");

  // agree(): nothing failed; then only rank 1 failed; then every rank failed.
  try {
    dist::agree("");
  } catch (const std::exception& e) {
    check(false, std::string("agree(\"\") threw: ") + e.what());
  }
  try {
    dist::agree(r == 1 ? "bad key 'x'" : "");
    check(false, "agree() with rank 1 failing did not throw");
  } catch (const dist::AgreedError& e) {
    if (r == 1) check(e.print_here && std::string(e.what()) == "rank 1 of 2: bad key 'x'", std::string("rank 1 got ") + e.what());
    else check(!e.print_here, "rank 0 would print rank 1's error");
  }
  try {
    dist::agree("same error");
    check(false, "agree() with every rank failing did not throw");
  } catch (const dist::AgreedError& e) {
    check(e.print_here == (r == 0), "with every rank failing, rank 0 alone should report");
  }

  // barrier_sleeping(): rank 1 waits 300 ms for rank 0 and leaves no earlier; its waiting costs it
  // little CPU time (a busy wait would cost about all 300 ms; allowed: 100 ms). The ranks start the
  // clock together, out of an all-reduce (a rank leaves it late on a loaded machine: 0.2 s allowed).
  {
    double sync = 0;
    dist::allreduce_sum(&sync, 1);
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    dist::barrier_sleeping();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    if (r == 1) {
      check(waited >= 0.2, "barrier_sleeping() let rank 1 go after " + std::to_string(waited) + " s, before rank 0 came");
      check(cpu < 0.1, "barrier_sleeping() took " + std::to_string(cpu) + " s of CPU time in a 0.3 s wait");
    }
  }

  // Streams: rank 0 keeps the run's seed; every other (rank, epoch) gets its own.
  check(dist::rank_seed(42, 0) == 42, "rank 0's stream is not the run's seed");
  check(dist::rank_seed(42, 1) != 42 && dist::rank_seed(42, 1) != dist::rank_seed(42, 2) &&
            dist::rank_seed(42, 1, 1) != dist::rank_seed(42, 1) && dist::rank_seed(42, 0, 1) != 42,
        "rank_seed() streams collide");

  // check_ranks_in_sync: equal weights pass; one changed bit on rank 1 is caught on both ranks.
  GPT model(GPTConfig::from_json({{"vocab_size", 11}, {"n_layer", 1}, {"n_head", 2}, {"n_kv_head", 1},
                                   {"n_embd", 8}, {"block_size", 6}}),
            3);
  NamedParams params = model.named_parameters();
  try {
    check_ranks_in_sync(params, 1);
  } catch (const std::exception& e) {
    check(false, std::string("identical weights reported as different: ") + e.what());
  }
  const std::string victim = params[2].first;
  float& bit = params[2].second.val().data()[3];
  const float kept = bit;
  if (r == 1) bit = std::nextafter(bit, INFINITY);
  try {
    check_ranks_in_sync(params, 5);
    check(false, "a one-ulp difference on rank 1 went unnoticed");
  } catch (const dist::AgreedError& e) {
    const std::string m = e.what();
    check(m.find("step 5") != std::string::npos && m.find(victim) != std::string::npos,
          "the sync error does not name step 5 and " + victim + ": " + m);
    check(e.print_here == (r == 0), "the sync error should be reported by rank 0 alone");
  }
  bit = kept;

  // Split evaluation: each rank evaluates every second batch; the reduced mean equals one process's.
  std::vector<int32_t> data(200);
  for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<int32_t>((i * 7 + i / 3) % 11);
  std::vector<int64_t> starts;
  for (int i = 0; i < 13; i++) starts.push_back((i * 37) % 190);  // 13 windows: batches of 4, 4, 4, 1
  const double whole = evaluate_windows(model, data, starts, 6, 4, false);
  const double split = evaluate_windows(model, data, starts, 6, 4, true);
  check(std::abs(whole - split) <= 1e-12 * std::abs(whole),
        "split evaluation " + std::to_string(split) + " != one-process " + std::to_string(whole));

  std::printf("ok rank %d (%d failures)\n", r, failures);
  return failures ? 1 : 0;
}
