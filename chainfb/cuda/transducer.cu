// Transducer score maps on the GPU: the fused log-softmax + skewed gather of
// the engine's scores from 4-D logits, and the fused gradient.  In = storage
// type of the logits (float, double, F16, BF16), R = compute type (float for
// the 16/32-bit inputs, double for double).
//
// logits [B, T, U1, V] contiguous.  Each row (b, u) of the transducer grid
// has J arc kinds j = 0..J-1, described by two tables of shape [B, U1, J]:
// sym (the vocabulary index the arc reads, or -1) and colidx (the arc's
// compact engine column, or -1).  Entry (b, u, j) is used iff colidx >= 0
// and sym >= 0; the kernels attach no meaning to j.  Device tables are not
// range-checked on the host: an entry with colidx >= C or sym >= V is
// ignored like an unused one, and any lengths are safe (they only decide
// which in-bounds rows are live).  A NaN logit makes its row's lse NaN
// (and so every score gathered from that row, and its gradient row).  Row (b, t, u) is live
// iff t < T_b and u <= U_b.  A group of `tpr` consecutive threads (a power of
// two dividing blockDim.x) handles one row: lanes stride over the
// vocabulary, so reads are coalesced.
#include "common.cuh"

#ifndef CHAINFB_MAX_J
#define CHAINFB_MAX_J 16
#endif

namespace chainfb {

// X[t+u, colidx[b,u,j]] = logits[b,t,u,sym[b,u,j]] - lse[b,t,u] for live rows
// and used entries (other entries of X are left as they are: the caller
// fills X with -inf); lse_out[b,t,u] = logsumexp_k logits[b,t,u,k] (0 when
// !fused) for live rows.
template <typename In, typename R>
CHAINFB_KERNEL void transducer_gather(const In* logits, int B, int T, int U1, int V, const int* sym,
                                  const int* colidx, int J, const int* T_len, const int* U_len, int fused, int tpr,
                                  R* X, int num_rows, int C, R* lse_out) {
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
  const i64 e0 = ((i64)b * U1 + u) * J;
  for (int j = lane; j < J; j += tpr) {
    const int col = colidx[e0 + j], k = sym[e0 + j];
    if (col < 0 || col >= C || k < 0 || k >= V) continue;  // unused (or out of range: ignored)
    X[(i64)n * C + col] = (R)Storage<In>::load(p[k]) - norm;
  }
}

// X[n, zero_col[b]] = 0 for n < T_b + U_b (a column that scores 0 on every
// step of utterance b, e.g. a multi-blank "no pdf" column).
template <typename R>
CHAINFB_KERNEL void transducer_zero_col(const int* zero_col, const int* T_len, const int* U_len, int B, R* X,
                                    int num_rows, int C) {
  const i64 total = (i64)B * num_rows;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    const int b = (int)(i / num_rows), n = (int)(i % num_rows);
    const int zc = zero_col[b];
    if (zc >= 0 && zc < C && (i64)n < (i64)T_len[b] + U_len[b]) X[(i64)n * C + zc] = R(0);
  }
}

// grad[b,t,u,k] = scale[b] * clamp(softmax_k * sum_j w_j post_j
//                                   - sum_j w_j post_j [k == sym_j])
// post_j = post[t+u, colidx[b,u,j]] for used entries, 0 otherwise;
// w = kind_weight [J]; no softmax term when !fused; zero on dead rows and on
// every row of an utterance with scale[b] == 0 (even where the formula is NaN);
// clamp to [-clamp, clamp] only when clamp > 0.
template <typename In, typename R>
CHAINFB_KERNEL void transducer_grad(const In* logits, int B, int T, int U1, int V, const int* sym, const int* colidx,
                                int J, const int* T_len, const int* U_len, int fused, int tpr, const R* post,
                                int num_rows, int C, const R* lse, const R* scale, const R* kind_weight, R clamp,
                                In* grad) {
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
  if (!(t < T_len[b] && u <= U_len[b]) || n >= num_rows || scale[b] == R(0)) {
    for (int k = lane; k < V; k += tpr) g[k] = Storage<In>::store(R(0));
    return;
  }
  const i64 e0 = ((i64)b * U1 + u) * J;
  int s[CHAINFB_MAX_J];
  R pw[CHAINFB_MAX_J];
  R soft_w = R(0);
  for (int j = 0; j < J; ++j) {
    const int col = colidx[e0 + j], k = sym[e0 + j];
    const bool used = col >= 0 && col < C && k >= 0 && k < V;  // out-of-range entries are ignored
    s[j] = used ? k : -1;
    pw[j] = used ? kind_weight[j] * post[(i64)n * C + col] : R(0);
    soft_w += pw[j];
  }
  const R norm = lse[row];
  const R sc = scale[b];
  for (int k = lane; k < V; k += tpr) {
    R v = fused ? Num<R>::exp_((R)Storage<In>::load(p[k]) - norm) * soft_w : R(0);
    for (int j = 0; j < J; ++j)
      if (s[j] == k) v -= pw[j];
    if (clamp > R(0)) v = v < -clamp ? -clamp : (v > clamp ? clamp : v);
    g[k] = Storage<In>::store(sc * v);
  }
}

}  // namespace chainfb
