// Kernels that break the rules on purpose, or whose results and counts are
// known, built into the emulation library only with
// -DCHAINFB_EMULATE_SELFTEST: the tests check that the emulation reports
// them and reproduces CUDA's semantics (see
// tests/cuda/test_cuda_emulation_checks.py).
#ifndef CHAINFB_EMULATE_SELFTEST_H
#define CHAINFB_EMULATE_SELFTEST_H

#include "common.cuh"

namespace cfb_selftest {

// thread 0 exits, the others then wait at a barrier: an error
CHAINFB_KERNEL void early_exit_then_sync(int* out) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// reads shared memory before writing it: poisoned (NaN) in every block
CHAINFB_KERNEL void read_shared_first(float* out) {
  CHAINFB_SHARED_ARRAY(float, sm, 4);
  out[blockIdx.x * blockDim.x + threadIdx.x] = sm[threadIdx.x % 4];
  __syncthreads();
  if (threadIdx.x < 4) sm[threadIdx.x] = 1.0f;
}

// more static shared memory than a block may have
CHAINFB_KERNEL void too_much_shared(double* out) {
  CHAINFB_SHARED_ARRAY(double, big, 7000);
  if (threadIdx.x == 0) {
    big[0] = 1.0;
    out[blockIdx.x] = big[0];
  }
}

// the order in which blocks start
CHAINFB_KERNEL void block_order(int* order, int* counter) {
  if (threadIdx.x == 0) order[atomicAdd(counter, 1)] = (int)blockIdx.x;
}

// thread 0 writes a shared slot that thread 1 reads, without a barrier
// between: a data race, whose result depends on the order the threads run in
CHAINFB_KERNEL void shared_race(float* out) {
  CHAINFB_SHARED_ARRAY(float, slot, 1);
  if (threadIdx.x == 0) slot[0] = 1.0f;
  if (threadIdx.x == 1) out[blockIdx.x] = slot[0];
  __syncthreads();
}

// thread i counts i arc terms (float) before a barrier and one after; in the
// second phase thread 0 also counts `heavy` double state results, the others
// `bytes` bytes
CHAINFB_KERNEL void work_counts(int heavy, int bytes) {
  CHAINFB_WORK(chainfb::work_arc<float>(), threadIdx.x);
  __syncthreads();
  CHAINFB_WORK(chainfb::kWorkArcF, 1);
  if (threadIdx.x == 0)
    CHAINFB_WORK(chainfb::work_state<double>(), heavy);
  else
    CHAINFB_WORK(chainfb::kWorkBytes, bytes);
}

// Every shuffle of each type: out_* [4, blockDim.x * gridDim.x] (idx, up,
// down, xor), each thread's value v = 1000 * block + thread (+ 0.25 for
// float, + 0.5 for double, + 2^40 for long long); mask 0xffffffff.
CHAINFB_KERNEL void shuffles(int arg, int width, int* out_i, unsigned* out_u, float* out_f, double* out_d,
                             long long* out_ll) {
  const int n = blockDim.x * gridDim.x, g = blockIdx.x * blockDim.x + threadIdx.x;
  const int v = 1000 * (int)blockIdx.x + (int)threadIdx.x;
  const unsigned m = 0xffffffffu;
  out_i[g] = __shfl_sync(m, v, arg, width);
  out_i[n + g] = __shfl_up_sync(m, v, (unsigned)arg, width);
  out_i[2 * n + g] = __shfl_down_sync(m, v, (unsigned)arg, width);
  out_i[3 * n + g] = __shfl_xor_sync(m, v, arg, width);
  const unsigned u = (unsigned)v + 0x80000000u;
  out_u[g] = __shfl_sync(m, u, arg, width);
  out_u[n + g] = __shfl_up_sync(m, u, (unsigned)arg, width);
  out_u[2 * n + g] = __shfl_down_sync(m, u, (unsigned)arg, width);
  out_u[3 * n + g] = __shfl_xor_sync(m, u, arg, width);
  const float f = (float)v + 0.25f;
  out_f[g] = __shfl_sync(m, f, arg, width);
  out_f[n + g] = __shfl_up_sync(m, f, (unsigned)arg, width);
  out_f[2 * n + g] = __shfl_down_sync(m, f, (unsigned)arg, width);
  out_f[3 * n + g] = __shfl_xor_sync(m, f, arg, width);
  const double d = (double)v + 0.5;
  out_d[g] = __shfl_sync(m, d, arg, width);
  out_d[n + g] = __shfl_up_sync(m, d, (unsigned)arg, width);
  out_d[2 * n + g] = __shfl_down_sync(m, d, (unsigned)arg, width);
  out_d[3 * n + g] = __shfl_xor_sync(m, d, arg, width);
  const long long l = (long long)v + (1LL << 40);
  out_ll[g] = __shfl_sync(m, l, arg, width);
  out_ll[n + g] = __shfl_up_sync(m, l, (unsigned)arg, width);
  out_ll[2 * n + g] = __shfl_down_sync(m, l, (unsigned)arg, width);
  out_ll[3 * n + g] = __shfl_xor_sync(m, l, arg, width);
}

// A warp sum with __shfl_xor_sync (a full warp) or __shfl_sync broadcasts
// (a partial one) over the lanes __activemask() gives, then __syncwarp:
// out[2 * thread] = the sum of its warp's thread ids, out[2 * thread + 1] =
// __activemask().
CHAINFB_KERNEL void warp_sum(long long* out) {
  const unsigned m = __activemask();
  const long long own = threadIdx.x;
  long long v = 0;
  if (m == 0xffffffffu) {
    v = own;
    for (int k = 16; k >= 1; k /= 2) v += __shfl_xor_sync(m, v, k);
  } else {
    for (int l = 0; l < 32; ++l)
      if (m >> l & 1u) v += __shfl_sync(m, own, l);
  }
  __syncwarp(m);
  out[2 * threadIdx.x] = v;
  out[2 * threadIdx.x + 1] = m;
}

// The order in which the threads run in each of `phases` phases:
// order[p * blockDim.x + k] = the k-th thread to run in phase p (one block).
CHAINFB_KERNEL void phase_order(int* order, int* counter, int phases) {
  for (int p = 0; p < phases; ++p) {
    order[p * (int)blockDim.x + atomicAdd(&counter[p], 1)] = (int)threadIdx.x;
    __syncthreads();
  }
}

// Thread 0 writes a shared slot that thread 1 then reads (blocks of two
// threads), ordered by a __syncwarp (mode 0: no race) or by nothing but a
// shuffle (mode 1: a data race, a shuffle exchanges registers only).
CHAINFB_KERNEL void warp_handoff(int mode, float* out) {
  CHAINFB_SHARED_ARRAY(float, slot, 1);
  if (threadIdx.x == 0) slot[0] = 2.0f;
  float v = (float)threadIdx.x;
  if (mode == 0)
    __syncwarp(0x3u);
  else
    v = __shfl_sync(0x3u, v, 0);
  if (threadIdx.x == 1) out[blockIdx.x] = slot[0] + v;
}

// Warp intrinsics misused (each an error), by `mode`:
// 0: lane 1 exits while lane 0 shuffles with mask 0x3;
// 1: lanes 0 and 1 shuffle with mask 0x3 at different lines (diverged);
// 2: lane 0 shuffles with mask 0x3 while lane 1 waits at __syncthreads();
// 3: a mask without the calling lane;
// 4: a full mask in a warp of 8 threads;
// 5: lane 0 reads lane 2, which is outside the mask 0x3;
// 6: width 3.
CHAINFB_KERNEL void warp_misuse(int mode, int* out) {
  const int t = threadIdx.x;
  int v = t;
  if (mode == 0) {
    if (t == 1) return;
    if (t == 0) v = __shfl_sync(0x3u, v, 1);
  } else if (mode == 1) {
    if (t == 0) v = __shfl_sync(0x3u, v, 1);
    if (t == 1) v = __shfl_sync(0x3u, v, 0);
  } else if (mode == 2) {
    if (t == 0) v = __shfl_sync(0x3u, v, 1);
    __syncthreads();
  } else if (mode == 3) {
    if (t == 0) v = __shfl_sync(0x2u, v, 1);
  } else if (mode == 4) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  } else if (mode == 5) {
    if (t < 2) v = __shfl_sync(0x3u, v, 2);
  } else if (mode == 6) {
    v = __shfl_down_sync(__activemask(), v, 1, 3);
  }
  out[t] = v;
}

// Dynamic shared memory: out[block * 2 * n + i] = what thread i first reads
// at dyn[i] (poisoned), out[block * 2 * n + n + i] = dyn[i] after thread
// (i + 1) % n wrote it and a barrier; n = blockDim.x.  `static_doubles`
// doubles of static shared memory beside it.
CHAINFB_KERNEL void dynamic_shared(float* out, int static_doubles) {
  CHAINFB_DYNAMIC_SHARED(float, dyn);
  const int n = blockDim.x, t = threadIdx.x;
  if (static_doubles > 0) {
    CHAINFB_SHARED_ARRAY(double, big, 5000);
    if (t == 0) big[0] = 0.0;
  }
  out[blockIdx.x * 2 * n + t] = dyn[t];
  __syncthreads();
  dyn[(t + 1) % n] = (float)(1000 * blockIdx.x + t);
  __syncthreads();
  out[blockIdx.x * 2 * n + n + t] = dyn[t];
}

// a cluster of 2 blocks (cluster_map, cluster_sync): each block writes
// 1000 * its block + thread into slot `thread` of the other block's dynamic
// shared memory; after the cluster's barrier each thread reads its own slot.
// With `mix` the block's thread 0 waits at __syncthreads() while the others
// wait at the cluster's barrier: an error.  With `outside` a thread maps a
// pointer that is not in its dynamic shared memory: an error.
CHAINFB_CLUSTER_KERNEL(2) void cluster_exchange(float* out, int mix, int outside) {
  CHAINFB_DYNAMIC_SHARED(float, dyn);
  CHAINFB_SHARED_ARRAY(float, fixed, 1);
  const unsigned r = chainfb::cluster_rank(), t = threadIdx.x;
  chainfb::cluster_sync();
  if (outside && t == 0) chainfb::cluster_map(fixed, 1u - r)[0] = 1.0f;
  chainfb::cluster_map(dyn, 1u - r)[t] = (float)(1000 * blockIdx.x + t);
  if (mix && t == 0)
    __syncthreads();
  else
    chainfb::cluster_sync();
  out[blockIdx.x * blockDim.x + t] = dyn[t];
}


// out [3, n] (exp, log, log1p)
template <typename R>
CHAINFB_KERNEL void math_funcs(const R* x, int n, R* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = chainfb::Num<R>::exp_(x[i]);
  out[n + i] = chainfb::Num<R>::log_(x[i]);
  out[2 * n + i] = chainfb::Num<R>::log1p_(x[i]);
}

}  // namespace cfb_selftest

#endif  // CHAINFB_EMULATE_SELFTEST_H
