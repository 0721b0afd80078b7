// Compiled with the build's -march like the rest of tapelm, so the compiler's predefined macros
// say which extensions it may have used anywhere. A constant, initialised at compile time: reading
// it runs no instruction the CPU might lack.
#include "autograd/isa.h"

namespace tapelm {

namespace {
constexpr uint64_t kBuilt = 0
#ifdef __SSE4_2__
                            | kSse42
#endif
#ifdef __POPCNT__
                            | kPopcnt
#endif
#ifdef __AVX__
                            | kAvx
#endif
#ifdef __AVX2__
                            | kAvx2
#endif
#ifdef __FMA__
                            | kFma
#endif
#ifdef __F16C__
                            | kF16c
#endif
#ifdef __BMI__
                            | kBmi
#endif
#ifdef __BMI2__
                            | kBmi2
#endif
#ifdef __LZCNT__
                            | kLzcnt
#endif
#ifdef __MOVBE__
                            | kMovbe
#endif
#ifdef __AVX512F__
                            | kAvx512f
#endif
#ifdef __AVX512CD__
                            | kAvx512cd
#endif
#ifdef __AVX512BW__
                            | kAvx512bw
#endif
#ifdef __AVX512DQ__
                            | kAvx512dq
#endif
#ifdef __AVX512VL__
                            | kAvx512vl
#endif
#ifdef __AVX512BF16__
                            | kAvx512bf16
#endif
#ifdef __AVX512VNNI__
                            | kAvx512vnni
#endif
#ifdef __AVX512VBMI__
                            | kAvx512vbmi
#endif
#ifdef __AVX512VBMI2__
                            | kAvx512vbmi2
#endif
#ifdef __AVX512IFMA__
                            | kAvx512ifma
#endif
#ifdef __AVX512BITALG__
                            | kAvx512bitalg
#endif
#ifdef __AVX512VPOPCNTDQ__
                            | kAvx512vpopcntdq
#endif
#ifdef __GFNI__
                            | kGfni
#endif
#ifdef __VAES__
                            | kVaes
#endif
#ifdef __VPCLMULQDQ__
                            | kVpclmulqdq
#endif
#ifdef __AVXVNNI__
                            | kAvxvnni
#endif
    ;
}  // namespace

extern const uint64_t g_isa_built;
const uint64_t g_isa_built = kBuilt;

#ifndef TAPELM_ARCH_NAME
#define TAPELM_ARCH_NAME ""
#endif
const char* isa_built_arch() { return TAPELM_ARCH_NAME; }

}  // namespace tapelm
