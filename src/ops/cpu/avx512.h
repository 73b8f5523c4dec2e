// What the CPU's AVX-512 kernels share (avx512_matmul.cpp, packed_matmul.cpp,
// avx512_attention.cpp): the build is for AVX2, and their functions are
// compiled for AVX-512F one by one (MERE_AVX512_TARGET), chosen at run time
// where avx512_matmul_available(). MERE_CPU_AVX512 is defined where the
// compiler can build them (x86-64 GCC or Clang).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MERE_CPU_AVX512 1
#define MERE_AVX512_TARGET __attribute__((target("avx2,fma,avx512f")))
#endif
