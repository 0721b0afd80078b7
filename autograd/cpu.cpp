#include "autograd/cpu.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TAPELM_X86 1
#endif

#include "autograd/error.h"
#include "autograd/kernels/blas.h"
#include "autograd/isa.h"
#include "autograd/omp_wait.h"

namespace tapelm {

namespace {

#ifdef TAPELM_X86
uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuInfo read_cpu() {
  CpuInfo c;
  unsigned a, b, cx, d;
  if (!__get_cpuid(0, &a, &b, &cx, &d)) return c;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &cx, 4);
  c.vendor = vendor;
  __get_cpuid(1, &a, &b, &cx, &d);
  const unsigned base_family = (a >> 8) & 0xf, ext_family = (a >> 20) & 0xff;
  const unsigned base_model = (a >> 4) & 0xf, ext_model = (a >> 16) & 0xf;
  c.family = static_cast<int>(base_family == 0xf ? base_family + ext_family : base_family);
  c.model = static_cast<int>((base_family == 0x6 || base_family == 0xf) ? (ext_model << 4) | base_model : base_model);
  c.sse3 = cx & (1u << 0);
  const bool osxsave = cx & (1u << 27);
  const bool has_avx = cx & (1u << 28), has_fma = cx & (1u << 12);
  // The OS must save the wider registers on a context switch, or using them faults.
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
  const bool os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM0-15 upper halves, ZMM16-31
  c.avx = has_avx && os_ymm;
  c.fma = has_fma && c.avx;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, cx, d);
    c.avx2 = c.avx && (b & (1u << 5));
    c.avx512f = os_zmm && (b & (1u << 16));
    c.avx512dq = c.avx512f && (b & (1u << 17));
    c.avx512cd = c.avx512f && (b & (1u << 28));
    c.avx512bw = c.avx512f && (b & (1u << 30));
    c.avx512vl = c.avx512f && (b & (1u << 31));
    const unsigned sub_leaves = a;
    if (sub_leaves >= 1) {
      __cpuid_count(7, 1, a, b, cx, d);
      c.avx512bf16 = c.avx512f && (a & (1u << 5));
    }
  }
  if (__get_cpuid(0x80000000, &a, &b, &cx, &d) && a >= 0x80000004) {
    unsigned regs[12];
    for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char brand[49] = {};
    std::memcpy(brand, regs, 48);
    std::string s = brand;
    s.erase(0, s.find_first_not_of(' '));
    s.erase(s.find_last_not_of(' ') + 1);
    c.brand = s;
  }
  return c;
}
#else
CpuInfo read_cpu() { return CpuInfo{}; }
#endif

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

struct CoreName {
  const char* name;
  int level;
};
// OpenBLAS's x86-64 DYNAMIC_ARCH core names (OPENBLAS_CORETYPE spellings) and the instruction
// set their kernels need.
constexpr CoreName kCores[] = {
    {"Katmai", 0},      {"Coppermine", 0},  {"Northwood", 0},   {"Prescott", 0},   {"Banias", 0},
    {"Atom", 0},        {"Core2", 0},       {"Penryn", 0},      {"Dunnington", 0}, {"Nehalem", 0},
    {"Opteron", 0},     {"Opteron_SSE3", 0}, {"Barcelona", 0},  {"Nano", 0},       {"Bobcat", 0},
    {"Sandybridge", 1}, {"Bulldozer", 1},   {"Piledriver", 1},  {"Steamroller", 1}, {"Excavator", 1},
    {"Haswell", 2},     {"Zen", 2},         {"SkylakeX", 3},    {"Cooperlake", 4}, {"SapphireRapids", 4},
};

/// The features a core's kernels execute, checked before forcing it.
bool cpu_runs(const CpuInfo& c, int level) {
  switch (level) {
    case 0: return true;
    case 1: return c.avx;
    case 2: return c.avx2 && c.fma;
    case 3: return c.avx512f && c.avx512dq && c.avx512cd && c.avx512bw && c.avx512vl;
    case 4: return cpu_runs(c, 3) && c.avx512bf16;
    default: return false;
  }
}

const char* level_name(int level) {
  static const char* names[] = {"SSE3", "AVX", "AVX2+FMA", "AVX-512", "AVX-512 BF16"};
  return level >= 0 && level <= 4 ? names[level] : "unknown";
}

int cpu_level(const CpuInfo& c) {
  for (int l = 4; l >= 1; l--)
    if (cpu_runs(c, l)) return l;
  return 0;
}

constexpr const char* kReexecVar = "TAPELM_BLAS_CORE_REEXEC_FROM";
/// The core OpenBLAS chose before guard_blas_core re-executed this process ("" if it did not).
std::string& reexec_from() {
  static std::string from;
  return from;
}

/// Seconds of CPU time this thread has used.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/// This thread's clock: a chain of dependent one-cycle integer adds, timed in CPU time so that
/// other processes taking the core do not count. Best of three. The adds take a register, not an
/// immediate: Intel's Golden Cove cores (Alder Lake, Sapphire and Emerald Rapids) fold chains of
/// immediate adds at renaming, and such a chain ran at 7-8 "GHz" on a 2.9 GHz Emerald Rapids.
double measure_thread_clock() {
  constexpr uint64_t kAdds = 5'000'000;  // x 8 per loop: 40M cycles, about 12 ms at 3.5 GHz
#ifdef TAPELM_X86
  double best = 0;
  for (int r = 0; r < 3; r++) {
    uint64_t x = 0, n = kAdds;
    const uint64_t one = 1;
    const double t0 = thread_cpu_seconds();
    __asm__ volatile(
        "1:\n\t"
        "add %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\t"
        "add %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\t"
        "dec %1\n\tjnz 1b\n\t"
        : "+r"(x), "+r"(n)
        : "r"(one)
        : "cc");
    const double t = thread_cpu_seconds() - t0;
    if (t > 0) best = std::max(best, 8.0 * kAdds / t);
  }
  return best;
#else
  return 0;
#endif
}

}  // namespace

const CpuInfo& cpu_info() {
  static const CpuInfo info = read_cpu();
  return info;
}

std::string cpu_simd_level(const CpuInfo& cpu) { return level_name(cpu_level(cpu)); }

std::string best_blas_core(const CpuInfo& cpu) {
  switch (cpu_level(cpu)) {
    case 4: return "Cooperlake";
    case 3: return "SkylakeX";
    case 2: return "Haswell";
    case 1: return "Sandybridge";
    default: return "";
  }
}

int blas_core_level(const std::string& name) {
  const std::string n = lower(name);
  for (const auto& c : kCores)
    if (lower(c.name) == n) return c.level;
  return -1;
}

std::string canonical_blas_core(const std::string& name) {
  const std::string n = lower(name);
  for (const auto& c : kCores)
    if (lower(c.name) == n) return c.name;
  return "";
}

namespace {
// An environment value as messages show it: control bytes as '?', and a long value (none of the
// meaningful ones is over 20 characters) cut to its first 32, with its length.
std::string env_shown(const char* v) {
  std::string s = v ? v : "";
  const size_t n = s.size();
  if (n > 64) s = s.substr(0, 32);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return n > 64 ? s + "... (" + std::to_string(n) + " characters)" : s;
}
}  // namespace

BlasCoreDecision decide_blas_core(const std::string& chosen, const CpuInfo& cpu, const char* openblas_env_raw,
                                  const char* tapelm_env, const char* reexec_from_raw) {
  BlasCoreDecision d;
  const std::string mode = env_shown(tapelm_env), openblas_shown = env_shown(openblas_env_raw),
                    reexec_shown = env_shown(reexec_from_raw);
  const char* openblas_env = openblas_env_raw ? openblas_shown.c_str() : nullptr;
  const char* reexec_from = reexec_from_raw ? reexec_shown.c_str() : nullptr;
  const std::string best = best_blas_core(cpu);
  const int have = cpu_level(cpu), chosen_level = blas_core_level(chosen);
  const std::string supports = "this CPU supports " + std::string(level_name(have)) +
                               (best.empty() ? "" : " (OpenBLAS core " + best + ")");
  if (reexec_from && *reexec_from) {  // second start: report what happened, never loop
    const bool forced = !mode.empty() && lower(mode) != "auto" && lower(mode) != "keep";
    if (lower(chosen) == lower(reexec_from)) {
      d.message = "tapelm: OpenBLAS kept its " + chosen + " kernels although OPENBLAS_CORETYPE=" +
                  (openblas_env ? openblas_env : "") + " was set; continuing with " + chosen;
    } else if (forced) {
      d.message = "tapelm: running OpenBLAS's " + chosen + " kernels as TAPELM_BLAS_CORE=" + mode +
                  " asks (OpenBLAS had chosen " + reexec_from + ")";
    } else {
      d.message = "tapelm: OpenBLAS had chosen its " + std::string(reexec_from) + " kernels; " + supports +
                  ": running with OPENBLAS_CORETYPE=" + chosen + " (TAPELM_BLAS_CORE=keep keeps " +
                  reexec_from + ")";
    }
    return d;
  }
  if (mode.empty() || lower(mode) == "auto") {
    const bool user_forced = openblas_env && *openblas_env && mode.empty();
    if (best.empty() || chosen_level < 0 || chosen_level >= have) return d;  // nothing better to run
    if (user_forced) {
      d.message = "tapelm: warning: OpenBLAS runs its " + chosen + " kernels as OPENBLAS_CORETYPE=" +
                  std::string(openblas_env) + " asks, but " + supports +
                  "; unset OPENBLAS_CORETYPE or set TAPELM_BLAS_CORE=auto";
      return d;
    }
    d.action = BlasCoreDecision::reexec;
    d.core = best;
    return d;
  }
  if (lower(mode) == "keep") {
    if (!best.empty() && chosen_level >= 0 && chosen_level < have)
      d.message = "tapelm: warning: OpenBLAS runs its " + chosen + " kernels (TAPELM_BLAS_CORE=keep), but " +
                  supports;
    return d;
  }
  const std::string want = canonical_blas_core(mode);
  if (want.empty()) {
    d.action = BlasCoreDecision::error;
    d.message = "TAPELM_BLAS_CORE=" + mode +
                ": not an OpenBLAS core (auto, keep, or a name such as Cooperlake, SkylakeX, Haswell, Prescott)";
    return d;
  }
  if (!cpu_runs(cpu, blas_core_level(want))) {
    d.action = BlasCoreDecision::error;
    d.message = "TAPELM_BLAS_CORE=" + mode + ": the " + want + " kernels need " +
                level_name(blas_core_level(want)) + ", which this CPU does not have (" + supports + ")";
    return d;
  }
  if (lower(chosen) != lower(want)) {
    d.action = BlasCoreDecision::reexec;
    d.core = want;
  }
  return d;
}

namespace {
// Re-executes this program with the arguments it was started with: /proc/self/cmdline holds them
// as given, where a caller's argv may already have been edited (Boost.Test removes the options it
// consumed from its argv); argv is the fallback. Returns only if exec failed.
void exec_self(char** argv) {
  std::vector<std::string> args;
  if (FILE* f = std::fopen("/proc/self/cmdline", "rb")) {
    std::string cur;
    for (int ch; (ch = std::fgetc(f)) != EOF;) {
      if (ch == 0) args.push_back(std::move(cur)), cur.clear();
      else cur.push_back(static_cast<char>(ch));
    }
    std::fclose(f);
  }
  std::vector<char*> ptrs;
  for (auto& a : args) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  ::execv("/proc/self/exe", args.empty() ? argv : ptrs.data());
}
}  // namespace

void guard_blas_core(char** argv) {
  // The instruction-set check (autograd/isa.cpp) ran before any constructor of ours; naming it
  // here, where every program starts, links it into each of them.
  (void)isa_cpu();
  const char* from = std::getenv(kReexecVar);
  const std::string chosen = kern::blas_core_name();
  const BlasCoreDecision d =
      decide_blas_core(chosen, cpu_info(), std::getenv("OPENBLAS_CORETYPE"), std::getenv("TAPELM_BLAS_CORE"), from);
  // This is the second start: remember what OpenBLAS first chose (blas_core_description says it)
  // and drop the variable, which the programs this one starts (the tests' tapelm runs, a sweep's
  // stages) would otherwise inherit and take for their own second start, printing its notice.
  if (from) {
    reexec_from() = from;
    ::unsetenv(kReexecVar);
  }
  if (d.action == BlasCoreDecision::error) throw Error(ErrorKind::usage, d.message);
  // OpenBLAS and libgomp both read their variables only while they load: one re-execution sets
  // whatever either needs.
  const std::string spin = omp_spin_to_set(argv);
  if (d.action == BlasCoreDecision::reexec || !spin.empty()) {
    if (d.action == BlasCoreDecision::reexec) {
      ::setenv("OPENBLAS_CORETYPE", d.core.c_str(), 1);
      ::setenv(kReexecVar, chosen.c_str(), 1);
    }
    if (!spin.empty()) {
      ::setenv("GOMP_SPINCOUNT", spin.c_str(), 1);
      ::setenv(kSpinSetVar, spin.c_str(), 1);
    }
    std::fflush(nullptr);
    exec_self(argv);
    // Could not re-execute (no /proc): run on, and say what it costs.
    const int err = errno;
    if (!spin.empty()) {
      ::unsetenv("GOMP_SPINCOUNT");
      ::unsetenv(kSpinSetVar);
    }
    if (d.action == BlasCoreDecision::reexec) {
      std::fprintf(stderr, "tapelm: warning: could not re-execute with OPENBLAS_CORETYPE=%s (%s); OpenBLAS runs its %s kernels\n",
                   d.core.c_str(), std::strerror(err), chosen.c_str());
      ::unsetenv(kReexecVar);
    }
    return;
  }
  // Under mpirun every rank decides the same; one of them speaks.
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!d.message.empty() && (!rank || std::string(rank) == "0")) std::fprintf(stderr, "%s\n", d.message.c_str());
}

std::string blas_core_description() {
  const std::string core = kern::blas_core_name();
  const std::string& from = reexec_from();
  if (!from.empty() && lower(from) != lower(core))
    return core + " (OPENBLAS_CORETYPE, set by tapelm: OpenBLAS chose " + from + ")";
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env && *env) return core + " (OPENBLAS_CORETYPE=" + env + ")";
  return core + " (chosen by OpenBLAS)";
}

CpuPeak cpu_peak_flops(int threads) {
  CpuPeak p;
  p.cores = std::max(1, threads);
  const CpuInfo& c = cpu_info();
  // FMA units and fp32 lanes per unit. cpuid does not tell how many FMA pipes a core has, so
  // this follows the vendors' documentation per family:
  //  - AMD Zen 4 (family 0x19 with AVX-512) runs 512-bit operations on two 256-bit FMA pipes;
  //    Zen 2/3 have two 256-bit pipes, Zen 1 (family 0x17, model < 0x30) two 128-bit ones;
  //    Zen 5 (family 0x1a) two 512-bit pipes.
  //  - Intel server cores with AVX-512 (Skylake-SP and later Xeons): two 512-bit FMA units
  //    (some Silver/Bronze parts have one: set TAPELM_FMA_UNITS=1); AVX2 cores two 256-bit units.
  //  - AVX without FMA (Sandy Bridge, Bulldozer): one 256-bit multiply and one add per cycle,
  //    counted as one fused unit of 8 lanes x 2; older: 4 lanes.
  if (c.vendor == "AuthenticAMD" && c.family == 0x17) {
    p.fma_units = 2, p.lanes = c.model < 0x30 ? 4 : 8, p.basis = "AMD Zen/Zen 2: 2 FMA pipes";
  } else if (c.vendor == "AuthenticAMD" && c.family == 0x19) {
    p.fma_units = 2, p.lanes = 8, p.basis = "AMD Zen 3/4: 2 x 256-bit FMA pipes";
  } else if (c.vendor == "AuthenticAMD" && c.family >= 0x1a) {
    p.fma_units = 2, p.lanes = c.avx512f ? 16 : 8, p.basis = "AMD Zen 5: 2 FMA pipes";
  } else if (c.avx512f) {
    p.fma_units = 2, p.lanes = 16, p.basis = "AVX-512: 2 x 512-bit FMA units";
  } else if (c.fma) {
    p.fma_units = 2, p.lanes = 8, p.basis = "AVX2: 2 x 256-bit FMA units";
  } else if (c.avx) {
    p.fma_units = 1, p.lanes = 8, p.basis = "AVX: 256-bit multiply + add";
  } else {
    p.fma_units = 1, p.lanes = 4, p.basis = "SSE: 128-bit multiply + add";
  }
  if (const char* u = std::getenv("TAPELM_FMA_UNITS"); u && std::atoi(u) > 0) {
    p.fma_units = std::atoi(u);
    p.basis += " (TAPELM_FMA_UNITS=" + std::to_string(p.fma_units) + ")";
  }
  // Every core at once, as a training step runs them: all-core boost is lower than one core's.
  std::vector<double> hz(p.cores);
  std::vector<std::thread> pool;
  for (int t = 0; t < p.cores; t++) pool.emplace_back([&hz, t] { hz[t] = measure_thread_clock(); });
  for (auto& th : pool) th.join();
  p.clock_hz = *std::min_element(hz.begin(), hz.end());
  p.flops = double(p.cores) * p.fma_units * p.lanes * 2.0 * p.clock_hz;
  return p;
}

}  // namespace tapelm
