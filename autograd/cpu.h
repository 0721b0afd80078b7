#pragma once
// What the CPU can do, read from cpuid (not from the BLAS library's opinion of it), and the
// guard that keeps OpenBLAS from running fallback kernels on a CPU that has better ones.
//
// Debian's OpenBLAS 0.3.21 picks its kernels at load time from the CPU model number. A model it
// does not know (a Xeon newer than the library) gets its `Prescott` SSE3 kernels, a fifth of the
// speed, and nothing says so. OpenBLAS reads OPENBLAS_CORETYPE only while it loads, so the guard
// re-executes the program once (same pid, same arguments, same environment plus that variable)
// before anything else runs; under mpirun every rank does so before MPI_Init. See
// docs/guide/blas.md.
#include <cstdint>
#include <string>

namespace tapelm {

struct CpuInfo {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // cpuid's brand string, trimmed
  int family = 0, model = 0;
  // Instruction sets the CPU has and the OS saves the registers of (xgetbv).
  bool sse3 = false, avx = false, fma = false, avx2 = false;
  bool avx512f = false, avx512dq = false, avx512cd = false, avx512bw = false, avx512vl = false;
  bool avx512bf16 = false;
};

/// This CPU (cpuid and xgetbv; read once). On a non-x86 build every feature is false.
const CpuInfo& cpu_info();

/// "AVX-512 BF16", "AVX-512", "AVX2+FMA", "AVX", "SSE3": the best of the levels below it has.
std::string cpu_simd_level(const CpuInfo& cpu);

/// The newest OpenBLAS x86 kernel set the CPU can run, named as OPENBLAS_CORETYPE takes it:
/// Cooperlake (AVX-512 BF16), SkylakeX (AVX-512 F/CD/DQ/BW/VL), Haswell (AVX2+FMA),
/// Sandybridge (AVX), or "" when it has none of these.
std::string best_blas_core(const CpuInfo& cpu);

/// The instruction-set level of an OpenBLAS core name (case-insensitive): 0 SSE-era kernels
/// (Prescott, Core2, Nehalem, Atom, Opteron, ...), 1 AVX (Sandybridge, Bulldozer family),
/// 2 AVX2 (Haswell, Zen), 3 AVX-512 (SkylakeX), 4 AVX-512 BF16 (Cooperlake, SapphireRapids);
/// -1 for a name OpenBLAS does not have.
int blas_core_level(const std::string& name);

/// The canonical spelling of a core name ("cooperlake" -> "Cooperlake"), or "" if unknown.
std::string canonical_blas_core(const std::string& name);

/// What the guard does at start-up.
struct BlasCoreDecision {
  enum Action { keep, reexec, error } action = keep;
  std::string core;     // reexec: the OPENBLAS_CORETYPE to set
  std::string message;  // one line for stderr ("" when there is nothing to say)
};

/// The guard's decision, a pure function of its inputs (tested on its own):
///   chosen         the core OpenBLAS runs (openblas_get_corename())
///   openblas_env   OPENBLAS_CORETYPE as the user set it (nullptr: unset)
///   tapelm_env     TAPELM_BLAS_CORE (nullptr or "": auto)
///   reexec_from    the core before our re-execution (nullptr: this is the first start)
/// TAPELM_BLAS_CORE=auto (the default) re-executes with the best core when OpenBLAS chose an
/// older one, unless the user set OPENBLAS_CORETYPE themselves (then it only warns; an explicit
/// TAPELM_BLAS_CORE=auto overrides it); `keep` never re-executes and warns; a core NAME is
/// forced, and is an error when the CPU cannot run it or OpenBLAS has no such core.
BlasCoreDecision decide_blas_core(const std::string& chosen, const CpuInfo& cpu, const char* openblas_env,
                                  const char* tapelm_env, const char* reexec_from);

/// Applies the decision at the top of main(): may re-execute the program (never returns then),
/// prints the message, and throws a usage Error for a core the CPU cannot run. The same single
/// re-execution also sets GOMP_SPINCOUNT when the user set no OpenMP wait policy
/// (autograd/omp_wait.h).
void guard_blas_core(char** argv);

/// The OpenBLAS core in use and how it was chosen, e.g. "Cooperlake (chosen by OpenBLAS)",
/// "Cooperlake (OPENBLAS_CORETYPE, set by tapelm: OpenBLAS chose Prescott)".
std::string blas_core_description();

/// The CPU's theoretical single-precision peak at `threads` cores:
/// cores x FMA units x vector lanes x 2 x clock. The clock is measured (a chain of dependent
/// one-cycle adds timed in CPU time on every thread at once, so boost clocks count and other
/// processes do not); units and lanes come from the vendor and family (see cpu.cpp).
struct CpuPeak {
  int cores = 0;
  int fma_units = 0;
  int lanes = 0;  // fp32 lanes per FMA unit and cycle
  double clock_hz = 0;
  double flops = 0;
  std::string basis;  // how units and lanes were decided, for printing
};
CpuPeak cpu_peak_flops(int threads);

}  // namespace tapelm
