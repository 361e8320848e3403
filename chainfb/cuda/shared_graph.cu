// The forward-backward engine on the GPU for N sequences over ONE graph (the
// LF-MMI denominator): every block reads the same graph-local arrays.
//
// Derivation.  The lattice of N sequences on one graph G (Sg states, K
// distinct pdfs = columns per sequence, sorted) is N shifted copies of G:
// state s of sequence n is n*Sg + s, column k of sequence n is n*K + k, and
// copy n's arcs are G's arcs with both ends shifted by n*Sg and their column
// by n*K (chainfb.lattice.Lattice builds it so).  engine.cu reads those N
// copies from lattice-wide arrays; here every block reads G's own CSR and
// chunks and adds the shift itself: forward_backward.cuh's SeqSpan with s0 =
// gs = n*Sg, c0 = gc = n*K and every sequence on G's chunks [0, J).  The arithmetic
// (arc order, summation order, reductions) is exactly engine.cu's, so the
// results are the same bits; what changes is the memory: one copy of the
// graph (a few hundred KB for a Kaldi den graph, resident in L2 and shared by
// all blocks) instead of N, and nothing to rebuild or upload when N changes.
//
// Layout: as engine.cu (fb_shared_recursion: a block per sequence and
// direction, the frame loop inside the kernel, threads striding over the
// graph's states; fb_shared_posteriors: a block per sequence and range of
// frames, threads striding over the graph's chunks).
// Kaldi's denominator kernel instead runs one thread per (state, sequence)
// and launches once per frame, with the sequence index innermost in its
// alphas; here no launch per frame and no grid-wide synchronisation are
// needed (a sequence's frames depend only on its own previous frame), and it
// is the engine's layout for every other lattice.
//
// Graph arrays (int32 unless noted, graph-local ids, built once on the host):
//   start [1]: G's start state; final [Sg] (R)
//   in_ptr [Sg+1], in_src [A], in_lp [A] (R), in_col [A]: arcs into each state
//   out_ptr [Sg+1], out_dst [A], out_lp [A] (R), out_col [A]: arcs out of each state
//   ca_src [A], ca_dst [A], ca_lp [A] (R), chunk_arc [J+1], chunk_col [J],
//   chunk_sole [J], mc_col [Mc], mc_begin [Mc], mc_end [Mc]: the arcs by column
//     and their chunks (see engine.cu)
//   in_span [A], out_span [A], ca_span [A]: the frames each arc covers (all
//     three nullptr: every arc covers one)
// X [T, C] (C = N*K), alpha and beta [(T+1), S] (S = N*Sg), offs / qoffs
// [N, T+1], loglike / lz [N], post [T, C] as in engine.cu.
// log_init (R): nullptr (no leaky HMM), G's [Sg] shared by every sequence
// (init_per_seq = 0) or [S], one per sequence (init_per_seq = 1).  A block
// whose sequence would reach past S states or C columns (a grid larger than S
// / Sg) does nothing.
#include "forward_backward.cuh"

namespace chainfb {

// Sequence n's span over the graph, or false when it would fall outside S / C.
__device__ __forceinline__ bool shared_span(SeqSpan* q, int n, const int* start, int Sg, int K, int J, int Mc, int S,
                                            int C, int init_per_seq) {
  if ((i64)(n + 1) * Sg > (i64)S || (i64)(n + 1) * K > (i64)C) return false;
  q->s0 = q->gs = n * Sg;
  q->s1 = q->s0 + Sg;
  q->c0 = q->gc = n * K;
  q->c1 = q->c0 + K;
  q->start = start ? q->s0 + start[0] : 0;
  q->io = init_per_seq ? 0 : q->s0;
  q->j0 = 0;
  q->j1 = J;
  q->m0 = 0;
  q->m1 = Mc;
  q->p0 = 0;
  return true;
}

// Block n < N: sequence n's forward; block N + n: its backward (as engine.cu).
template <typename R>
CHAINFB_RECURSION_KERNEL
void fb_shared_recursion(int N, const int* start, const R* final_, const int* in_ptr, const int* in_src,
                         const R* in_lp, const int* in_col, const int* in_span, const int* out_ptr, const int* out_dst,
                         const R* out_lp, const int* out_col, const int* out_span, int max_span, int Sg, int K,
                         int init_per_seq, const i64* lengths, R* X, int T, int C, R* alpha, R* beta, int S,
                         double* offs, double* qoffs, int mode, int lanes, const R* log_init, R log_c, R* loglike,
                         R* lz) {
  const int b = blockIdx.x, n = b < N ? b : b - N;
  SeqSpan q;
  if (!shared_span(&q, n, start, Sg, K, 0, 0, S, C, init_per_seq)) return;
  if (b < N)
    forward_body<R>(q, n, final_, in_ptr, in_src, in_lp, in_col, in_span, max_span, lengths[n], X, T, C, alpha, S,
                    offs + (i64)n * (T + 1), mode, lanes, log_init, log_c, loglike, lz);
  else
    beta_body<R>(q, final_, out_ptr, out_dst, out_lp, out_col, out_span, max_span, lengths[n], X, T, C, beta, S,
                 qoffs + (i64)n * (T + 1), mode, lanes, log_init, log_c);
}

// Block (n, g): sequence n's posteriors at frames [g * F, (g + 1) * F).
template <typename R>
CHAINFB_KERNEL void fb_shared_posteriors(int N, int F, const int* ca_src, const int* ca_dst, const R* ca_lp,
                                         const int* ca_span, int max_span, const int* chunk_arc,
                                         const int* chunk_col, const int* chunk_sole, const int* mc_col,
                                         const int* mc_begin, const int* mc_end, int J, int Mc, int Sg, int K,
                                         const i64* lengths, const R* X, int T, int C, const R* alpha, const R* beta,
                                         int S, const double* offs, const double* qoffs, const R* loglike,
                                         const R* lz, R* post) {
  const int n = (int)(blockIdx.x % (unsigned)N), t0 = (int)(blockIdx.x / (unsigned)N) * F;
  SeqSpan q;
  if (!shared_span(&q, n, nullptr, Sg, K, J, Mc, S, C, 0)) return;
  posterior_body<R>(q, n, t0, t0 + F, ca_src, ca_dst, ca_lp, ca_span, max_span, chunk_arc, chunk_col, chunk_sole,
                    mc_col, mc_begin, mc_end, lengths, X, T, C, alpha, beta, S, offs + (i64)n * (T + 1),
                    qoffs + (i64)n * (T + 1), loglike, lz, post);
}

}  // namespace chainfb
