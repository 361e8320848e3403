// Kernels that break the rules on purpose, built into the emulation library
// only with -DCHAINFB_EMULATE_SELFTEST: the tests check that the emulation
// reports them (see tests/test_cuda_emulation_checks.py).
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

}  // namespace cfb_selftest

#endif  // CHAINFB_EMULATE_SELFTEST_H
