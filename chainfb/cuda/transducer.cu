// Transducer score maps on the GPU: the fused log-softmax + skewed gather of
// the engine's scores from 4-D logits, and the fused gradient.  In = storage
// type of the logits (float, double, F16, BF16), R = compute type (float for
// the 16/32-bit inputs, double for double).
//
// logits [B, T, U1, V] contiguous; targets [B, U1-1]; colidx [B, U1, M2]
// (M2 = 2 + number of big blanks): compact column of (b, u, j) or -1, with
// symbol blank for j = 0, targets[b, u] for j = 1 (only u < U_b) and
// big_blank[j-2] for j >= 2.  Row (b, t, u) is live iff t < T_b and u <= U_b.
// A group of `tpr` consecutive threads (a power of two dividing blockDim.x)
// handles one row: lanes stride over the vocabulary, so reads are coalesced.
#include "common.cuh"

#ifndef CHAINFB_MAX_J
#define CHAINFB_MAX_J 16
#endif

namespace chainfb {

__device__ __forceinline__ int row_symbol(int j, int b, int u, int Umax, int blank, const int* targets,
                                          const int* big_blank) {
  return j == 0 ? blank : (j == 1 ? targets[(i64)b * Umax + u] : big_blank[j - 2]);
}

// X[t+u, colidx[b,u,j]] = logits[b,t,u,sym_j] - lse[b,t,u] for live rows
// (other entries of X are left as they are: the caller fills X with -inf);
// lse_out[b,t,u] = logsumexp_k logits[b,t,u,k] (0 when !fused) for live rows.
template <typename In, typename R>
__global__ void rnnt_gather(const In* logits, int B, int T, int U1, int V, const int* targets,
                            const int* colidx, int M2, int blank, const int* big_blank, const int* T_len,
                            const int* U_len, int fused, int tpr, R* X, int num_rows, int C, R* lse_out) {
  const int lane = threadIdx.x % tpr;
  const i64 row = (i64)blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
  const i64 rows = (i64)B * T * U1;
  int b = 0, t = 0, u = 0;
  bool live = row < rows;
  if (live) {
    b = (int)(row / ((i64)T * U1));
    t = (int)((row / U1) % T);
    u = (int)(row % U1);
    live = t < T_len[b] && u <= U_len[b];
  }
  const In* p = logits + row * V;
  LogAcc<R> acc;
  acc.init();
  if (live && fused)
    for (int k = lane; k < V; k += tpr) acc.add((R)Storage<In>::load(p[k]));
  R norm = group_logsum<R>(acc, tpr);  // every thread takes part (no early exit before it)
  if (!live) return;
  if (!fused) norm = R(0);
  if (lane == 0) lse_out[row] = norm;
  const int n = t + u;
  if (n >= num_rows) return;
  for (int j = lane; j < M2; j += tpr) {
    const int col = colidx[((i64)b * U1 + u) * M2 + j];
    if (col < 0 || (j == 1 && u >= U_len[b])) continue;
    const int sym = row_symbol(j, b, u, U1 - 1, blank, targets, big_blank);
    X[(i64)n * C + col] = (R)Storage<In>::load(p[sym]) - norm;
  }
}

// X[n, zero_col[b]] = 0 for n < T_b + U_b (a multi-blank "no pdf" column).
template <typename R>
__global__ void rnnt_zero_col(const int* zero_col, const int* T_len, const int* U_len, int B, R* X, int num_rows,
                              int C) {
  const i64 total = (i64)B * num_rows;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const int b = (int)(i / num_rows), n = (int)(i % num_rows);
    const int zc = zero_col[b];
    if (zc >= 0 && n < T_len[b] + U_len[b]) X[(i64)n * C + zc] = R(0);
  }
}

// grad[b,t,u,k] = scale[b] * clamp(softmax_k * (occ + lambda * post_1)
//                                   - sum_j post_j * w_j * [k == sym_j])
// occ = sum_j post_j, post_j = post[t+u, colidx[b,u,j]], w_1 = 1 + lambda, else 1;
// no softmax term when !fused; zero on dead rows; clamp only when clamp > 0.
template <typename In, typename R>
__global__ void rnnt_grad(const In* logits, int B, int T, int U1, int V, const int* targets, const int* colidx,
                          int M2, int blank, const int* big_blank, const int* T_len, const int* U_len, int fused,
                          int tpr, const R* post, int num_rows, int C, const R* lse, const R* scale, R fastemit,
                          R clamp, In* grad) {
  const int lane = threadIdx.x % tpr;
  const i64 row = (i64)blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
  const i64 rows = (i64)B * T * U1;
  if (row >= rows) return;
  const int b = (int)(row / ((i64)T * U1));
  const int t = (int)((row / U1) % T);
  const int u = (int)(row % U1);
  const In* p = logits + row * V;
  In* g = grad + row * V;
  const int n = t + u;
  if (!(t < T_len[b] && u <= U_len[b]) || n >= num_rows) {
    for (int k = lane; k < V; k += tpr) g[k] = Storage<In>::store(R(0));
    return;
  }
  int sym[CHAINFB_MAX_J];
  R pw[CHAINFB_MAX_J];
  R occ = R(0), p1 = R(0);
  for (int j = 0; j < M2; ++j) {
    const int col = colidx[((i64)b * U1 + u) * M2 + j];
    const bool ok = col >= 0 && !(j == 1 && u >= U_len[b]);
    const R pj = ok ? post[(i64)n * C + col] : R(0);
    sym[j] = ok ? row_symbol(j, b, u, U1 - 1, blank, targets, big_blank) : -1;
    occ += pj;
    if (j == 1) p1 = pj;
    pw[j] = j == 1 ? pj * (R(1) + fastemit) : pj;
  }
  const R soft_w = occ + fastemit * p1;
  const R norm = lse[row];
  const R sc = scale[b];
  for (int k = lane; k < V; k += tpr) {
    R v = fused ? Num<R>::exp_((R)Storage<In>::load(p[k]) - norm) * soft_w : R(0);
    for (int j = 0; j < M2; ++j)
      if (sym[j] == k) v -= pw[j];
    if (clamp > R(0)) v = v < -clamp ? -clamp : (v > clamp ? clamp : v);
    g[k] = Storage<In>::store(sc * v);
  }
}

}  // namespace chainfb
