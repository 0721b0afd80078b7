// Compiled for the x86-64 baseline whatever the build's -march (CMakeLists.txt), so that the
// start-up check itself runs on any x86-64 CPU.
#include "autograd/isa.h"

#include <unistd.h>

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TAPELM_ISA_X86 1
#endif

namespace tapelm {

extern const uint64_t g_isa_built;  // autograd/isa_built.cpp

namespace {
struct Named {
  uint64_t bit;
  const char* name;
};
constexpr Named kNames[] = {
    {kSse42, "sse4_2"},       {kPopcnt, "popcnt"},       {kAvx, "avx"},
    {kAvx2, "avx2"},          {kFma, "fma"},             {kF16c, "f16c"},
    {kBmi, "bmi1"},           {kBmi2, "bmi2"},           {kLzcnt, "lzcnt"},
    {kMovbe, "movbe"},        {kAvx512f, "avx512f"},     {kAvx512cd, "avx512cd"},
    {kAvx512bw, "avx512bw"},  {kAvx512dq, "avx512dq"},   {kAvx512vl, "avx512vl"},
    {kAvx512bf16, "avx512_bf16"}, {kAvx512vnni, "avx512_vnni"}, {kAvx512vbmi, "avx512vbmi"},
    {kAvx512vbmi2, "avx512_vbmi2"}, {kAvx512ifma, "avx512ifma"}, {kAvx512bitalg, "avx512_bitalg"},
    {kAvx512vpopcntdq, "avx512_vpopcntdq"}, {kGfni, "gfni"}, {kVaes, "vaes"},
    {kVpclmulqdq, "vpclmulqdq"}, {kAvxvnni, "avx_vnni"},
};
constexpr uint64_t kAvx512Any = kAvx512f | kAvx512cd | kAvx512bw | kAvx512dq | kAvx512vl | kAvx512bf16 | kAvx512vnni |
                                kAvx512vbmi | kAvx512vbmi2 | kAvx512ifma | kAvx512bitalg | kAvx512vpopcntdq;

#ifdef TAPELM_ISA_X86
uint64_t read_cpu_isa() {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
  const unsigned max_leaf = a;
  uint64_t r = 0;
  __get_cpuid(1, &a, &b, &c, &d);
  const auto bit = [](unsigned reg, int i) { return ((reg >> i) & 1u) != 0; };
  if (bit(c, 20)) r |= kSse42;
  if (bit(c, 23)) r |= kPopcnt;
  if (bit(c, 22)) r |= kMovbe;
  uint64_t xcr0 = 0;
  if (bit(c, 27)) {  // OSXSAVE: the OS says which register states it saves
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (uint64_t(hi) << 32) | lo;
  }
  const bool ymm = (xcr0 & 0x6) == 0x6, zmm = ymm && (xcr0 & 0xe0) == 0xe0;
  if (ymm && bit(c, 28)) r |= kAvx;
  if (ymm && bit(c, 12)) r |= kFma;
  if (ymm && bit(c, 29)) r |= kF16c;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned sub = a;
    if (bit(b, 3)) r |= kBmi;
    if (bit(b, 8)) r |= kBmi2;
    if (ymm && bit(b, 5)) r |= kAvx2;
    if (ymm && bit(c, 9)) r |= kVaes;
    if (ymm && bit(c, 10)) r |= kVpclmulqdq;
    if (bit(c, 8)) r |= kGfni;
    if (zmm) {
      if (bit(b, 16)) r |= kAvx512f;
      if (bit(b, 17)) r |= kAvx512dq;
      if (bit(b, 21)) r |= kAvx512ifma;
      if (bit(b, 28)) r |= kAvx512cd;
      if (bit(b, 30)) r |= kAvx512bw;
      if (bit(b, 31)) r |= kAvx512vl;
      if (bit(c, 1)) r |= kAvx512vbmi;
      if (bit(c, 6)) r |= kAvx512vbmi2;
      if (bit(c, 11)) r |= kAvx512vnni;
      if (bit(c, 12)) r |= kAvx512bitalg;
      if (bit(c, 14)) r |= kAvx512vpopcntdq;
    }
    if (sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      if (ymm && bit(a, 4)) r |= kAvxvnni;
      if (zmm && bit(a, 5)) r |= kAvx512bf16;
    }
  }
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000001) {
    __get_cpuid(0x80000001, &a, &b, &c, &d);
    if (bit(c, 5)) r |= kLzcnt;
  }
  return r;
}
#endif

// Before any other constructor of the program (101 is the first priority not reserved for the
// implementation): a binary built for another CPU stops here with one line, not with SIGILL later.
__attribute__((constructor(101))) void check_isa_at_start() {
#ifdef TAPELM_ISA_X86
  const std::string msg = isa_mismatch_message(g_isa_built, read_cpu_isa());
  if (msg.empty()) return;
  const std::string line = msg + "\n";
  ssize_t w = ::write(2, line.data(), line.size());
  (void)w;
  ::_exit(1);
#endif
}
}  // namespace

uint64_t isa_built() { return g_isa_built; }

uint64_t isa_cpu() {
#ifdef TAPELM_ISA_X86
  static const uint64_t r = read_cpu_isa();
  return r;
#else
  return 0;
#endif
}

std::string isa_names(uint64_t bits) {
  std::string s;
  for (const Named& n : kNames)
    if (bits & n.bit) s += (s.empty() ? "" : " ") + std::string(n.name);
  return s;
}

std::string isa_mismatch_message(uint64_t built, uint64_t cpu) {
  const uint64_t missing = built & ~cpu;
  if (!missing) return "";
  std::string fix = "rebuild on this machine (bash scripts/build.sh)";
  if (cpu & kAvx2 && cpu & kFma) fix += ", or configure with -DTAPELM_ARCH=x86-64-v3 for a binary that runs on any AVX2 CPU";
  return "tapelm: this binary was compiled for a CPU with " + isa_names(missing) + " (-march=native on the machine that " +
         "built it), which this CPU lacks" + ((missing & kAvx512Any) ? " (no AVX-512 here)" : "") + ": " + fix;
}

}  // namespace tapelm
