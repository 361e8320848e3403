// Math modes of the kernel emulation (included by emulate.h): what
// Num<float> / Num<double>'s exp_, log_ and log1p_ (common.cuh) return on
// the host.  CHAINFB_EMULATE_MATH, read at each launch:
//   exact        the host libm's result, bit for bit (the default);
//   ulp2_up      the libm result moved up by 1 or 2 ulp (toward +inf): a
//                bias one way, as a device library's last-bit errors could
//                add up;
//   ulp2_random  moved by -2..+2 ulp, drawn per call from a stream seeded by
//                CHAINFB_EMULATE_SEED, the kernel's name, the launch shape,
//                the block and the thread: the same for the same seed.
// Results that are +-inf, NaN or 0 are left alone, and a moved result never
// crosses zero nor becomes infinite.
#ifndef CHAINFB_EMULATE_MATH_H
#define CHAINFB_EMULATE_MATH_H

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

namespace cfb_emu {

enum class MathMode { Exact, Ulp2Up, Ulp2Random };

inline MathMode g_math = MathMode::Exact;

// The mode CHAINFB_EMULATE_MATH names; *error set when it names none.
inline MathMode math_mode_from_env(std::string* error) {
  const char* v = std::getenv("CHAINFB_EMULATE_MATH");
  if (!v || !*v || std::strcmp(v, "exact") == 0) return MathMode::Exact;
  if (std::strcmp(v, "ulp2_up") == 0) return MathMode::Ulp2Up;
  if (std::strcmp(v, "ulp2_random") == 0) return MathMode::Ulp2Random;
  *error = std::string("CHAINFB_EMULATE_MATH=") + v + ": expected exact, ulp2_up or ulp2_random";
  return MathMode::Exact;
}

template <class T>
inline T nudge(T r) {
  if (g_math == MathMode::Exact || !std::isfinite(r) || r == T(0)) return r;
  const std::uint64_t x = g_cur->math.next();
  const int k = g_math == MathMode::Ulp2Up ? 1 + (int)(x >> 63) : (int)((x >> 32) % 5) - 2;
  const T toward = k > 0 ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity();
  for (int i = 0; i < std::abs(k); ++i) {
    const T n = std::nextafter(r, toward);
    if (!std::isfinite(n) || n == T(0) || std::signbit(n) != std::signbit(r)) break;
    r = n;
  }
  return r;
}

inline float math_expf(float x) { return nudge(std::exp(x)); }
inline float math_logf(float x) { return nudge(std::log(x)); }
inline float math_log1pf(float x) { return nudge(std::log1p(x)); }
inline double math_exp(double x) { return nudge(std::exp(x)); }
inline double math_log(double x) { return nudge(std::log(x)); }
inline double math_log1p(double x) { return nudge(std::log1p(x)); }

}  // namespace cfb_emu

#endif  // CHAINFB_EMULATE_MATH_H
