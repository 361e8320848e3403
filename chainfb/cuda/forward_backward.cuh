// The forward-backward recursion of one sequence, run by one block: the
// bodies shared by the engine's kernels (engine.cu: a lattice with one graph
// instance per sequence; shared_graph.cu: one graph read by every sequence).
// The same recursion as chainfb/engines/numpy_log.py::forward_backward, log
// domain, R = float or double, the frame loop inside the kernel, threads
// striding over the sequence's states (and over its columns for the
// posteriors).
//
// A kernel describes where its sequence's data lives with a SeqSpan:
//   states [s0, s1): the sequence's entries in every row of alpha [(T+1), S]
//     and of beta_buf [2, S];
//   columns [c0, c1): its columns of X [T, C] and post [T, C];
//   gs, gc: the origin of the arc arrays (CSR).  State s is CSR row s - gs
//     (in_ptr, out_ptr, final_) and a state id i stored in an arc (in_src,
//     out_dst, ca_src, ca_dst) is state gs + i; column c is CSR row c - gc
//     (ca_ptr) and a column id k stored in an arc (in_col, out_col) is
//     column gc + k.  gs = gc = 0 for arrays over the whole lattice (global
//     ids); gs = s0, gc = c0 for one graph-local CSR shared by all sequences;
//   start: the sequence's start state (global);
//   io: log_init is read at s - io (0: log_init spans every state, [S];
//     s0: one graph-local log_init shared by all sequences).
//
// Arc arrays (int32 unless noted, built once on the host):
//   final_ (R), in_ptr, in_src, in_lp (R), in_col: arcs into each state
//   out_ptr, out_dst, out_lp (R), out_col: arcs out of each state
//   ca_ptr, ca_src, ca_dst, ca_lp (R): arcs of each column, in a fixed order,
//     so each column's posterior is summed deterministically
//   in_span, out_span, ca_span: the frames each arc covers (>= 1), in the
//     order of in_src / out_dst / ca_src; nullptr when every arc covers one
// Spans (chainfb.engines.numpy_log's contract): an arc read at frame t lands
// at frame t + k, so alpha_t sums over arcs of span k <= t the terms
// alpha_{t-k}(src) + lp + X[t-k, col] (every row of alpha is kept, and the
// recursion is in the log domain: no per-frame scale to undo), and beta_t
// over arcs with t + k <= L the terms lp + X[t, col] + beta_{t+k}(dst), with
// beta rows in a ring of max_span + 1 (row t % (max_span + 1)).  An arc
// landing past L is never on a path.  A span outside [1, max_span] is
// skipped, so no value of it moves an access out of the arrays.  With every
// span 1 the operations, and so the bits, are those of the one-frame
// recursion.
// Leaky HMM when log_init != nullptr:
//   alpha'(i) = alpha(i) + c * sum_j alpha(j) * init(i)
//   beta'(i)  = beta(i)  + c * sum_j init(j) * beta(j)      (sums per sequence)
// with log_c = log(c) (-inf for c = 0: the path still starts from log_init).
// lengths are clamped to [0, T] here: device lengths are unchecked, and no
// value of them moves an access out of the arrays.
// NaN as in the NumPy engine: a NaN score of sequence n in a frame <
// lengths[n] makes loglike[n] NaN and every posterior of n's columns at
// frames t < lengths[n] NaN (zero past it); other sequences are unaffected.
#ifndef CHAINFB_FORWARD_BACKWARD_CUH
#define CHAINFB_FORWARD_BACKWARD_CUH

#include "common.cuh"

namespace chainfb {

struct SeqSpan {
  int s0, s1, c0, c1, gs, gc, start, io;
};

// a[s] <- log_add(a[s], log_c + logsum_j a[j] + log_init[s - io]) over [s0, s1)
template <typename R>
__device__ void leak_alpha(R* a, const R* log_init, int io, R log_c, int s0, int s1) {
  LogAcc<R> acc;
  acc.init();
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x) acc.add(a[s]);
  R tot = group_logsum<R>(acc, blockDim.x);
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x)
    a[s] = log_add<R>(a[s], log_c + tot + log_init[s - io]);
  __syncthreads();
}

// b[s] <- log_add(b[s], log_c + logsum_j (log_init[j - io] + b[j])) over [s0, s1)
template <typename R>
__device__ void leak_beta(R* b, const R* log_init, int io, R log_c, int s0, int s1) {
  LogAcc<R> acc;
  acc.init();
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x) acc.add(b[s] + log_init[s - io]);
  R tot = group_logsum<R>(acc, blockDim.x);
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x) b[s] = log_add<R>(b[s], log_c + tot);
  __syncthreads();
}

// Alphas of rows 0..L and loglike[n]; frames >= L of the sequence's columns
// of X are set to -inf.
template <typename R>
__device__ void forward_body(const SeqSpan& q, const R* final_, const int* in_ptr, const int* in_src,
                             const R* in_lp, const int* in_col, const int* in_span, i64 length, R* X, int T, int C,
                             R* alpha, int S,
                             const R* log_init, R log_c, R* loglike) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int s0 = q.s0, s1 = q.s1, gs = q.gs, gc = q.gc;
  const int c0 = q.c0, nc = q.c1 - q.c0;
  const int L = clamp_len(length, T);
  const R ninf = Num<R>::neg_inf();
  bool nan = false;  // this thread saw a NaN alpha (NumPy's normalisation spreads it to the whole sequence)

  // frames past the length never contribute (and the caller sees them as -inf)
  const i64 masked = (i64)(T - L) * nc;
  for (i64 i = tid; i < masked; i += nt) X[(i64)(L + (int)(i / nc)) * C + c0 + (int)(i % nc)] = ninf;

  for (int s = s0 + tid; s < s1; s += nt) {
    alpha[s] = log_init ? log_init[s - q.io] : (s == q.start ? R(0) : ninf);
    nan = nan || alpha[s] != alpha[s];
  }
  __syncthreads();
  if (log_init) leak_alpha<R>(alpha, log_init, q.io, log_c, s0, s1);

  for (int t = 1; t <= L; ++t) {
    R* cur = alpha + (i64)t * S;
    for (int s = s0 + tid; s < s1; s += nt) {
      LogAcc<R> acc;
      acc.init();
      if (in_span) {
        for (int a = in_ptr[s - gs], e = in_ptr[s - gs + 1]; a < e; ++a) {
          const int k = in_span[a];
          if (k < 1 || k > t) continue;  // read before frame 0 (or not a span)
          const i64 f = t - k;
          acc.add(alpha[f * S + gs + in_src[a]] + in_lp[a] + X[f * C + gc + in_col[a]]);
        }
      } else {
        const R* prev = alpha + (i64)(t - 1) * S;
        const R* x = X + (i64)(t - 1) * C;
        for (int a = in_ptr[s - gs], e = in_ptr[s - gs + 1]; a < e; ++a)
          acc.add(prev[gs + in_src[a]] + in_lp[a] + x[gc + in_col[a]]);
      }
      cur[s] = acc.result();
      nan = nan || acc.is_nan();
    }
    __syncthreads();
    if (log_init) leak_alpha<R>(cur, log_init, q.io, log_c, s0, s1);
  }

  LogAcc<R> acc;
  acc.init();
  const R* last = alpha + (i64)L * S;
  for (int s = s0 + tid; s < s1; s += nt) acc.add(last[s] + final_[s - gs]);
  if (nan) acc.add(Num<R>::nan());
  R tot = group_logsum<R>(acc, blockDim.x);
  if (tid == 0) loglike[blockIdx.x] = tot;
}

// Posteriors post[t, c] for t < lengths[n] (the caller zero-fills post).
// beta_buf [max_span + 1, S] (R) holds beta_t .. beta_{t+max_span} (max_span
// = 1 without span arrays: beta_{t+1} and beta_t).
template <typename R>
__device__ void backward_body(const SeqSpan& q, const R* final_, const int* out_ptr, const int* out_dst,
                              const R* out_lp, const int* out_col, const int* out_span, const int* ca_ptr,
                              const int* ca_src, const int* ca_dst, const R* ca_lp, const int* ca_span,
                              const i64* lengths, const R* X, int T, int C, const R* alpha, int S,
                              const R* log_init, R log_c, const R* loglike, R* beta_buf, int max_span, R* post) {
  const int n = blockIdx.x;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int s0 = q.s0, s1 = q.s1, gs = q.gs, gc = q.gc;
  const int c0 = q.c0, c1 = q.c1;
  const int L = clamp_len(lengths[n], T);
  const R total = loglike[n];
  if (total != total) {  // NaN (uniform over the block): NaN posteriors up to the length, as NumPy
    const i64 cells = (i64)L * (c1 - c0);
    for (i64 i = tid; i < cells; i += nt) post[(i / (c1 - c0)) * C + c0 + i % (c1 - c0)] = total;
    return;
  }
  if (!(total > Num<R>::neg_inf())) return;  // impossible: zero posteriors (uniform over the block)

  const int M = (out_span && ca_span && max_span > 1) ? max_span : 1;  // ring of M + 1 beta rows
  R* b = beta_buf + (i64)(L % (M + 1)) * S;
  for (int s = s0 + tid; s < s1; s += nt) b[s] = final_[s - gs];
  __syncthreads();
  if (log_init) leak_beta<R>(b, log_init, q.io, log_c, s0, s1);

  for (int t = L - 1; t >= 0; --t) {
    R* bc = beta_buf + (i64)(t % (M + 1)) * S;
    const R* x = X + (i64)t * C;
    const R* a = alpha + (i64)t * S;
    const int reach = L - t < M ? L - t : M;  // the longest span landing by frame L
    if (M == 1) {
      const R* bn = beta_buf + (i64)((t + 1) & 1) * S;
      for (int c = c0 + tid; c < c1; c += nt) {
        R sum = R(0);
        const R xc = x[c];
        for (int k = ca_ptr[c - gc], e = ca_ptr[c - gc + 1]; k < e; ++k)
          sum += Num<R>::exp_(a[gs + ca_src[k]] + ca_lp[k] + xc + bn[gs + ca_dst[k]] - total);
        post[(i64)t * C + c] = sum;
      }
      for (int s = s0 + tid; s < s1; s += nt) {
        LogAcc<R> acc;
        acc.init();
        for (int k = out_ptr[s - gs], e = out_ptr[s - gs + 1]; k < e; ++k)
          acc.add(out_lp[k] + x[gc + out_col[k]] + bn[gs + out_dst[k]]);
        bc[s] = acc.result();
      }
    } else {
      for (int c = c0 + tid; c < c1; c += nt) {
        R sum = R(0);
        const R xc = x[c];
        for (int k = ca_ptr[c - gc], e = ca_ptr[c - gc + 1]; k < e; ++k) {
          const int d = ca_span[k];
          if (d < 1 || d > reach) continue;  // lands past L (or not a span)
          const R* bn = beta_buf + (i64)((t + d) % (M + 1)) * S;
          sum += Num<R>::exp_(a[gs + ca_src[k]] + ca_lp[k] + xc + bn[gs + ca_dst[k]] - total);
        }
        post[(i64)t * C + c] = sum;
      }
      for (int s = s0 + tid; s < s1; s += nt) {
        LogAcc<R> acc;
        acc.init();
        for (int k = out_ptr[s - gs], e = out_ptr[s - gs + 1]; k < e; ++k) {
          const int d = out_span[k];
          if (d < 1 || d > reach) continue;
          const R* bn = beta_buf + (i64)((t + d) % (M + 1)) * S;
          acc.add(out_lp[k] + x[gc + out_col[k]] + bn[gs + out_dst[k]]);
        }
        bc[s] = acc.result();
      }
    }
    __syncthreads();
    if (log_init) leak_beta<R>(bc, log_init, q.io, log_c, s0, s1);
  }
}

}  // namespace chainfb

#endif  // CHAINFB_FORWARD_BACKWARD_CUH
