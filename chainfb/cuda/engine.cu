// The forward-backward engine on the GPU over a lattice with one graph
// instance per sequence (chainfb.lattice.Lattice), with the recursions of
// forward_backward.cuh, reading the lattice-wide arrays (global state,
// column and chunk ids, so gs = gc = io = 0 in a SeqSpan):
//
//   fb_recursion<R>: grid N (forward only) or 2N: block n < N runs sequence
//     n's forward, block N + n its backward; the two are independent, so
//     they run at the same time on different SMs;
//   fb_posteriors<R>: grid N * G: block (n, g) writes sequence n's posteriors
//     at frames [g * F, (g + 1) * F) from the alphas and betas.
//
// Lattice arrays (all int32 unless noted, built once on the host):
//   state_off [N+1], col_off [N+1]: each sequence's contiguous states/columns
//   chunk_ptr [N+1], mc_ptr [N+1]: each sequence's chunks and columns of
//     several chunks
//   start [N], final [S] (R)
//   in_ptr [S+1], in_src [A], in_lp [A] (R), in_col [A]: arcs into each state
//   out_ptr [S+1], out_dst [A], out_lp [A] (R), out_col [A]: arcs out of each state
//   ca_src [A], ca_dst [A], ca_lp [A] (R): the arcs sorted by column
//   chunk_arc [J+1], chunk_col [J], chunk_sole [J]: chunk j covers ca arcs
//     [chunk_arc[j], chunk_arc[j+1]) of column chunk_col[j], its column's only
//     chunk when chunk_sole[j]; mc_col [Mc], mc_begin [Mc], mc_end [Mc]: the
//     columns of several chunks and their chunks [begin, end)
//   in_span [A], out_span [A], ca_span [A]: the frames each arc covers, in the
//     order of in_src / out_dst / ca_src (all three nullptr: every arc covers one)
// X [T, C] compact scores (frames >= length are set to -inf here, as on CPU)
// alpha, beta [(T+1), S] (R): the normalised rows of sequence n for t <= lengths[n]
// offs, qoffs [N, T+1] (double): the offsets P_t and Q_t
// loglike [N], lz [N] (R): P_L + z and z
// log_init [S] (R) or nullptr: the leaky HMM's initial log-probabilities.
// mode and dynamic shared memory: see forward_backward.cuh (the launcher
// sizes it for the widest sequence); fb_posteriors: [J] chunk sums of the
// sequence with the most chunks.
#ifndef CHAINFB_ENGINE_CU
#define CHAINFB_ENGINE_CU
#include "forward_backward.cuh"

namespace chainfb {

__device__ __forceinline__ SeqSpan lattice_span(int n, const int* state_off, const int* col_off, const int* start,
                                               const int* chunk_ptr, const int* mc_ptr) {
  SeqSpan q;
  q.s0 = state_off[n];
  q.s1 = state_off[n + 1];
  q.c0 = col_off[n];
  q.c1 = col_off[n + 1];
  q.gs = q.gc = q.io = 0;
  q.start = start ? start[n] : 0;
  q.j0 = chunk_ptr ? chunk_ptr[n] : 0;
  q.j1 = chunk_ptr ? chunk_ptr[n + 1] : 0;
  q.m0 = mc_ptr ? mc_ptr[n] : 0;
  q.m1 = mc_ptr ? mc_ptr[n + 1] : 0;
  q.p0 = 0;
  return q;
}

template <typename R>
CHAINFB_RECURSION_KERNEL
void fb_recursion(int N, const int* state_off, const int* col_off, const int* start, const R* final_, const int* in_ptr,
                  const int* in_src, const R* in_lp, const int* in_col, const int* in_span, const int* out_ptr,
                  const int* out_dst, const R* out_lp, const int* out_col, const int* out_span, int max_span,
                  const i64* lengths, R* X, int T, int C, R* alpha, R* beta, int S, double* offs, double* qoffs,
                  int mode, int lanes, const R* log_init, R log_c, R* loglike, R* lz) {
  const int b = blockIdx.x, n = b < N ? b : b - N;
  const SeqSpan q = lattice_span(n, state_off, col_off, start, nullptr, nullptr);
  if (b < N)
    forward_body<R>(q, n, final_, in_ptr, in_src, in_lp, in_col, in_span, max_span, lengths[n], X, T, C, alpha, S,
                    offs + (i64)n * (T + 1), mode, lanes, log_init, log_c, loglike, lz);
  else
    beta_body<R>(q, final_, out_ptr, out_dst, out_lp, out_col, out_span, max_span, lengths[n], X, T, C, beta, S,
                 qoffs + (i64)n * (T + 1), mode, lanes, log_init, log_c);
}

// post [T, C] (R), every element written (no fill beforehand); F frames a block.
template <typename R>
CHAINFB_KERNEL void fb_posteriors(int N, int F, const int* state_off, const int* col_off, const int* chunk_ptr,
                                  const int* mc_ptr, const int* ca_src, const int* ca_dst, const R* ca_lp,
                                  const int* ca_span, int max_span, const int* chunk_arc, const int* chunk_col,
                                  const int* chunk_sole, const int* mc_col, const int* mc_begin, const int* mc_end,
                                  const i64* lengths, const R* X, int T, int C, const R* alpha, const R* beta, int S,
                                  const double* offs, const double* qoffs, const R* loglike, const R* lz,
                                  R* post) {
  const int n = (int)(blockIdx.x % (unsigned)N), t0 = (int)(blockIdx.x / (unsigned)N) * F;
  const SeqSpan q = lattice_span(n, state_off, col_off, nullptr, chunk_ptr, mc_ptr);
  posterior_body<R>(q, n, t0, t0 + F, ca_src, ca_dst, ca_lp, ca_span, max_span, chunk_arc, chunk_col, chunk_sole,
                    mc_col, mc_begin, mc_end, lengths, X, T, C, alpha, beta, S, offs + (i64)n * (T + 1),
                    qoffs + (i64)n * (T + 1), loglike, lz, post);
}

}  // namespace chainfb

#endif  // CHAINFB_ENGINE_CU
