// Host emulation of the small CUDA subset chainfb's kernels use, so the SAME
// .cu sources build with g++ (-std=c++20 -x c++ -DCHAINFB_EMULATE) and run on
// the CPU in tests.  Blocks run one after another; the threads of a block run
// as std::threads; __syncthreads() is a std::barrier across them; __shared__
// variables become function statics (one copy, used by one block at a time).
// A thread that returns from the kernel drops out of the barrier, as an exited
// thread does on the GPU.
#ifndef CHAINFB_EMULATE_H
#define CHAINFB_EMULATE_H

#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace cfb_emu {

struct uint3 {
  unsigned x, y, z;
};
using dim3 = uint3;

inline thread_local uint3 t_threadIdx{0, 0, 0};
inline thread_local uint3 t_blockIdx{0, 0, 0};
inline thread_local uint3 t_blockDim{1, 1, 1};
inline thread_local uint3 t_gridDim{1, 1, 1};
inline thread_local std::barrier<>* t_barrier = nullptr;

// Run `body` as a 1-D grid of `grid` blocks of `block` threads.
template <class F>
void launch(unsigned grid, unsigned block, F&& body) {
  for (unsigned b = 0; b < grid; ++b) {
    std::barrier<> bar(static_cast<std::ptrdiff_t>(block));
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (unsigned t = 0; t < block; ++t) {
      threads.emplace_back([&, t] {
        t_threadIdx = {t, 0, 0};
        t_blockIdx = {b, 0, 0};
        t_blockDim = {block, 1, 1};
        t_gridDim = {grid, 1, 1};
        t_barrier = &bar;
        body();
        bar.arrive_and_drop();
      });
    }
    for (auto& th : threads) th.join();
  }
}

inline float int_as_float(int v) { return std::bit_cast<float>(v); }
inline int float_as_int(float v) { return std::bit_cast<int>(v); }
inline double longlong_as_double(long long v) { return std::bit_cast<double>(v); }

template <class T>
inline T atomic_add(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}

}  // namespace cfb_emu

#define threadIdx (::cfb_emu::t_threadIdx)
#define blockIdx (::cfb_emu::t_blockIdx)
#define blockDim (::cfb_emu::t_blockDim)
#define gridDim (::cfb_emu::t_gridDim)
#define __syncthreads() (::cfb_emu::t_barrier->arrive_and_wait())
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static

inline float __int_as_float(int v) { return cfb_emu::int_as_float(v); }
inline int __float_as_int(float v) { return cfb_emu::float_as_int(v); }
inline double __longlong_as_double(long long v) { return cfb_emu::longlong_as_double(v); }
inline float expf(float x) { return std::exp(x); }
inline float logf(float x) { return std::log(x); }
inline float log1pf(float x) { return std::log1p(x); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float fminf(float a, float b) { return std::fmin(a, b); }
inline float fabsf(float a) { return std::fabs(a); }
using std::exp;
using std::fabs;
using std::fmax;
using std::fmin;
using std::log;
using std::log1p;
inline int atomicAdd(int* p, int v) { return cfb_emu::atomic_add(p, v); }
inline float atomicAdd(float* p, float v) { return cfb_emu::atomic_add(p, v); }
inline double atomicAdd(double* p, double v) { return cfb_emu::atomic_add(p, v); }

#endif  // CHAINFB_EMULATE_H
