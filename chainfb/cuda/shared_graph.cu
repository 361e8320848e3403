// The forward-backward engine on the GPU for N sequences over ONE graph (the
// LF-MMI denominator): every block reads the same graph-local arrays.
//
// Derivation.  The lattice of N sequences on one graph G (Sg states, K
// distinct pdfs = columns per sequence, sorted) is N shifted copies of G:
// state s of sequence n is n*Sg + s, column k of sequence n is n*K + k, and
// copy n's arcs are G's arcs with both ends shifted by n*Sg and their column
// by n*K (chainfb.lattice.Lattice builds it so).  engine.cu reads those N
// copies from lattice-wide arrays; here block n reads G's own CSR and adds
// the shift itself: forward_backward.cuh's SeqSpan with s0 = gs = n*Sg and
// c0 = gc = n*K.  The arithmetic (arc order, summation order, reductions) is
// exactly engine.cu's, so for the same block size the results are the same
// bits; what changes is the memory: one copy of the graph (a few hundred KB
// for a Kaldi den graph, resident in L2 and shared by all blocks) instead of
// N, and nothing to rebuild or upload when N changes.
//
// Layout: one block per sequence, the frame loop inside the kernel, threads
// striding over the graph's states (and over its columns for the
// posteriors).  Kaldi's denominator kernel instead runs one thread per
// (state, sequence) and launches once per frame, with the sequence index
// innermost in its alphas; here no launch per frame and no grid-wide
// synchronisation are needed (a sequence's frames depend only on its own
// previous frame), and it is the engine's layout for every other lattice.
//
// Graph arrays (int32 unless noted, graph-local ids, built once on the host):
//   start [1]: G's start state; final [Sg] (R)
//   in_ptr [Sg+1], in_src [A], in_lp [A] (R), in_col [A]: arcs into each state
//   out_ptr [Sg+1], out_dst [A], out_lp [A] (R), out_col [A]: arcs out of each state
//   ca_ptr [K+1], ca_src [A], ca_dst [A], ca_lp [A] (R): arcs of each column
//   in_span [A], out_span [A], ca_span [A]: the frames each arc covers (all
//     three nullptr: every arc covers one)
// X [T, C] (C = N*K), alpha [(T+1), S] and beta_buf [max_span + 1, S] (S = N*Sg), post
// [T, C] as in engine.cu.  log_init (R): nullptr (no leaky HMM), G's [Sg]
// shared by every sequence (init_per_seq = 0) or [S], one per sequence
// (init_per_seq = 1).  A block whose sequence would reach past S states or C
// columns (a grid larger than S / Sg) does nothing.
#include "forward_backward.cuh"

namespace chainfb {

// Sequence blockIdx.x's span, or false when it would fall outside S / C.
__device__ __forceinline__ bool shared_span(SeqSpan* q, const int* start, int Sg, int K, int S, int C,
                                            int init_per_seq) {
  const i64 n = blockIdx.x;
  if ((n + 1) * Sg > (i64)S || (n + 1) * K > (i64)C) return false;
  q->s0 = q->gs = (int)(n * Sg);
  q->s1 = q->s0 + Sg;
  q->c0 = q->gc = (int)(n * K);
  q->c1 = q->c0 + K;
  q->start = start ? q->s0 + start[0] : 0;
  q->io = init_per_seq ? 0 : q->s0;
  return true;
}

template <typename R>
CHAINFB_KERNEL void fb_shared_forward(const int* start, const R* final_, const int* in_ptr, const int* in_src,
                                      const R* in_lp, const int* in_col, const int* in_span, int Sg, int K,
                                      int init_per_seq, const i64* lengths, R* X, int T, int C, R* alpha, int S,
                                      const R* log_init, R log_c, R* loglike) {
  SeqSpan q;
  if (!shared_span(&q, start, Sg, K, S, C, init_per_seq)) return;
  forward_body<R>(q, final_, in_ptr, in_src, in_lp, in_col, in_span, lengths[blockIdx.x], X, T, C, alpha, S,
                  log_init, log_c, loglike);
}

template <typename R>
CHAINFB_KERNEL void fb_shared_backward(const R* final_, const int* out_ptr, const int* out_dst, const R* out_lp,
                                       const int* out_col, const int* out_span, const int* ca_ptr,
                                       const int* ca_src, const int* ca_dst, const R* ca_lp, const int* ca_span,
                                       int Sg, int K, int init_per_seq, const i64* lengths, const R* X, int T,
                                       int C, const R* alpha, int S, const R* log_init, R log_c,
                                       const R* loglike, R* beta_buf, int max_span, R* post) {
  SeqSpan q;
  if (!shared_span(&q, nullptr, Sg, K, S, C, init_per_seq)) return;
  backward_body<R>(q, final_, out_ptr, out_dst, out_lp, out_col, out_span, ca_ptr, ca_src, ca_dst, ca_lp, ca_span,
                   lengths, X, T, C, alpha, S, log_init, log_c, loglike, beta_buf, max_span, post);
}

}  // namespace chainfb
