// The BLAS core guard, the OpenMP wait policy and the two FLOP/s peaks (autograd/cpu.h, autograd/runtime.h).
#include <boost/test/unit_test.hpp>

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "autograd/cpu.h"
#include "autograd/gradcheck.h"
#include "autograd/kernels/blas.h"
#include "autograd/kernels/elementwise.h"
#include "autograd/isa.h"
#include "autograd/omp_wait.h"
#include "autograd/runtime.h"
#include "test_util.h"

using namespace tapelm;
using namespace tapelm::test;
namespace tt = boost::test_tools;

namespace {

CpuInfo cpu_with(int level) {
  CpuInfo c;
  c.vendor = "GenuineIntel";
  c.sse3 = true;
  c.avx = level >= 1;
  c.avx2 = c.fma = level >= 2;
  c.avx512f = c.avx512dq = c.avx512cd = c.avx512bw = c.avx512vl = level >= 3;
  c.avx512bf16 = level >= 4;
  return c;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The CPU's flags as the Linux kernel reports them: an oracle independent of our cpuid reading.
std::set<std::string> proc_cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

test::Precondition kernel_reports_flags(boost::unit_test::test_unit_id) {
  test::Precondition r(!proc_cpu_flags().empty());
  if (!r) r.message() << "no /proc/cpuinfo flags line (not x86 Linux): nothing to compare";
  return r;
}

test::Precondition tapelm_chose_the_wait_policy(boost::unit_test::test_unit_id) {
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* marker = std::getenv(kSpinSetVar);
  test::Precondition r(!std::getenv("OMP_WAIT_POLICY") && spin && marker && std::string(spin) == marker);
  if (!r) r.message() << "the environment chose the OpenMP wait policy: nothing of tapelm's to check";
  return r;
}

// qemu-user runs the binary as another CPU; CI must have it (scripts/setup.sh installs it), so
// there the test runs and fails without it. AddressSanitizer's shadow memory does not start under
// QEMU's user-mode emulation: the Release pass checks this.
test::Precondition qemu_can_run_the_binary(boost::unit_test::test_unit_id) {
  if (test::sanitized()) {
    test::Precondition r(false);
    r.message() << "an AddressSanitizer build: the Release pass checks this";
    return r;
  }
  test::Precondition r(std::getenv("CI") != nullptr || std::system("command -v qemu-x86_64 >/dev/null 2>&1") == 0);
  if (!r) r.message() << "qemu-x86_64 (Debian's qemu-user, installed by scripts/setup.sh) is missing";
  return r;
}

/// The OpenBLAS core the kernel's flags call for (OpenBLAS's own rule: the newest kernel set whose
/// instructions the CPU has): "" when it has nothing past SSE.
std::string best_core_from_flags(const std::set<std::string>& f) {
  auto has = [&](const char* x) { return f.count(x) > 0; };
  const bool avx512 = has("avx512f") && has("avx512dq") && has("avx512cd") && has("avx512bw") && has("avx512vl");
  if (avx512 && has("avx512_bf16")) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (has("avx2") && has("fma")) return "Haswell";
  if (has("avx")) return "Sandybridge";
  return "";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(runtime)

BOOST_AUTO_TEST_CASE(core_levels_follow_the_instruction_sets) {
  BOOST_TEST(blas_core_level("Prescott") == 0);
  BOOST_TEST(blas_core_level("nehalem") == 0);
  BOOST_TEST(blas_core_level("Sandybridge") == 1);
  BOOST_TEST(blas_core_level("HASWELL") == 2);
  BOOST_TEST(blas_core_level("Zen") == 2);
  BOOST_TEST(blas_core_level("SkylakeX") == 3);
  BOOST_TEST(blas_core_level("Cooperlake") == 4);
  BOOST_TEST(blas_core_level("Pentium9000") == -1);
  BOOST_TEST(canonical_blas_core("skylakex") == "SkylakeX");
  BOOST_TEST(best_blas_core(cpu_with(4)) == "Cooperlake");
  BOOST_TEST(best_blas_core(cpu_with(3)) == "SkylakeX");
  BOOST_TEST(best_blas_core(cpu_with(2)) == "Haswell");
  BOOST_TEST(best_blas_core(cpu_with(1)) == "Sandybridge");
  BOOST_TEST(best_blas_core(cpu_with(0)) == "");
  // AVX-512F alone is not enough for SkylakeX's kernels (they use BW, VL and DQ too).
  CpuInfo partial = cpu_with(2);
  partial.avx512f = true;
  BOOST_TEST(best_blas_core(partial) == "Haswell");
}

// The case the guard exists for: a Xeon OpenBLAS 0.3.21 does not know gets Prescott.
BOOST_AUTO_TEST_CASE(a_fallback_core_is_replaced_by_the_best_the_cpu_runs) {
  const BlasCoreDecision d = decide_blas_core("Prescott", cpu_with(4), nullptr, nullptr, nullptr);
  BOOST_TEST(d.action == BlasCoreDecision::reexec);
  BOOST_TEST(d.core == "Cooperlake");
  BOOST_TEST(decide_blas_core("Prescott", cpu_with(2), nullptr, "auto", nullptr).core == "Haswell");
  BOOST_TEST(decide_blas_core("Sandybridge", cpu_with(3), nullptr, nullptr, nullptr).core == "SkylakeX");
  // After the re-execution: one line saying what was done and how to undo it, and no second one.
  const BlasCoreDecision after = decide_blas_core("Cooperlake", cpu_with(4), "Cooperlake", nullptr, "Prescott");
  BOOST_TEST(after.action == BlasCoreDecision::keep);
  BOOST_TEST(contains(after.message, "had chosen its Prescott kernels"), after.message);
  BOOST_TEST(contains(after.message, "AVX-512 BF16"), after.message);
  BOOST_TEST(contains(after.message, "OPENBLAS_CORETYPE=Cooperlake"), after.message);
  BOOST_TEST(contains(after.message, "TAPELM_BLAS_CORE=keep"), after.message);
  // A library that ignores the variable does not make the guard loop.
  const BlasCoreDecision stuck = decide_blas_core("Prescott", cpu_with(4), "Cooperlake", nullptr, "Prescott");
  BOOST_TEST(stuck.action == BlasCoreDecision::keep);
  BOOST_TEST(contains(stuck.message, "kept its Prescott kernels"), stuck.message);
}

BOOST_AUTO_TEST_CASE(a_core_as_good_as_the_cpu_is_left_alone_silently) {
  for (const char* chosen : {"Cooperlake", "SapphireRapids"}) {
    const BlasCoreDecision d = decide_blas_core(chosen, cpu_with(4), nullptr, nullptr, nullptr);
    BOOST_TEST(d.action == BlasCoreDecision::keep);
    BOOST_TEST(d.message.empty());
  }
  BOOST_TEST(decide_blas_core("Zen", cpu_with(2), nullptr, nullptr, nullptr).action == BlasCoreDecision::keep);
  // A CPU with nothing past SSE: Prescott is its best.
  BOOST_TEST(decide_blas_core("Prescott", cpu_with(0), nullptr, nullptr, nullptr).action == BlasCoreDecision::keep);
}

BOOST_AUTO_TEST_CASE(the_users_choice_wins_but_is_warned_about) {
  // OPENBLAS_CORETYPE set by the user: respected, with a warning naming both cores.
  const BlasCoreDecision user = decide_blas_core("Prescott", cpu_with(4), "Prescott", nullptr, nullptr);
  BOOST_TEST(user.action == BlasCoreDecision::keep);
  BOOST_TEST(contains(user.message, "warning"), user.message);
  BOOST_TEST(contains(user.message, "OPENBLAS_CORETYPE=Prescott"), user.message);
  BOOST_TEST(contains(user.message, "Cooperlake"), user.message);
  // An explicit TAPELM_BLAS_CORE=auto overrides it.
  const BlasCoreDecision over = decide_blas_core("Prescott", cpu_with(4), "Prescott", "auto", nullptr);
  BOOST_TEST(over.action == BlasCoreDecision::reexec);
  BOOST_TEST(over.core == "Cooperlake");
  // keep: never re-executes.
  const BlasCoreDecision keep = decide_blas_core("Prescott", cpu_with(3), nullptr, "keep", nullptr);
  BOOST_TEST(keep.action == BlasCoreDecision::keep);
  BOOST_TEST(contains(keep.message, "SkylakeX"), keep.message);
  // A name is forced, in any case spelling.
  const BlasCoreDecision named = decide_blas_core("Cooperlake", cpu_with(4), nullptr, "haswell", nullptr);
  BOOST_TEST(named.action == BlasCoreDecision::reexec);
  BOOST_TEST(named.core == "Haswell");
  BOOST_TEST(decide_blas_core("Haswell", cpu_with(4), nullptr, "Haswell", nullptr).action == BlasCoreDecision::keep);
}

BOOST_AUTO_TEST_CASE(impossible_cores_are_errors_naming_the_problem) {
  const BlasCoreDecision unknown = decide_blas_core("Haswell", cpu_with(2), nullptr, "Pentium9000", nullptr);
  BOOST_TEST(unknown.action == BlasCoreDecision::error);
  BOOST_TEST(contains(unknown.message, "TAPELM_BLAS_CORE=Pentium9000"), unknown.message);
  // Forcing kernels the CPU cannot execute would end in SIGILL, not in a slow run.
  const BlasCoreDecision too_new = decide_blas_core("Haswell", cpu_with(2), nullptr, "SkylakeX", nullptr);
  BOOST_TEST(too_new.action == BlasCoreDecision::error);
  BOOST_TEST(contains(too_new.message, "AVX-512"), too_new.message);
  // A 5,000-character value (was echoed whole) and control bytes are shown cut, with the length.
  const std::string long_value(5000, 'x');
  const BlasCoreDecision garbage = decide_blas_core("Haswell", cpu_with(2), nullptr, long_value.c_str(), nullptr);
  BOOST_TEST(garbage.action == BlasCoreDecision::error);
  BOOST_TEST(garbage.message.size() < 200u, garbage.message.size());
  BOOST_TEST(contains(garbage.message, "(5000 characters)"), garbage.message);
  const BlasCoreDecision control = decide_blas_core("Haswell", cpu_with(2), nullptr, "a\nb\x1b[2J", nullptr);
  BOOST_TEST(contains(control.message, "TAPELM_BLAS_CORE=a?b?[2J"), control.message);
}

// Our cpuid reading against the flags the Linux kernel reports for the same CPU.
BOOST_AUTO_TEST_CASE(cpuid_agrees_with_the_kernels_flags, *boost::unit_test::precondition(kernel_reports_flags)) {
  const std::set<std::string> f = proc_cpu_flags();
  const CpuInfo& c = cpu_info();
  BOOST_TEST(c.avx == (f.count("avx") > 0));
  BOOST_TEST(c.fma == (f.count("fma") > 0));
  BOOST_TEST(c.avx2 == (f.count("avx2") > 0));
  BOOST_TEST(c.avx512f == (f.count("avx512f") > 0));
  BOOST_TEST(c.avx512bw == (f.count("avx512bw") > 0));
  BOOST_TEST(c.avx512vl == (f.count("avx512vl") > 0));
  BOOST_TEST(c.avx512bf16 == (f.count("avx512_bf16") > 0));
  BOOST_TEST(best_blas_core(c) == best_core_from_flags(f));
}

// End to end: force OpenBLAS onto its SSE3 kernels as an unknown CPU model would, and check that
// the program comes back on the best core with the one-line explanation.
BOOST_AUTO_TEST_CASE(the_cli_replaces_a_forced_fallback_core_and_says_so) {
  const std::string best = best_core_from_flags(proc_cpu_flags());
  const Run r = run_cli("inspect --system", "env OPENBLAS_CORETYPE=Prescott TAPELM_BLAS_CORE=auto ");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  if (best.empty()) {
    BOOST_TEST(contains(r.out, "openblas core Prescott"), r.out);
    return;
  }
  BOOST_TEST(contains(r.out, "openblas core " + best + " (OPENBLAS_CORETYPE, set by tapelm: OpenBLAS chose Prescott)"),
             r.out);
  BOOST_TEST(contains(r.err, "had chosen its Prescott kernels"), r.err);
  BOOST_TEST(std::count(r.err.begin(), r.err.end(), '\n') == 1, r.err);
  // keep: stays on Prescott, with a warning.
  const Run kept = run_cli("inspect --system", "env OPENBLAS_CORETYPE=Prescott TAPELM_BLAS_CORE=keep ");
  BOOST_REQUIRE_MESSAGE(kept.code == 0, kept.err);
  BOOST_TEST(contains(kept.out, "openblas core Prescott"), kept.out);
  // A forced name, and an impossible one.
  const Run named = run_cli("inspect --system", "env -u OPENBLAS_CORETYPE TAPELM_BLAS_CORE=prescott ");
  BOOST_REQUIRE_MESSAGE(named.code == 0, named.err);
  BOOST_TEST(contains(named.out, "openblas core Prescott"), named.out);
  expect_error(run_cli("inspect --system", "env TAPELM_BLAS_CORE=Pentium9000 "), "TAPELM_BLAS_CORE=Pentium9000");
}

// The second peak is the formula the issue states, on a clock that was measured, and no BLAS can
// beat the silicon (a margin of 25 % for the clock changing between the two measurements).
BOOST_AUTO_TEST_CASE(both_peaks_are_printed_and_consistent) {
  ThreadCount one(1);
  const ComputeInfo c = compute_info();
  BOOST_TEST(c.threads == 1);
  BOOST_TEST(c.clock_hz > 0.3e9);
  BOOST_TEST(c.clock_hz < 7e9);
  BOOST_TEST(c.cpu_peak == double(c.threads) * c.fma_units * c.lanes * 2.0 * c.clock_hz,
             boost::test_tools::tolerance(1e-12));
  BOOST_TEST(c.sgemm_peak > 0);
  BOOST_TEST(c.sgemm_peak <= 1.25 * c.cpu_peak, "sgemm " << c.sgemm_peak << " vs CPU " << c.cpu_peak);
  const std::string line = compute_summary(c);
  BOOST_TEST(contains(line, "OpenBLAS core"), line);
  BOOST_TEST(contains(line, "sgemm"), line);
  BOOST_TEST(contains(line, "CPU"), line);
  // bench reports the core and both peaks, so a crippled BLAS shows as low MFU against the CPU.
  const Run r = run_cli("--threads 1 bench --mode train --set n_layer=1 --set n_embd=32 --set block_size=8 "
                        "--batch 2 --iters 2 --warmup 1 --json",
                        "env TAPELM_BLAS_CORE=Prescott ");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  BOOST_TEST(j.at("blas_core").get<std::string>().rfind("Prescott", 0) == 0, r.out);
  BOOST_TEST(j.at("cpu_peak_flops_per_s").get<double>() > 0);
  BOOST_TEST(j.at("sgemm_peak_flops_per_s").get<double>() > 0);
  BOOST_TEST(j.at("model_flops_per_s").get<double>() > 0);
  // the linear layers' share of each timed step: positive (the model has linear layers) and within
  // the step it was measured in (the warm-up's is not counted)
  const auto steps = j.at("times").get<std::vector<double>>();
  const auto linear = j.at("linear_times").get<std::vector<double>>();
  BOOST_REQUIRE_EQUAL(linear.size(), 2u);
  BOOST_REQUIRE_EQUAL(steps.size(), 2u);
  for (size_t i = 0; i < 2; i++) {
    BOOST_TEST(linear[i] > 0.0, r.out);
    BOOST_TEST(linear[i] <= steps[i], r.out);
  }
}

// x·Wᵀ with 2 to 16 rows (a decoding batch) has its own kernel: checked against the sum in double,
// with N odd (a W row without a partner) and K not a multiple of the vector width, for alpha/beta,
// and for bit-identical results on 1, 2 and 3 threads.
BOOST_AUTO_TEST_CASE(few_row_products) {
  const int before = get_num_threads();
  const int64_t N = 71, K = 203;
  for (int64_t M : {2, 5, 8, 13, 16}) {
    const Tensor A = randn({M, K}, 100 + M), B = randn({N, K}, 200 + M), C0 = randn({M, N}, 300 + M);
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      Tensor C = C0.clone();
      kern::sgemm(false, true, M, N, K, 0.5f, A.data(), K, B.data(), K, 2.0f, C.data(), N);
      outs.push_back(C.to_vector());
    }
    BOOST_TEST(outs[0] == outs[1], tt::per_element());
    BOOST_TEST(outs[0] == outs[2], tt::per_element());
    double worst = 0;
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double dot = 0;
        for (int64_t k = 0; k < K; k++) dot += double(A[m * K + k]) * B[n * K + k];
        worst = std::max(worst, std::fabs(0.5 * dot + 2.0 * C0[m * N + n] - outs[0][m * N + n]));
      }
    BOOST_TEST(worst < 2e-5, "M " << M << ": max |kernel - double| " << worst);
  }
  set_num_threads(before);
}


// Several products of the same few rows in one pass (a decoding step's q, k, v projections):
// every output against a double-precision dot product, biases added, odd and small widths (1
// and 3 outputs), one row as well as sixteen, and the same bits on 1, 2 and 3 threads. With more
// than 16 rows the products are plain sgemm calls: bit-identical to calling them one by one.
BOOST_AUTO_TEST_CASE(several_products_of_the_same_rows_in_one_pass) {
  const int before = get_num_threads();
  const int64_t K = 203;
  const int64_t Ns[3] = {71, 3, 1};
  for (int64_t M : {1, 2, 7, 16, 17}) {
    BOOST_TEST_CONTEXT("M " << M) {
      const Tensor A = randn({M, K}, 400 + M);
      std::vector<Tensor> B, bias;
      for (int i = 0; i < 3; i++) B.push_back(randn({Ns[i], K}, 500 + 10 * M + i)), bias.push_back(randn({Ns[i]}, 600 + i));
      std::vector<std::vector<float>> outs;
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        std::vector<Tensor> C;
        kern::XwtProduct ps[3];
        for (int i = 0; i < 3; i++) {
          C.push_back(Tensor::zeros({M, Ns[i]}));
          ps[i] = kern::XwtProduct{B[i].data(), K, Ns[i], C[i].data(), Ns[i], i == 1 ? nullptr : bias[i].data()};
        }
        kern::sgemm_xwt_many(M, K, A.data(), K, ps, 3);
        std::vector<float> all;
        for (const Tensor& c : C) {
          const std::vector<float> v = c.to_vector();
          all.insert(all.end(), v.begin(), v.end());
        }
        outs.push_back(all);
      }
      BOOST_TEST(outs[0] == outs[1], tt::per_element());
      BOOST_TEST(outs[0] == outs[2], tt::per_element());
      // Against the double-precision sum, within the bound any float32 summation order keeps
      // (Higham, Accuracy and Stability of Numerical Algorithms, §3.1): K products and K + 1
      // additions, each rounded once, err <= (K + 1) u sum |a_k b_k| (+ |bias|), u = 2^-24.
      double worst = 0, worst_err = 0;
      size_t at = 0;
      const double gamma = double(K + 1) * std::ldexp(1.0, -24);
      for (int i = 0; i < 3; i++) {
        for (int64_t m = 0; m < M; m++)
          for (int64_t n = 0; n < Ns[i]; n++) {
            double dot = i == 1 ? 0.0 : double(bias[i][n]), mag = std::fabs(dot);
            for (int64_t k = 0; k < K; k++) {
              dot += double(A[m * K + k]) * B[i][n * K + k];
              mag += std::fabs(double(A[m * K + k]) * B[i][n * K + k]);
            }
            const double err = std::fabs(dot - outs[0][at + m * Ns[i] + n]);
            if (err / (gamma * mag) > worst) worst = err / (gamma * mag), worst_err = err;
          }
        at += static_cast<size_t>(M * Ns[i]);
      }
      BOOST_TEST(worst <= 1.0, "max |kernel - double| " << worst_err << ", " << worst << " of the float32 bound");
      if (M > 16) {  // one sgemm per product, bias added after: what linear() computes
        size_t off = 0;
        for (int i = 0; i < 3; i++) {
          Tensor C = Tensor::zeros({M, Ns[i]});
          kern::sgemm(false, true, M, Ns[i], K, 1.f, A.data(), K, B[i].data(), K, 0.f, C.data(), Ns[i]);
          std::vector<float> want = C.to_vector();
          if (i != 1)
            for (int64_t m = 0; m < M; m++)
              for (int64_t n = 0; n < Ns[i]; n++) want[m * Ns[i] + n] += bias[i][n];
          const std::vector<float> got(outs[0].begin() + off, outs[0].begin() + off + want.size());
          BOOST_TEST(got == want, tt::per_element());
          off += want.size();
        }
      }
    }
  }
  set_num_threads(before);
}

// ---- how idle OpenMP threads wait (autograd/omp_wait.h) -----------------------------------------

// The count is the target time over one spin's cost, rounded, within bounds: 20 us at 18.8 ns per
// spin (a Zen 5 core) is 20000 / 18.8 = 1063.8 -> 1064; at 45 ns (an Intel core's long pause)
// 444.4 -> 444; at 3 ns 6666.7 -> 6667; a cost that makes it exceed the bounds is clamped, and an
// unmeasurable cost gives 1000.
BOOST_AUTO_TEST_CASE(the_spin_count_is_the_spin_time_over_one_pauses_cost) {
  BOOST_TEST(spin_count_for(20.0, 18.8) == 1064);
  BOOST_TEST(spin_count_for(20.0, 45.0) == 444);
  BOOST_TEST(spin_count_for(20.0, 3.0) == 6667);
  BOOST_TEST(spin_count_for(20.0, 1000.0) == 100);
  BOOST_TEST(spin_count_for(20.0, 1e-6) == 1000000);
  BOOST_TEST(spin_count_for(20.0, 0.0) == 1000);
  BOOST_TEST(spin_count_for(20.0, NAN) == 1000);
}

// When the tasks running at start-up and tapelm's threads do not fit the cpus, or its threads
// alone outnumber them, a waiting thread sleeps at once (count 0); with room for all (an unread
// /proc/stat, -1, counting as no other task) it spins the measured count (1064 at 18.8 ns a
// spin, as above). Bound to some of the machine's cpus, it counts the tasks' share on them.
BOOST_AUTO_TEST_CASE(beside_other_running_tasks_threads_sleep_at_once) {
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 0, 2, 2, 2) == 1064);
  BOOST_TEST(spin_count_for_load(20.0, 18.8, -1, 2, 2, 2) == 1064);
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 1, 2, 2, 2) == 0);
  BOOST_TEST(spin_count_for_load(20.0, 45.0, 7, 2, 2, 2) == 0);
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 1, 1, 2, 2) == 1064);    // one thread beside one task: 2 of 2
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 56, 8, 64, 64) == 1064);  // 64 of 64
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 57, 8, 64, 64) == 0);     // 65 of 64
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 0, 3, 2, 2) == 0);        // its own 3 threads on 2
  BOOST_TEST(spin_count_for_load(20.0, 18.8, -1, 3, 2, 2) == 0);
  // bound to 4 of 64 cpus: 1 task elsewhere is 4/64 = 0.06 of one on them (none), 10 are 0.63 (1),
  // 8 are 0.5 (rounded away from zero: 1)
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 1, 4, 4, 64) == 1064);
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 7, 4, 4, 64) == 1064);
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 10, 4, 4, 64) == 0);
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 8, 4, 4, 64) == 0);
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 8, 3, 4, 64) == 1064);  // 1 + 3 of 4
}

// The threads a command line asks for, as main's `--threads` reads them, more than the cpus too;
// all cpus otherwise.
BOOST_AUTO_TEST_CASE(the_planned_thread_count_is_read_from_the_command_line) {
  auto planned = [](std::vector<std::string> args, int cpus) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    return planned_threads(argv.data(), cpus);
  };
  BOOST_TEST(planned({"tapelm", "--threads", "1", "train"}, 8) == 1);
  BOOST_TEST(planned({"tapelm", "--threads=3", "train"}, 8) == 3);
  BOOST_TEST(planned({"tapelm", "--threads", "0", "train"}, 8) == 8);
  BOOST_TEST(planned({"tapelm", "--threads", "99", "train"}, 8) == 99);  // tapelm runs 99
  BOOST_TEST(planned({"tapelm", "train", "--config", "c.json"}, 8) == 8);
  BOOST_TEST(planned({"tapelm", "--threads"}, 8) == 8);
}

namespace {
// The first cpu this process may use, and that cpu alone set as the mask of a new thread: the
// thread's count of usable cpus, or -1 when the call is refused (some sandboxes refuse it).
int first_usable_cpu() {
  cpu_set_t all;
  CPU_ZERO(&all);
  if (sched_getaffinity(0, sizeof all, &all) != 0) return 0;
  int first = 0;
  while (first < CPU_SETSIZE - 1 && !CPU_ISSET(first, &all)) first++;
  return first;
}
int usable_cpus_on_one_cpu() {
  int bound = -1;
  std::thread t([&] {  // a thread of its own, so the caller keeps its mask
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first_usable_cpu(), &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) bound = usable_cpus();
  });
  t.join();
  return bound;
}
test::Precondition affinity_can_be_set(boost::unit_test::test_unit_id) {
  test::Precondition r(usable_cpus_on_one_cpu() != -1);
  if (!r) r.message() << "sched_setaffinity is refused here: no thread can be bound to one cpu";
  return r;
}
test::Precondition taskset_runs(boost::unit_test::test_unit_id) {
  test::Precondition r(std::system(("taskset -c " + std::to_string(first_usable_cpu()) + " true >/dev/null 2>&1").c_str()) == 0);
  if (!r) r.message() << "taskset (util-linux) is missing or refused here: no program can be started bound to one cpu";
  return r;
}
}  // namespace

// The cpus counted are the ones this thread may use, not the machine's: a thread bound to one cpu
// (as `taskset -c N` binds a program) counts 1, so `--threads 2` there does not fit and sleeps at
// once, where the machine's count would have let its threads spin on their shared core.
BOOST_AUTO_TEST_CASE(the_cpus_counted_are_the_ones_the_affinity_allows) {
  cpu_set_t all;
  CPU_ZERO(&all);
  BOOST_REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
  BOOST_TEST(usable_cpus() == CPU_COUNT(&all));
}

BOOST_AUTO_TEST_CASE(a_thread_bound_to_one_cpu_counts_one, *boost::unit_test::precondition(affinity_can_be_set)) {
  cpu_set_t all;
  CPU_ZERO(&all);
  BOOST_REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
  const int bound = usable_cpus_on_one_cpu();
  BOOST_TEST(bound == 1);
  BOOST_TEST(spin_count_for_load(20.0, 18.8, 0, 2, bound, CPU_COUNT(&all)) == 0);
}

// and the program, started bound to that cpu with two threads (a child inherits the mask)
BOOST_AUTO_TEST_CASE(two_threads_started_on_one_cpu_sleep_at_once, *boost::unit_test::precondition(taskset_runs)) {
  const Run r = run_cli("--threads 2 inspect --system",
                        "env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u TAPELM_GOMP_SPINCOUNT taskset -c " +
                            std::to_string(first_usable_cpu()) + " ");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST(contains(r.out, "openmp wait sleep at once (its threads and the programs running at start-up outnumber its cpus)"),
             r.out);
}

// The load tapelm reads at start-up: a thread of this process spinning through all the readings
// (200 ms) is a running task other than the reader, so at least one is counted; and so the program
// started beside it chooses to sleep at once, and says so.
BOOST_AUTO_TEST_CASE(a_busy_thread_counts_as_a_running_task_at_start_up) {
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    volatile unsigned long x = 0;
    while (!stop.load(std::memory_order_relaxed)) x = x + 1;
  });
  const int seen = others_running_at_start();
  const Run r = run_cli("inspect --system", "env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u TAPELM_GOMP_SPINCOUNT ");
  stop = true;
  busy.join();
  if (seen == -1) {
    BOOST_TEST_MESSAGE("/proc/stat has no procs_running line: the load cannot be read here");
    return;
  }
  BOOST_TEST(seen >= 1);
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  BOOST_TEST(contains(r.out, "openmp wait sleep at once (its threads and the programs running at start-up outnumber its cpus): GOMP_SPINCOUNT=0 set by tapelm"),
             r.out);
}

// What the start-up guard chose is what libgomp runs: after a parallel region the idle thread
// spins about 20 us and then sleeps, so while the main thread sleeps 50 ms the process uses almost
// no CPU. Under libgomp's own default (300,000 pauses: 5.6 ms on a Zen 5 core, over 10 ms on an
// Intel core with a 45 ns pause) the idle thread would burn milliseconds of that time.
BOOST_AUTO_TEST_CASE(idle_openmp_threads_sleep_after_the_spin_tapelm_chose,
                     *boost::unit_test::precondition(tapelm_chose_the_wait_policy)) {
  BOOST_TEST(contains(omp_wait_description(), "set by tapelm"), omp_wait_description());
  ThreadCount two(2);
  const int64_t n = 1 << 16;
  std::vector<float> a(n), b(n, 1.f), c(n, 2.f);
  auto cpu_s = [] {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  double least = 1e9;
  for (int r = 0; r < 3; r++) {  // the least of three: another process may delay a wake-up
    kern::triad(a.data(), b.data(), c.data(), 0.5f, n);  // wakes the team
    const double c0 = cpu_s();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    least = std::min(least, cpu_s() - c0);
  }
  BOOST_TEST(least < 0.002, "the process used " << least * 1e3 << " ms of CPU while its main thread slept 50 ms");
}

// The CLI reports the policy in force: tapelm's when the user set none, the user's otherwise.
BOOST_AUTO_TEST_CASE(inspect_says_how_openmp_threads_wait) {
  const Run mine = run_cli("inspect --system", "env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u TAPELM_GOMP_SPINCOUNT ");
  BOOST_REQUIRE_MESSAGE(mine.code == 0, mine.err);
  // spinning on a quiet machine, sleeping at once when another test ran beside this one
  const bool spins = contains(mine.out, "openmp wait spin ") && contains(mine.out, "then sleep: GOMP_SPINCOUNT set by tapelm");
  const bool sleeps = contains(mine.out, "openmp wait sleep at once (its threads and the programs running at start-up outnumber its cpus): GOMP_SPINCOUNT=0 set by tapelm");
  BOOST_TEST((spins || sleeps), mine.out);
  const Run passive = run_cli("inspect --system", "env -u GOMP_SPINCOUNT -u TAPELM_GOMP_SPINCOUNT OMP_WAIT_POLICY=passive ");
  BOOST_REQUIRE_MESSAGE(passive.code == 0, passive.err);
  BOOST_TEST(contains(passive.out, "openmp wait as the environment sets it: OMP_WAIT_POLICY=passive\n"), passive.out);
  const Run count = run_cli("inspect --system", "env -u OMP_WAIT_POLICY -u TAPELM_GOMP_SPINCOUNT GOMP_SPINCOUNT=5000 ");
  BOOST_REQUIRE_MESSAGE(count.code == 0, count.err);
  BOOST_TEST(contains(count.out, "openmp wait as the environment sets it: GOMP_SPINCOUNT=5000\n"), count.out);
}

// ---- the instruction sets a binary was built for (autograd/isa.h) -------------------------------

// Our reading of cpuid against the flags the Linux kernel reports for the same CPU, extension by
// extension. LZCNT is left out: the kernel shows it as "abm", and some virtual machines' kernels do
// not show it although cpuid reports it (as on the AMD EPYC VM this was written on, where GCC's
// -march=native, which reads cpuid, uses it).
BOOST_AUTO_TEST_CASE(the_cpus_extensions_agree_with_the_kernels_flags, *boost::unit_test::precondition(kernel_reports_flags)) {
  const std::set<std::string> f = proc_cpu_flags();
  const uint64_t cpu = isa_cpu();
  for (uint64_t bit = 1; bit <= kAvxvnni; bit <<= 1) {
    if (bit == kLzcnt) continue;
    const std::string name = isa_names(bit);
    BOOST_TEST(((cpu & bit) != 0) == (f.count(name) > 0), name);
  }
  // This binary runs here, so everything it was built for is here.
  BOOST_TEST((isa_built() & ~cpu) == 0u, isa_names(isa_built() & ~cpu));
}

BOOST_AUTO_TEST_CASE(a_binary_built_for_another_cpu_is_refused_in_one_line) {
  BOOST_TEST(isa_mismatch_message(kAvx2 | kFma, kAvx2 | kFma | kAvx512f).empty());
  BOOST_TEST(isa_mismatch_message(0, kAvx2).empty());
  // An AVX-512 build (as -march=native makes on Zen 4/5 or a Xeon) on an AVX2 CPU.
  const std::string m = isa_mismatch_message(kAvx | kAvx2 | kFma | kAvx512f | kAvx512bw, kAvx | kAvx2 | kFma);
  BOOST_TEST(contains(m, "avx512f avx512bw"), m);
  BOOST_TEST(!contains(m, "avx2"), m);
  BOOST_TEST(contains(m, "no AVX-512 here"), m);
  BOOST_TEST(contains(m, "bash scripts/build.sh"), m);
  BOOST_TEST(contains(m, "-DTAPELM_ARCH=x86-64-v3"), m);
  BOOST_TEST(m.find('\n') == std::string::npos, m);
  // A CPU without AVX2 is not sent to an AVX2 build.
  const std::string old = isa_mismatch_message(kAvx | kAvx2 | kFma, kAvx);
  BOOST_TEST(contains(old, "avx2 fma"), old);
  BOOST_TEST(!contains(old, "x86-64-v3"), old);
  BOOST_TEST(!contains(old, "AVX-512"), old);
}

BOOST_AUTO_TEST_CASE(inspect_says_what_the_binary_was_compiled_for) {
  const Run r = run_cli("inspect --system");
  BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
  const std::string want = "compiled for " + (isa_built() ? isa_names(isa_built()) : std::string("the x86-64 baseline"));
  BOOST_TEST(contains(r.out, want), r.out);
  // and whether bf16 products run here: the reason they cannot, or their measured rate
  const std::string missing = kern::bf16_gemm_native_missing();
  if (!missing.empty()) {
    BOOST_TEST(contains(r.out, "bf16 peak unavailable: precision bf16: " + missing), r.out);
  } else {
    const size_t at = r.out.find("bf16 peak ");
    BOOST_REQUIRE_MESSAGE(at != std::string::npos, r.out);
    BOOST_TEST(std::stod(r.out.substr(at + 10)) > 0, r.out);
    BOOST_TEST(contains(r.out, "x sgemm)"), r.out);
  }
}

// End to end on a CPU without this build's extensions: QEMU's user-mode emulation of a Haswell
// (AVX2, FMA, BMI, no AVX-512: an independent cpuid) runs the real binary. A build that uses
// anything beyond Haswell's set must stop before any of its code, in one line naming exactly what
// is missing; a build within it must run. (Without the check, QEMU reports SIGILL for a
// -march=native build made on an AVX-512 machine.)
BOOST_AUTO_TEST_CASE(a_binary_run_on_a_cpu_without_its_extensions_stops_in_one_line,
                     *boost::unit_test::precondition(qemu_can_run_the_binary)) {
  const uint64_t haswell = kSse42 | kPopcnt | kAvx | kAvx2 | kFma | kF16c | kBmi | kBmi2 | kLzcnt | kMovbe;
  const uint64_t beyond = isa_built() & ~haswell;
  const Run r = run_shell("qemu-x86_64 -cpu Haswell " + std::string(TAPELM_BINARY) + " --help 2>&1 | grep -v 'TCG doesn'");
  if (beyond == 0) {
    BOOST_TEST(contains(r.out, "Usage"), r.out);
    return;
  }
  BOOST_TEST(contains(r.out, "tapelm: this binary was compiled for a CPU with " + isa_names(beyond) + " ("), r.out);
  BOOST_TEST(std::count(r.out.begin(), r.out.end(), '\n') == 1, r.out);
  BOOST_TEST(!contains(r.out, "Illegal instruction"), r.out);
  const Run code = run_shell("qemu-x86_64 -cpu Haswell " + std::string(TAPELM_BINARY) + " --help");
  BOOST_TEST(code.code == 1);
}

BOOST_AUTO_TEST_SUITE_END()
