#pragma once
// Which instruction-set extensions this binary was compiled to use, which this CPU runs, and the
// start-up check between the two.
//
// tapelm builds with -march=native by default (CMake's TAPELM_ARCH): the compiler may use every
// extension of the build machine anywhere, AVX-512 included. Copied to a CPU without them, such a
// binary dies of SIGILL at some arbitrary instruction. The check runs before any of tapelm's own
// code (a constructor of the highest priority, in a file compiled for the x86-64 baseline, see
// CMakeLists.txt) and ends the program with one line naming the missing extensions and the fix.
#include <cstdint>
#include <string>

namespace tapelm {

/// One bit per extension (x86-64); the names are the compiler's and /proc/cpuinfo's.
enum IsaBit : uint64_t {
  kSse42 = 1ull << 0, kPopcnt = 1ull << 1, kAvx = 1ull << 2, kAvx2 = 1ull << 3, kFma = 1ull << 4, kF16c = 1ull << 5,
  kBmi = 1ull << 6, kBmi2 = 1ull << 7, kLzcnt = 1ull << 8, kMovbe = 1ull << 9,
  kAvx512f = 1ull << 10, kAvx512cd = 1ull << 11, kAvx512bw = 1ull << 12, kAvx512dq = 1ull << 13,
  kAvx512vl = 1ull << 14, kAvx512bf16 = 1ull << 15, kAvx512vnni = 1ull << 16, kAvx512vbmi = 1ull << 17,
  kAvx512vbmi2 = 1ull << 18, kAvx512ifma = 1ull << 19, kAvx512bitalg = 1ull << 20, kAvx512vpopcntdq = 1ull << 21,
  kGfni = 1ull << 22, kVaes = 1ull << 23, kVpclmulqdq = 1ull << 24, kAvxvnni = 1ull << 25,
};

/// The extensions this binary was compiled to use (from the compiler's predefined macros).
uint64_t isa_built();
/// The -march the build used (CMake's TAPELM_ARCH: "native", "x86-64-v3", ...; "" for none).
const char* isa_built_arch();
/// The extensions this CPU runs and the OS saves the registers of (cpuid, xgetbv).
uint64_t isa_cpu();
/// "avx512f avx512bw": the names of the bits set, in the order above.
std::string isa_names(uint64_t bits);
/// "" when every extension built in is available; otherwise the one-line error the start-up
/// check prints, naming the missing extensions and how to build a binary for this CPU.
std::string isa_mismatch_message(uint64_t built, uint64_t cpu);

}  // namespace tapelm
