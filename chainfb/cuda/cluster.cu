// The engine's recursion with one sequence's direction spread over a thread
// block cluster (sm_90 and later): fb_recursion of engine.cu (same
// arguments, same lattice arrays, same results to the bit) where K blocks
// run each of its forward and backward instead of one.
//
// Why.  One block runs a direction of a sequence a frame at a time, its
// threads striding over the sequence's states, so a frame costs as many
// dependent state steps as the busiest thread carries: ceil(W / threads),
// with at most 1024 threads.  A long CTC graph (W = 2S + 1 = 2001 states at
// S = 1000) gives two states a thread, and a batch of few sequences leaves
// most SMs idle (2N blocks).  A cluster of K blocks gives the direction K
// times the threads, on K SMs.
//
// How.  The group of a direction is the cluster's K * blockDim.x threads:
// thread tid of block rank r is thread r * blockDim.x + tid of the group,
// and the group strides over the states as one block does (the same states
// per thread as a block of K * blockDim.x threads would give).  Each frame's
// row goes to device memory (the rows' mode 0, with or without the arc
// table: a shared-memory ring would hold only the block's own states), and
// the frame's barrier is the cluster's (cluster_sync: it also publishes
// every block's row to the others).  The row's largest value, which the
// next frame's offset needs, is a maximum over the cluster: each warp
// pushes its largest value into every block's shared memory
// (Group::put_max, distributed shared memory), and after the barrier each
// block reads the K blocks' partials locally (Group::max).  Each state's sum
// reads the same values in the same order as in fb_recursion, and a maximum
// does not depend on the order of its terms, so every K gives the same bits.
// The first block of the forward's cluster sums the last row (loglike, lz).
// The leaky HMM is not run here (its per-frame sums are block-wide): the
// launcher refuses it, and a call with it gets NaN.
//
// Grid: 2N clusters of K blocks (N: forward only): cluster c < N runs
// sequence c's forward, cluster N + n sequence n's backward.  Dynamic shared
// memory: the partials [2, K * 32] (R) first, then what `mode` keeps (the
// arc table, see forward_backward.cuh).
#include "engine.cu"

namespace chainfb {

template <typename R, int K>
CHAINFB_CLUSTER_KERNEL(K)
void fb_cluster_recursion(int N, const int* state_off, const int* col_off, const int* start, const R* final_,
                          const int* in_ptr, const int* in_src, const R* in_lp, const int* in_col, const int* in_span,
                          const int* out_ptr, const int* out_dst, const R* out_lp, const int* out_col,
                          const int* out_span, int max_span, const i64* lengths, R* X, int T, int C, R* alpha,
                          R* beta, int S, double* offs, double* qoffs, int mode, int lanes, const R* log_init,
                          R log_c, R* loglike, R* lz) {
  const int b = (int)(blockIdx.x / (unsigned)K), n = b < N ? b : b - N;
  if (log_init) {  // the leaky HMM is refused by the launcher: a NaN result, never a block-wide sum
    if (b < N && blockIdx.x % (unsigned)K == 0 && threadIdx.x == 0) loglike[n] = lz[n] = Num<R>::nan();
    return;
  }
  cluster_sync();  // every block of the cluster has started: its shared memory may be written
  const SeqSpan q = lattice_span(n, state_off, col_off, start, nullptr, nullptr);
  mode &= kArcTable;  // rows and scores in device memory (a ring in shared memory would hold one block's states)
  if (b < N)
    forward_body<R, K>(q, n, final_, in_ptr, in_src, in_lp, in_col, in_span, max_span, lengths[n], X, T, C, alpha,
                       S, offs + (i64)n * (T + 1), mode, lanes, log_init, log_c, loglike, lz);
  else
    beta_body<R, K>(q, final_, out_ptr, out_dst, out_lp, out_col, out_span, max_span, lengths[n], X, T, C, beta, S,
                    qoffs + (i64)n * (T + 1), mode, lanes, log_init, log_c);
}

}  // namespace chainfb
