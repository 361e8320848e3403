// Host emulation of the small CUDA subset chainfb's kernels use, so the SAME
// .cu sources (chainfb/cuda/) build with g++ (-std=c++20 -x c++
// -DCHAINFB_EMULATE, this directory on the include path: common.cuh
// includes this header in place of the CUDA headers) and run on the CPU in
// tests.  The threads of a block run as std::threads and
// __syncthreads() is a std::barrier across them.  To catch more than a GPU
// run would by chance:
//   - several blocks run at once, in a random order (CHAINFB_EMULATE_SEED,
//     CHAINFB_EMULATE_CONCURRENT_BLOCKS), each with its own shared memory;
//   - shared memory (CHAINFB_SHARED_ARRAY, see common.cuh; a bare
//     __shared__ does not compile here) is poisoned with all-ones bytes (NaN
//     for float and double, -1 for integers) when the block starts;
//   - a barrier completed after any thread of the block has exited is an
//     error (a thread that returns drops out of the barrier, as on the GPU,
//     but the kernel then relies on undefined behaviour);
//   - launch limits: 1..1024 threads per block, 1..2^31-1 blocks, at most
//     48 KiB of static shared memory per block.
// Errors are collected per launch and reported by cfb_launch.
#ifndef CHAINFB_EMULATE_H
#define CHAINFB_EMULATE_H

#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace cfb_emu {

struct uint3 {
  unsigned x, y, z;
};
using dim3 = uint3;

constexpr unsigned kMaxThreads = 1024;
constexpr std::size_t kMaxStaticShared = 48 * 1024;

// Errors of the current launch (first one kept).
struct Errors {
  std::mutex mu;
  std::string first;
  void add(const std::string& e) {
    std::lock_guard<std::mutex> g(mu);
    if (first.empty()) first = e;
  }
};

struct Block;

struct OnPhase {
  Block* blk;
  void operator()() noexcept;
};

struct Block {
  unsigned index;
  Errors* errors;
  std::atomic<unsigned> exited{0};
  std::atomic<unsigned> waiting{0};  // threads at __syncthreads() in the current phase
  std::barrier<OnPhase> bar;
  std::mutex mu;
  std::map<const void*, std::unique_ptr<unsigned char[]>> shared;
  std::size_t shared_bytes = 0;
  Block(unsigned i, unsigned threads, Errors* e) : index(i), errors(e), bar((std::ptrdiff_t)threads, OnPhase{this}) {}

  // The block's copy of the shared array declared at `tag`, poisoned on first use.
  void* shared_array(const void* tag, std::size_t bytes) {
    std::lock_guard<std::mutex> g(mu);
    auto it = shared.find(tag);
    if (it != shared.end()) return it->second.get();
    shared_bytes += bytes;
    if (shared_bytes > kMaxStaticShared)
      errors->add("block uses " + std::to_string(shared_bytes) + " bytes of static shared memory (limit " +
                  std::to_string(kMaxStaticShared) + ")");
    auto mem = std::make_unique<unsigned char[]>(bytes ? bytes : 1);
    std::memset(mem.get(), 0xff, bytes);
    void* p = mem.get();
    shared.emplace(tag, std::move(mem));
    return p;
  }
};

// A phase completed only by exiting threads is fine; one with a thread
// waiting at __syncthreads() while another has exited is not.
inline void OnPhase::operator()() noexcept {
  if (blk->waiting.exchange(0) > 0 && blk->exited.load() > 0)
    blk->errors->add("__syncthreads() reached after a thread of block " + std::to_string(blk->index) +
                     " had exited");
}

inline thread_local uint3 t_threadIdx{0, 0, 0};
inline thread_local uint3 t_blockIdx{0, 0, 0};
inline thread_local uint3 t_blockDim{1, 1, 1};
inline thread_local uint3 t_gridDim{1, 1, 1};
inline thread_local Block* t_block = nullptr;

inline void syncthreads() {
  t_block->waiting.fetch_add(1);
  t_block->bar.arrive_and_wait();
}

template <class T>
inline T* shared_array(const void* tag, std::size_t n) {
  return static_cast<T*>(t_block->shared_array(tag, n * sizeof(T)));
}

inline unsigned env_unsigned(const char* name, unsigned dflt) {
  const char* v = std::getenv(name);
  return v && *v ? (unsigned)std::strtoul(v, nullptr, 10) : dflt;
}

// Run `body` as a 1-D grid of `grid` blocks of `block` threads; returns ""
// or the first error.
template <class F>
std::string launch(unsigned grid, unsigned block, F&& body) {
  if (block < 1 || block > kMaxThreads)
    return "block size " + std::to_string(block) + " outside 1.." + std::to_string(kMaxThreads);
  if (grid < 1 || grid > 0x7fffffffu) return "grid size " + std::to_string(grid) + " outside 1..2^31-1";
  static std::atomic<unsigned> launches{0};
  const unsigned seed = env_unsigned("CHAINFB_EMULATE_SEED", 12345u) + launches.fetch_add(1);
  const unsigned concurrent = std::max(1u, env_unsigned("CHAINFB_EMULATE_CONCURRENT_BLOCKS", 4u));
  std::vector<unsigned> order(grid);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937 gen(seed);
  std::shuffle(order.begin(), order.end(), gen);
  Errors errors;
  for (unsigned first = 0; first < grid; first += concurrent) {
    const unsigned last = std::min(grid, first + concurrent);
    std::vector<std::unique_ptr<Block>> blocks;
    std::vector<std::thread> threads;
    threads.reserve((std::size_t)(last - first) * block);
    for (unsigned i = first; i < last; ++i) {
      blocks.push_back(std::make_unique<Block>(order[i], block, &errors));
      Block* blk = blocks.back().get();
      for (unsigned t = 0; t < block; ++t) {
        threads.emplace_back([&body, blk, t, block, grid] {
          t_threadIdx = {t, 0, 0};
          t_blockIdx = {blk->index, 0, 0};
          t_blockDim = {block, 1, 1};
          t_gridDim = {grid, 1, 1};
          t_block = blk;
          body();
          blk->exited.fetch_add(1);
          blk->bar.arrive_and_drop();
        });
      }
    }
    for (auto& th : threads) th.join();
  }
  return errors.first;
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
#define __syncthreads() (::cfb_emu::syncthreads())
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)

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

#include "emulate_half.h"

#endif  // CHAINFB_EMULATE_H
