// Emulated cuda_fp16.h for the CPU tests: __half is IEEE binary16 (g++'s _Float16 converts with
// round-to-nearest-even, as __float2half_rn does).
#pragma once
#include "../cuda_cpu.h"

struct __half
{
    _Float16 v;
};
inline float __half2float(__half h) { return static_cast<float>(h.v); }
inline __half __float2half_rn(float f) { return __half{static_cast<_Float16>(f)}; }
static_assert(sizeof(__half) == 2, "__half must be 2 bytes");
