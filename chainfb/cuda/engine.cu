// The forward-backward engine on the GPU over a lattice with one graph
// instance per sequence (chainfb.lattice.Lattice): block n runs sequence n
// with the recursion of forward_backward.cuh, reading the lattice-wide arrays
// (global state and column ids, so gs = gc = io = 0 in its SeqSpan).
//
// Lattice arrays (all int32 unless noted, built once on the host):
//   state_off [N+1], col_off [N+1]: each sequence's contiguous states/columns
//   start [N], final [S] (R)
//   in_ptr [S+1], in_src [A], in_lp [A] (R), in_col [A]: arcs into each state
//   out_ptr [S+1], out_dst [A], out_lp [A] (R), out_col [A]: arcs out of each state
//   ca_ptr [C+1], ca_src [A], ca_dst [A], ca_lp [A] (R): arcs of each column
//   in_span [A], out_span [A], ca_span [A]: the frames each arc covers, in the
//     order of in_src / out_dst / ca_src (all three nullptr: every arc covers one)
// X [T, C] compact scores (frames >= length are set to -inf here, as on CPU)
// alpha [(T+1), S] (R): alpha_t of sequence n at row t for t <= lengths[n]
// log_init [S] (R) or nullptr: the leaky HMM's initial log-probabilities.
#include "forward_backward.cuh"

namespace chainfb {

__device__ __forceinline__ SeqSpan lattice_span(const int* state_off, const int* col_off, const int* start) {
  const int n = blockIdx.x;
  SeqSpan q;
  q.s0 = state_off[n];
  q.s1 = state_off[n + 1];
  q.c0 = col_off[n];
  q.c1 = col_off[n + 1];
  q.gs = q.gc = q.io = 0;
  q.start = start ? start[n] : 0;
  return q;
}

template <typename R>
CHAINFB_KERNEL void fb_forward(const int* state_off, const int* col_off, const int* start, const R* final_,
                               const int* in_ptr, const int* in_src, const R* in_lp, const int* in_col,
                               const int* in_span, const i64* lengths, R* X, int T, int C, R* alpha, int S,
                               const R* log_init, R log_c, R* loglike) {
  forward_body<R>(lattice_span(state_off, col_off, start), final_, in_ptr, in_src, in_lp, in_col, in_span,
                  lengths[blockIdx.x], X, T, C, alpha, S, log_init, log_c, loglike);
}

// beta_buf [max_span + 1, S] (R) (max_span: the longest span, 1 without span
// arrays); post [T, C] (R), zero-filled by the caller.
template <typename R>
CHAINFB_KERNEL void fb_backward(const int* state_off, const int* col_off, const R* final_, const int* out_ptr,
                                const int* out_dst, const R* out_lp, const int* out_col, const int* out_span,
                                const int* ca_ptr, const int* ca_src, const int* ca_dst, const R* ca_lp,
                                const int* ca_span, const i64* lengths, const R* X, int T, int C, const R* alpha,
                                int S, const R* log_init, R log_c, const R* loglike, R* beta_buf, int max_span,
                                R* post) {
  backward_body<R>(lattice_span(state_off, col_off, nullptr), final_, out_ptr, out_dst, out_lp, out_col, out_span,
                   ca_ptr, ca_src, ca_dst, ca_lp, ca_span, lengths, X, T, C, alpha, S, log_init, log_c, loglike,
                   beta_buf, max_span, post);
}

}  // namespace chainfb
