// The forward-backward engine on the GPU: the same recursion as
// chainfb/engines/numpy_log.py::forward_backward, one block per sequence, the
// frame loop inside the kernel, threads striding over the sequence's states
// (and over its columns for the posteriors), log domain, R = float or double.
//
// Lattice arrays (all int32 unless noted, built once on the host):
//   state_off [N+1], col_off [N+1]: each sequence's contiguous states/columns
//   start [N], final [S] (R)
//   in_ptr [S+1], in_src [A], in_lp [A] (R), in_col [A]: arcs into each state
//   out_ptr [S+1], out_dst [A], out_lp [A] (R), out_col [A]: arcs out of each state
//   ca_ptr [C+1], ca_src [A], ca_dst [A], ca_lp [A] (R): arcs of each column, in
//     a fixed order, so each column's posterior is summed deterministically
// X [T, C] compact scores (frames >= length are set to -inf here, as on CPU)
// alpha [(T+1), S] (R): alpha_t of sequence n at row t for t <= lengths[n]
// Leaky HMM when log_init != nullptr: alpha'(i) = alpha(i) + c*sum_j alpha(j)*init(i)
// and beta'(i) = beta(i) + c*sum_j init(j)*beta(j), sums per sequence.
// lengths are clamped to [0, T] in the kernels (device lengths are unchecked).
// NaN as in the NumPy engine: a NaN score of sequence n in a frame < lengths[n]
// makes loglike[n] NaN and every posterior of n's columns at frames
// t < max(lengths) NaN; other sequences are unaffected.
#include "common.cuh"

namespace chainfb {

// a[s] <- log_add(a[s], log_c + logsum_j a[j] + log_init[s]) over [s0, s1)
template <typename R>
__device__ void leak_alpha(R* a, const R* log_init, R log_c, int s0, int s1) {
  LogAcc<R> acc;
  acc.init();
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x) acc.add(a[s]);
  R tot = group_logsum<R>(acc, blockDim.x);
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x)
    a[s] = log_add<R>(a[s], log_c + tot + log_init[s]);
  __syncthreads();
}

// b[s] <- log_add(b[s], log_c + logsum_j (log_init[j] + b[j])) over [s0, s1)
template <typename R>
__device__ void leak_beta(R* b, const R* log_init, R log_c, int s0, int s1) {
  LogAcc<R> acc;
  acc.init();
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x) acc.add(b[s] + log_init[s]);
  R tot = group_logsum<R>(acc, blockDim.x);
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x) b[s] = log_add<R>(b[s], log_c + tot);
  __syncthreads();
}

template <typename R>
CHAINFB_KERNEL void fb_forward(const int* state_off, const int* col_off, const int* start, const R* final_,
                           const int* in_ptr, const int* in_src, const R* in_lp, const int* in_col,
                           const i64* lengths, R* X, int T, int C, R* alpha, int S, const R* log_init,
                           R log_c, R* loglike) {
  const int n = blockIdx.x;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int s0 = state_off[n], s1 = state_off[n + 1];
  const int c0 = col_off[n], nc = col_off[n + 1] - c0;
  const int L = clamp_len(lengths[n], T);
  const R ninf = Num<R>::neg_inf();
  bool nan = false;  // this thread saw a NaN alpha (NumPy's normalisation spreads it to the whole sequence)

  // frames past the length never contribute (and the caller sees them as -inf)
  const i64 masked = (i64)(T - L) * nc;
  for (i64 i = tid; i < masked; i += nt) X[(i64)(L + (int)(i / nc)) * C + c0 + (int)(i % nc)] = ninf;

  for (int s = s0 + tid; s < s1; s += nt) {
    alpha[s] = log_init ? log_init[s] : (s == start[n] ? R(0) : ninf);
    nan = nan || alpha[s] != alpha[s];
  }
  __syncthreads();
  if (log_init) leak_alpha<R>(alpha, log_init, log_c, s0, s1);

  for (int t = 0; t < L; ++t) {
    const R* prev = alpha + (i64)t * S;
    R* cur = alpha + (i64)(t + 1) * S;
    const R* x = X + (i64)t * C;
    for (int s = s0 + tid; s < s1; s += nt) {
      LogAcc<R> acc;
      acc.init();
      for (int a = in_ptr[s], e = in_ptr[s + 1]; a < e; ++a) acc.add(prev[in_src[a]] + in_lp[a] + x[in_col[a]]);
      cur[s] = acc.result();
      nan = nan || acc.is_nan();
    }
    __syncthreads();
    if (log_init) leak_alpha<R>(cur, log_init, log_c, s0, s1);
  }

  LogAcc<R> acc;
  acc.init();
  const R* last = alpha + (i64)L * S;
  for (int s = s0 + tid; s < s1; s += nt) acc.add(last[s] + final_[s]);
  if (nan) acc.add(Num<R>::nan());
  R tot = group_logsum<R>(acc, blockDim.x);
  if (tid == 0) loglike[n] = tot;
}

// Posteriors post[t, c] for t < lengths[n] (the caller zero-fills post).
// beta_buf [2, S] (R) holds beta_{t+1} and beta_t.
template <typename R>
CHAINFB_KERNEL void fb_backward(const int* state_off, const int* col_off, const R* final_, const int* out_ptr,
                            const int* out_dst, const R* out_lp, const int* out_col, const int* ca_ptr,
                            const int* ca_src, const int* ca_dst, const R* ca_lp, const i64* lengths,
                            const R* X, int T, int C, const R* alpha, int S, const R* log_init, R log_c,
                            const R* loglike, R* beta_buf, R* post) {
  const int n = blockIdx.x;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int s0 = state_off[n], s1 = state_off[n + 1];
  const int c0 = col_off[n], c1 = col_off[n + 1];
  const int L = clamp_len(lengths[n], T);
  const R total = loglike[n];
  if (total != total) {  // NaN (uniform over the block): NaN posteriors up to the longest length, as NumPy
    int Lmax = 0;
    for (int i = 0; i < (int)gridDim.x; ++i) {
      const int Li = clamp_len(lengths[i], T);
      Lmax = Li > Lmax ? Li : Lmax;
    }
    const i64 cells = (i64)Lmax * (c1 - c0);
    for (i64 i = tid; i < cells; i += nt) post[(i / (c1 - c0)) * C + c0 + i % (c1 - c0)] = total;
    return;
  }
  if (!(total > Num<R>::neg_inf())) return;  // impossible: zero posteriors (uniform over the block)

  R* b = beta_buf + (i64)(L & 1) * S;
  for (int s = s0 + tid; s < s1; s += nt) b[s] = final_[s];
  __syncthreads();
  if (log_init) leak_beta<R>(b, log_init, log_c, s0, s1);

  for (int t = L - 1; t >= 0; --t) {
    const R* bn = beta_buf + (i64)((t + 1) & 1) * S;
    R* bc = beta_buf + (i64)(t & 1) * S;
    const R* x = X + (i64)t * C;
    const R* a = alpha + (i64)t * S;
    for (int c = c0 + tid; c < c1; c += nt) {
      R sum = R(0);
      const R xc = x[c];
      for (int k = ca_ptr[c], e = ca_ptr[c + 1]; k < e; ++k)
        sum += Num<R>::exp_(a[ca_src[k]] + ca_lp[k] + xc + bn[ca_dst[k]] - total);
      post[(i64)t * C + c] = sum;
    }
    for (int s = s0 + tid; s < s1; s += nt) {
      LogAcc<R> acc;
      acc.init();
      for (int k = out_ptr[s], e = out_ptr[s + 1]; k < e; ++k) acc.add(out_lp[k] + x[out_col[k]] + bn[out_dst[k]]);
      bc[s] = acc.result();
    }
    __syncthreads();
    if (log_init) leak_beta<R>(bc, log_init, log_c, s0, s1);
  }
}

}  // namespace chainfb
