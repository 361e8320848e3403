// Shared device helpers for chainfb's kernels: -inf, exp/log per real type,
// an online log-sum-exp accumulator, a deterministic block-wide log-sum-exp
// (shared-memory tree, no warp shuffles), and 16-bit float storage types.
//
// CHAINFB_EMULATE is defined only by the host build of the test suite
// (tests/emulation/), which compiles these same sources with a C++ compiler
// and runs them on the CPU.  Its two branches below are all the kernels need
// to build there; NVRTC and nvcc never see them.
#ifndef CHAINFB_COMMON_CUH
#define CHAINFB_COMMON_CUH

#ifdef CHAINFB_EMULATE
// Host build: the emulation header (on the host compiler's include path, not
// shipped) defines the CUDA subset used here -- thread and block indices,
// __syncthreads, the intrinsics, the 16-bit conversions -- in place of the
// CUDA headers.
#include "emulate.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#ifndef CHAINFB_MAX_THREADS
#define CHAINFB_MAX_THREADS 1024
#endif

// Every kernel is declared __launch_bounds__(CHAINFB_MAX_THREADS): the
// compiler then keeps its register use low enough for 1024-thread blocks.
#define CHAINFB_KERNEL __global__ __launch_bounds__(CHAINFB_MAX_THREADS)
// The recursion kernels (a few large blocks, one per sequence and direction)
// also declare that one block an SM is enough: without it the compiler may
// halve their registers to fit two 1024-thread blocks on an SM of 2048
// threads (sm_80: 32 registers and spills in the frame loop).
#define CHAINFB_RECURSION_KERNEL __global__ __launch_bounds__(CHAINFB_MAX_THREADS, 1)

// A statically sized shared-memory array `T name[n]`.  Host build: a host
// compiler has no __shared__ storage, so the emulation hands each block its
// own copy of the array, keyed by the declaration site (and poisoned at
// block start to expose reads before writes).
#ifdef CHAINFB_EMULATE
#define CHAINFB_SHARED_ARRAY(T, name, n)  \
  static char name##_site;                \
  T* name = ::cfb_emu::shared_array<T>(&name##_site, (n))
#else
#define CHAINFB_SHARED_ARRAY(T, name, n) __shared__ T name[n]
#endif

// ---- begin: dynamic shared memory, work annotations, math routing ----
// CHAINFB_DYNAMIC_SHARED(T, name): `T* name` at the block's dynamic shared
// memory (the byte count given at launch), aligned to 16 bytes.  Host
// build: the block's own dynamic buffer, poisoned like static shared memory.
//
// CHAINFB_WORK(cat, n): adds n units of work of category `cat` (a
// chainfb::Work) to the calling thread's count.  Nothing on the device;
// the host build counts it when a launch asks for counts, and reports per
// block the phases, the span and the total of each category (see
// tests/emulation/).
//
// CHAINFB_ROUTE_MATH(fn, x): fn(x) on the device; the host build's version
// of fn (::cfb_emu::math_fn), which may move results by a few ulps
// (CHAINFB_EMULATE_MATH).
#ifdef CHAINFB_EMULATE
#define CHAINFB_DYNAMIC_SHARED(T, name) T* name = ::cfb_emu::dynamic_shared<T>()
#define CHAINFB_WORK(cat, n) (::cfb_emu::add_work((int)(cat), (unsigned long long)(n)))
#define CHAINFB_ROUTE_MATH(fn, x) (::cfb_emu::math_##fn(x))
#else
#define CHAINFB_DYNAMIC_SHARED(T, name)                                      \
  extern __shared__ __align__(16) unsigned char chainfb_dynamic_shared_[]; \
  T* name = reinterpret_cast<T*>(chainfb_dynamic_shared_)
#define CHAINFB_WORK(cat, n) ((void)0)
#define CHAINFB_ROUTE_MATH(fn, x) (fn(x))
#endif

namespace chainfb {

// Categories of work a kernel annotates with CHAINFB_WORK (the units of the
// cost model in tests/emulation/cost_model.py).
enum Work {
  kWorkArcF,          // one arc term in float: an arc's source value and score loaded, added, exponentiated
  kWorkArcD,          // the same in double
  kWorkStateF,        // one state or column result in float: a log and a store
  kWorkStateD,        // the same in double
  kWorkBytes,         // global memory bytes streamed by a map kernel
  kWorkShuffle,       // one warp shuffle or __syncwarp call (counted by the host build itself)
  kWorkArcSharedF,    // an arc term whose source value and score are read from shared memory, float
  kWorkArcSharedD,    // the same in double
  kWorkStateSharedF,  // a state result whose inputs were read from shared memory, float
  kWorkStateSharedD,  // the same in double
  kWorkMemoryWait,    // a thread's first read of a frame's data from device memory (a full memory latency)
  kWorkCount
};

// The F or D category for real type R (float or double), read from device
// or (shared = true) shared memory.
template <typename R>
struct WorkOf;
template <>
struct WorkOf<float> {
  static constexpr Work arc = kWorkArcF, state = kWorkStateF, arc_shared = kWorkArcSharedF,
                        state_shared = kWorkStateSharedF;
};
template <>
struct WorkOf<double> {
  static constexpr Work arc = kWorkArcD, state = kWorkStateD, arc_shared = kWorkArcSharedD,
                        state_shared = kWorkStateSharedD;
};
template <typename R>
__device__ __forceinline__ Work work_arc(bool shared = false) {
  return shared ? WorkOf<R>::arc_shared : WorkOf<R>::arc;
}
template <typename R>
__device__ __forceinline__ Work work_state(bool shared = false) {
  return shared ? WorkOf<R>::state_shared : WorkOf<R>::state;
}

}  // namespace chainfb
// ---- end: dynamic shared memory, work annotations, math routing ----

// Thread block clusters (sm_90): a kernel declared CHAINFB_CLUSTER_KERNEL(K)
// runs as clusters of K consecutive blocks, co-scheduled on the SMs of one
// GPC.  cluster_rank() is the block's rank in its cluster; cluster_sync()
// waits for every thread of the cluster, and orders the memory operations
// before it (device and shared memory, the other blocks' included) before
// those after it; cluster_map(p, r) is the address of p (in the block's
// dynamic shared memory) in block r's shared memory, which a thread may read
// and write like its own (distributed shared memory).  A block's shared
// memory may be accessed by others only between two cluster_sync() calls
// that every block of the cluster reaches.  Host build: emulate.h.  Device
// code for architectures before sm_90 traps (only the cluster kernels call
// these, and the launcher runs those only on sm_90 and later).
#ifdef CHAINFB_EMULATE
#define CHAINFB_CLUSTER_KERNEL(K) __global__
namespace chainfb {
__device__ __forceinline__ unsigned cluster_rank() { return ::cfb_emu::cluster_rank(); }
__device__ __forceinline__ void cluster_sync() { ::cfb_emu::cluster_sync(); }
template <typename T>
__device__ __forceinline__ T* cluster_map(T* p, unsigned rank) {
  return ::cfb_emu::cluster_map(p, rank);
}
}  // namespace chainfb
#else
#define CHAINFB_CLUSTER_KERNEL(K) __global__ __cluster_dims__(K, 1, 1) __launch_bounds__(CHAINFB_MAX_THREADS, 1)
namespace chainfb {
__device__ __forceinline__ unsigned cluster_rank() {
#if __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
#else
  __trap();
  return 0;
#endif
}
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();
#endif
}
template <typename T>
__device__ __forceinline__ T* cluster_map(T* p, unsigned rank) {
#if __CUDA_ARCH__ >= 900
  T* out;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(p), "r"(rank));
  return out;
#else
  __trap();
  return p;
#endif
}
}  // namespace chainfb
#endif

namespace chainfb {

typedef long long i64;

// A length read from device memory, clamped to [0, hi] (device-side lengths
// are not checked on the host: out-of-range values must not move any access
// out of bounds).
__device__ __forceinline__ int clamp_len(i64 v, int hi) { return v < 0 ? 0 : (v > (i64)hi ? hi : (int)v); }

template <typename R>
struct Num;

template <>
struct Num<float> {
  static __device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }
  static __device__ __forceinline__ float nan() { return __int_as_float(0x7fc00000); }
  static __device__ __forceinline__ float exp_(float x) { return CHAINFB_ROUTE_MATH(expf, x); }
  static __device__ __forceinline__ float log_(float x) { return CHAINFB_ROUTE_MATH(logf, x); }
  static __device__ __forceinline__ float log1p_(float x) { return CHAINFB_ROUTE_MATH(log1pf, x); }
};

template <>
struct Num<double> {
  static __device__ __forceinline__ double neg_inf() { return -__longlong_as_double(0x7ff0000000000000LL); }
  static __device__ __forceinline__ double nan() { return __longlong_as_double(0x7ff8000000000000LL); }
  static __device__ __forceinline__ double exp_(double x) { return CHAINFB_ROUTE_MATH(exp, x); }
  static __device__ __forceinline__ double log_(double x) { return CHAINFB_ROUTE_MATH(log, x); }
  static __device__ __forceinline__ double log1p_(double x) { return CHAINFB_ROUTE_MATH(log1p, x); }
};

// log(exp(a) + exp(b)), -inf when both are -inf, NaN when either is NaN
// (as numpy.logaddexp).
template <typename R>
__device__ __forceinline__ R log_add(R a, R b) {
  if (a != a || b != b) return a + b;
  R m = a > b ? a : b;
  R d = a > b ? b - a : a - b;
  if (!(m > Num<R>::neg_inf())) return Num<R>::neg_inf();
  return m + Num<R>::log1p_(Num<R>::exp_(d));
}

// Online log-sum-exp: running max m and sum s of exp(v - m).  NaN is
// sticky (a NaN term makes the result NaN, as in NumPy): once m is NaN every
// comparison with it is false and the result is m + log(s) = NaN.
template <typename R>
struct LogAcc {
  R m, s;
  __device__ __forceinline__ void init() {
    m = Num<R>::neg_inf();
    s = R(0);
  }
  __device__ __forceinline__ void add(R v) {
    if (v > m) {
      s = s * Num<R>::exp_(m - v) + R(1);
      m = v;
    } else if (v > Num<R>::neg_inf()) {
      s += Num<R>::exp_(v - m);
    } else if (v != v) {
      m = v;
    }
  }
  __device__ __forceinline__ void merge(R om, R os) {
    if (om > m) {
      s = s * Num<R>::exp_(m - om) + os;
      m = om;
    } else if (om > Num<R>::neg_inf()) {
      s += os * Num<R>::exp_(om - m);
    } else if (om != om) {
      m = om;
    }
  }
  __device__ __forceinline__ bool is_nan() const { return m != m; }
  __device__ __forceinline__ R result() const {
    return m == Num<R>::neg_inf() ? Num<R>::neg_inf() : m + Num<R>::log_(s);
  }
};

// Log-sum-exp within groups of `group` consecutive threads of the block
// (group = blockDim.x for the whole block; a power of two dividing blockDim.x
// otherwise).  Every thread of the block must call it.  A fixed tree order:
// bit-identical from run to run.  Returns the group's result to every thread.
template <typename R>
__device__ R group_logsum(LogAcc<R> a, unsigned group) {
  CHAINFB_SHARED_ARRAY(R, sm_m, CHAINFB_MAX_THREADS);
  CHAINFB_SHARED_ARRAY(R, sm_s, CHAINFB_MAX_THREADS);
  unsigned tid = threadIdx.x;
  unsigned lane = tid % group;
  sm_m[tid] = a.m;
  sm_s[tid] = a.s;
  __syncthreads();
  for (unsigned stride = 1; stride < group; stride *= 2) {
    if ((lane & (2 * stride - 1)) == 0 && lane + stride < group) {
      LogAcc<R> x;
      x.m = sm_m[tid];
      x.s = sm_s[tid];
      x.merge(sm_m[tid + stride], sm_s[tid + stride]);
      sm_m[tid] = x.m;
      sm_s[tid] = x.s;
    }
    __syncthreads();
  }
  LogAcc<R> r;
  r.m = sm_m[tid - lane];
  r.s = sm_s[tid - lane];
  R out = r.result();
  __syncthreads();  // the shared buffers may be reused right after
  return out;
}

// 16-bit float storage (IEEE half and bfloat16) as raw bits, converted
// bit-exactly with round to nearest even.
struct F16 {
  unsigned short bits;
};
struct BF16 {
  unsigned short bits;
};

template <typename In>
struct Storage;

template <>
struct Storage<float> {
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};

template <>
struct Storage<double> {
  static __device__ __forceinline__ double load(double v) { return v; }
  static __device__ __forceinline__ double store(double v) { return v; }
};

// The CUDA conversions (round to nearest even); the host emulation of the
// tests supplies the same intrinsics in software, bit for bit.
template <>
struct Storage<BF16> {
  static __device__ __forceinline__ float load(BF16 v) { return __bfloat162float(__ushort_as_bfloat16(v.bits)); }
  static __device__ __forceinline__ BF16 store(float f) {
    BF16 r;
    r.bits = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    return r;
  }
};

template <>
struct Storage<F16> {
  static __device__ __forceinline__ float load(F16 v) { return __half2float(__ushort_as_half(v.bits)); }
  static __device__ __forceinline__ F16 store(float f) {
    F16 r;
    r.bits = __half_as_ushort(__float2half_rn(f));
    return r;
  }
};

}  // namespace chainfb

#endif  // CHAINFB_COMMON_CUH
