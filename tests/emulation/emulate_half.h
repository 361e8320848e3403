// The 16-bit float conversions of cuda_fp16.h / cuda_bf16.h that chainfb's
// kernels use (common.cuh's Storage<F16> and Storage<BF16>), in software for
// the host emulation: bit-exact with the hardware, round to nearest even,
// NaN kept quiet.  Included by emulate.h.
#ifndef CHAINFB_EMULATE_HALF_H
#define CHAINFB_EMULATE_HALF_H

#include <bit>

struct __half {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short x;
};

inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }

inline float __bfloat162float(__nv_bfloat16 b) { return std::bit_cast<float>(((unsigned)b.x) << 16); }

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned x = std::bit_cast<unsigned>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(unsigned short)((x >> 16) | 0x40u)};  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return __nv_bfloat16{(unsigned short)(x >> 16)};
}

inline float __half2float(__half v) {
  unsigned h = v.x;
  unsigned sign = (h & 0x8000u) << 16;
  unsigned e = (h >> 10) & 0x1fu;
  unsigned m = h & 0x3ffu;
  if (e == 0) {
    float f = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -f : f;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

inline __half __float2half_rn(float f) {
  unsigned x = std::bit_cast<unsigned>(f);
  unsigned sign = (x >> 16) & 0x8000u;
  unsigned ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return __half{(unsigned short)(sign | 0x7e00u)};   // NaN
  if (ax >= 0x477ff000u) return __half{(unsigned short)(sign | 0x7c00u)};  // >= 65520 (and inf) -> inf
  if (ax < 0x38800000u) {                                                  // below 2^-14: subnormal half
    if (ax <= 0x33000000u) return __half{(unsigned short)sign};            // <= 2^-25 rounds to zero
    unsigned e = ax >> 23;
    unsigned m = (ax & 0x7fffffu) | 0x800000u;
    unsigned shift = 126u - e;
    unsigned q = m >> shift;
    unsigned rem = m & ((1u << shift) - 1u);
    unsigned half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q += 1u;
    return __half{(unsigned short)(sign | q)};
  }
  unsigned h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
  unsigned rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1u;
  return __half{(unsigned short)(sign | h)};
}

#endif  // CHAINFB_EMULATE_HALF_H
