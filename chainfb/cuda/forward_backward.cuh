// The forward-backward recursion of one sequence, run by one block: the
// bodies shared by the engine's kernels (engine.cu: a lattice with one graph
// instance per sequence; shared_graph.cu: one graph read by every sequence).
// The recursion of chainfb/engines/numpy_log.py::forward_backward, log
// domain, R = float or double, the frame loop inside the kernel.
//
// Derivation.  For a sequence of L frames, with A_t / B_t the log alphas /
// betas (A_0 = start, B_L = final, an arc read at frame t spanning k frames
// lands at frame t + k) and Z = logsum_s A_L(s) + final(s):
//
//   A_t(s) = logsum_{arcs a into s, span k}  A_{t-k}(src a) + w_a + X[t-k, col a]
//   B_t(s) = logsum_{arcs a out of s, span k} w_a + X[t, col a] + B_{t+k}(dst a)
//   post[t, c] = sum_{arcs a of column c read at t} exp(A_t(src) + w + X[t, c] + B_{t+k}(dst) - Z)
//
// A_t and B_t grow with t (about T times the scores' magnitude: 2e8 for T =
// 20,000 and scores of 1e4), and a log-domain value of magnitude 2e8 carries
// an absolute rounding error of 3e-8 per operation, which accumulates along
// the recursion and reaches the posteriors.  So the rows are kept normalised
// per frame, as Kaldi's denominator does, with integer offsets:
//
//   row_t  = A_t - P_t,   P_0 = 0,  P_t = P_{t-1} + floor(max_s row_{t-1}(s))
//   brow_t = B_t - Q_t,   Q_L = 0,  Q_t = Q_{t+1} + floor(max_s brow_{t+1}(s))
//
// (an offset is 0 when its row has no finite value).  The offsets are sums of
// integers, exact in double (below 2^53), so every difference of them is
// exact, and the rows stay within a few frames' worth of scores of 0:
//
//   row_t(s)  = logsum  row_{t-k}(src) + w + X[t-k, col] + (P_{t-k} - P_t)
//   brow_t(s) = logsum  w + X[t, col] + brow_{t+k}(dst) + (Q_{t+k} - Q_t)
//   z = logsum_s row_L(s) + final(s);   Z = P_L + z
//   post[t, c] = sum  exp(row_t(src) + w + X[t, c] + brow_{t+k}(dst) + (P_t + Q_{t+k} - P_L) - z)
//
// With one-frame arcs P_{t-1} - P_t is minus the offset just taken, and the
// posterior's integer term is P_t + Q_{t+1} - P_L.  No value handled grows
// with T, and the integer terms are exact.  Each row's maximum is a
// block-wide reduction (warp shuffles, one partial per warp in shared
// memory) whose result is read after the frame's barrier: no extra barrier
// per frame.  (A direction may also run on a thread block cluster of K
// blocks, cluster.cu: the block's threads, barrier and reduction become the
// cluster's -- the bodies' template parameter K, see Group -- and every sum
// stays the same.)
//
// One more step keeps long inputs exact where the states alive at a frame
// are far apart (a numerator graph under scores of 1e4: a state that stayed
// in a well-scored phone leads the others by ~1e7 in log alpha, and the
// others' rows carry that much): with one-frame arcs, frame t's posteriors
// are divided by their own sum S_t (1 in exact arithmetic: every path reads
// one arc per frame), as the CPU engine normalises each frame by its own
// total; S_t is a block-wide sum read after the frame's barrier, and the
// division happens at the next frame's step.  Posterior sums then hold to
// rounding for any T.  (With spanning arcs a frame's arcs do not cover every
// path, and the posteriors are left as computed.)
//
// Work per frame.  Threads stride over the sequence's states (the rows) --
// in groups of `lanes` consecutive threads a state when the launcher asks
// for several (states of many arcs: each lane adds every lanes-th arc, a
// fixed shuffle butterfly merges the lanes; see Lanes) -- and
// over its *chunks* (the posteriors): the arcs of each column, sorted by
// column, are cut into chunks of at most a fixed number of arcs (a property
// of the lattice, not of the launch).  A chunk's sum is its column's
// posterior when the column has one chunk; otherwise it is a partial, kept
// in shared memory, and the next frame's step adds each such column's
// partials with one warp per column (lanes over the partials in a fixed
// order, then a fixed shuffle tree).  So a column of thousands of arcs (CTC's
// blank) costs each thread one chunk, every sum has a fixed order (the same
// bits from run to run and for every block size), and no float atomics are
// used.  Blocks are a whole number of warps (the launcher rounds up).
//
// A kernel describes where its sequence's data lives with a SeqSpan:
//   states [s0, s1): the sequence's entries in every row of alpha [(T+1), S]
//     and of beta_buf [M + 1, S];
//   columns [c0, c1): its columns of X [T, C] and post [T, C];
//   gs, gc: the origin of the arc arrays (CSR).  State s is CSR row s - gs
//     (in_ptr, out_ptr, final_) and a state id i stored in an arc (in_src,
//     out_dst, ca_src, ca_dst) is state gs + i; a column id k stored in an
//     arc or a chunk (in_col, out_col, chunk_col, mc_col) is column gc + k.
//     gs = gc = 0 for arrays over the whole lattice (global ids); gs = s0,
//     gc = c0 for one graph-local CSR shared by all sequences;
//   start: the sequence's start state (global);
//   io: log_init is read at s - io (0: log_init spans every state, [S];
//     s0: one graph-local log_init shared by all sequences);
//   chunks [j0, j1) and multi-chunk columns [m0, m1): ids into the chunk
//     arrays; p0: the slot id of the sequence's first partial.
//
// Arc arrays (int32 unless noted, built once on the host):
//   final_ (R), in_ptr, in_src, in_lp (R), in_col: arcs into each state
//   out_ptr, out_dst, out_lp (R), out_col: arcs out of each state
//   ca_src, ca_dst, ca_lp (R): the arcs sorted by column
//   in_span, out_span, ca_span: the frames each arc covers (>= 1), in the
//     order of in_src / out_dst / ca_src; nullptr when every arc covers one
//   chunk_arc [J + 1]: chunk j covers ca arcs [chunk_arc[j], chunk_arc[j + 1])
//   chunk_col [J]: its column; chunk_slot [J]: -1 when it is its column's
//     only chunk, else the slot (minus p0) of its partial sum
//   mc_col [Mc]: the columns with several chunks; mc_slot [Mc + 1]: column m's
//     partials are slots [mc_slot[m], mc_slot[m + 1]) (minus p0)
// Spans: an arc landing past L is never on a path; a span below 1, reaching
// before frame 0 or past L, or above max_span is skipped (no value of the
// span arrays moves an access out of the arrays).
// What a block keeps in shared memory (`mode`): see forward_body.
// Leaky HMM when log_init != nullptr (no spans):
//   alpha'(i) = alpha(i) + c * sum_j alpha(j) * init(i)
//   beta'(i)  = beta(i)  + c * sum_j init(j) * beta(j)      (sums per sequence)
// with log_c = log(c) (-inf for c = 0: the path still starts from log_init);
// both are homogeneous, so they apply to the normalised rows as they are.
// lengths are clamped to [0, T] here: device lengths are unchecked, and no
// value of them moves an access out of the arrays.
// NaN as in the NumPy engine: a NaN score of sequence n in a frame <
// lengths[n] (or a +inf that makes a row's maximum infinite) makes loglike[n]
// NaN and every posterior of n's columns at frames t < lengths[n] NaN (zero
// past it); other sequences are unaffected.
#ifndef CHAINFB_FORWARD_BACKWARD_CUH
#define CHAINFB_FORWARD_BACKWARD_CUH

#include "common.cuh"

namespace chainfb {

struct SeqSpan {
  int s0, s1, c0, c1, gs, gc, start, io;
  int j0, j1, m0, m1, p0;
};

constexpr unsigned kFullWarp = 0xffffffffu;

// The larger of a and b; NaN wins (a row with a NaN makes its sequence NaN).
template <typename R>
__device__ __forceinline__ R max_nan(R a, R b) {
  return a != a ? a : ((b != b || b > a) ? b : a);
}

// Every thread gives its largest value; lane 0 of each warp stores the warp's
// largest in part[warp].  Read with block_max after the next barrier.
template <typename R>
__device__ __forceinline__ void put_warp_max(R v, R* part) {
  for (int o = 16; o > 0; o >>= 1) v = max_nan<R>(v, __shfl_xor_sync(kFullWarp, v, o));
  if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = v;
}

// The block's largest value from the warps' partials: lane l of every warp
// reads partial l, then a shuffle tree (one shared load and five shuffles,
// not a loop over the warps).  Every thread of the block calls it.
template <typename R>
__device__ __forceinline__ R block_max(const R* part) {
  const int lane = (int)(threadIdx.x & 31u);
  R m = part[lane < (int)(blockDim.x >> 5) ? lane : 0];
  for (int o = 16; o > 0; o >>= 1) m = max_nan<R>(m, __shfl_xor_sync(kFullWarp, m, o));
  return m;
}

// The threads that run one direction of a sequence: its block (K = 1), or
// a cluster of K blocks (K > 1, cluster.cu), whose K * blockDim.x threads
// stride over the states as one block of that many would (thread t of the
// group is thread t % blockDim.x of the block of rank t / blockDim.x).  A
// row's maximum is reduced over the group: each warp's largest value goes to
// a slot of `parts` -- K > 1: slot rank * 32 + warp in every block of the
// cluster (distributed shared memory) -- two sets of slots by the frame's
// parity, read after the frame's barrier (the block's or the cluster's).  A
// maximum does not depend on the order of its terms, so every K gives the
// same value.
template <typename R, int K>
struct Group {
  int rank;  // the block's rank in its cluster (0: one block)
  int t, n;  // this thread's index in the group; the group's threads
  R* parts;  // [2, K * 32]: the block's static [2, 32] array, or (K > 1) the head of the dynamic shared memory

  __device__ Group(R* static_parts, R* dynamic)
      : rank(K > 1 ? (int)cluster_rank() : 0),
        t(rank * (int)blockDim.x + (int)threadIdx.x),
        n(K * (int)blockDim.x),
        parts(K > 1 ? dynamic : static_parts) {}

  // What the rows' mode may use of the dynamic shared memory `dyn`: all of
  // it, or (K > 1) what follows the slots.
  __device__ R* after_slots(R* dyn) const { return K > 1 ? dyn + 2 * K * 32 : dyn; }

  // The slots of frames of this parity.
  __device__ R* slots(int parity) const { return parts + (parity & 1) * K * 32; }

  // Every thread gives its largest value of the frame.
  __device__ void put_max(R v, int parity) const {
    if constexpr (K == 1) {
      put_warp_max<R>(v, slots(parity));
    } else {
      for (int o = 16; o > 0; o >>= 1) v = max_nan<R>(v, __shfl_xor_sync(kFullWarp, v, o));
      if ((threadIdx.x & 31u) == 0)
        for (int r = 0; r < K; ++r) cluster_map(slots(parity), (unsigned)r)[rank * 32 + (int)(threadIdx.x >> 5)] = v;
    }
  }

  // The group's largest value of a frame, after the barrier that followed put_max.
  __device__ R max(int parity) const {
    if constexpr (K == 1) {
      return block_max<R>(slots(parity));
    } else {
      const R* p = slots(parity);
      const int lane = (int)(threadIdx.x & 31u), w = lane < (int)(blockDim.x >> 5) ? lane : 0;
      R m = p[w];
      for (int r = 1; r < K; ++r) m = max_nan<R>(m, p[r * 32 + w]);
      for (int o = 16; o > 0; o >>= 1) m = max_nan<R>(m, __shfl_xor_sync(kFullWarp, m, o));
      return m;
    }
  }

  // The group's barrier.
  __device__ void sync() const {
    if constexpr (K == 1)
      __syncthreads();
    else
      cluster_sync();
  }
};

// The integer offset of a row whose largest value is m: floor(m); 0 when the
// row has no finite value; NaN when m is NaN or +inf (the row cannot be
// normalised: every later row, and the sequence's result, become NaN).  A
// zero offset is +0 whatever the sign of m's zero (+ 0.0), so the offset
// does not depend on which of two equal maxima a reduction kept.
template <typename R>
__device__ __forceinline__ double row_offset(R m) {
  if (m != m || m == -Num<R>::neg_inf()) return Num<double>::nan();
  return m > Num<R>::neg_inf() ? floor((double)m) + 0.0 : 0.0;
}

// Log-sum-exp of the whole block (every thread calls it with its own
// accumulator): a shuffle tree per warp, then the warps' partials in order;
// deterministic for a given block size.  sm [64].
template <typename R>
__device__ R block_logsum(LogAcc<R> a, R* sm) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (unsigned o = 16; o > 0; o >>= 1) {
    const R om = __shfl_down_sync(kFullWarp, a.m, o), os = __shfl_down_sync(kFullWarp, a.s, o);
    if (lane + o < 32) a.merge(om, os);
  }
  if (lane == 0) {
    sm[warp] = a.m;
    sm[32 + warp] = a.s;
  }
  __syncthreads();
  LogAcc<R> r;
  r.m = sm[0];
  r.s = sm[32];
  for (int w = 1, nw = (int)(blockDim.x >> 5); w < nw; ++w) r.merge(sm[w], sm[32 + w]);
  const R out = r.result();
  __syncthreads();  // sm may be reused right after
  return out;
}

// logsum_{s in [s0, s1)} v[s - s0] + f[s - s0] in an order fixed by the
// sequence alone (runs of consecutive states, then the runs in order), so the
// same bits for every block size.  sm [256]; every thread returns it.
template <typename R>
__device__ R fixed_logsum(const R* v, const R* f, int s0, int s1, R* sm) {
  const int W = s1 - s0;
  const int run = W > 32 * 256 ? (W + 255) / 256 : 32;
  const int runs = (W + run - 1) / run;
  for (int r = (int)threadIdx.x; r < runs; r += (int)blockDim.x) {
    LogAcc<R> acc;
    acc.init();
    for (int i = r * run, e = (r + 1) * run < W ? (r + 1) * run : W; i < e; ++i) acc.add(v[i] + f[i]);
    sm[r] = acc.result();
  }
  __syncthreads();
  LogAcc<R> acc;
  acc.init();
  for (int r = 0; r < runs; ++r) acc.add(sm[r]);
  const R out = acc.result();
  __syncthreads();
  return out;
}

// A ring of `rows` rows of `stride` entries; entry i of row t is
// row(t)[i - off] (rows in device memory: off 0; rings in shared memory: the
// sequence's first state or column).  P is R* for rows written, const R* for
// rows only read.
template <typename R, typename P = R*>
struct Ring {
  P p;
  i64 stride;
  int rows, off;
  __device__ __forceinline__ P row(int t) const { return p + (i64)(t % rows) * stride; }
  __device__ __forceinline__ R get(int t, int i) const { return row(t)[i - off]; }
};
template <typename R>
using View = Ring<R, const R*>;

// A row segment of at most kStage * blockDim.x values held in registers: it
// is loaded from device memory early in a frame and stored to shared memory
// at the frame's end, so the next frame finds it there (the launcher stages
// only segments that fit).
constexpr int kStage = 4;
template <typename R>
struct Staged {
  R v[kStage];
  __device__ __forceinline__ void load(const R* src, int n) {
    for (int k = 0; k < kStage; ++k) {
      const int i = (int)threadIdx.x + k * (int)blockDim.x;
      if (i < n) v[k] = src[i];
    }
  }
  __device__ __forceinline__ void store(R* dst, int n) const {
    for (int k = 0; k < kStage; ++k) {
      const int i = (int)threadIdx.x + k * (int)blockDim.x;
      if (i < n) dst[i] = v[k];
    }
  }
};

// The leaky HMM on row b of a ring (states s0..s1 at b[s - off], a copy at
// copy[s - s0] when copy != nullptr): alpha'(i) = alpha(i) + c * sum_j alpha(j)
// * init(i) when `alpha`, else beta'(i) = beta(i) + c * sum_j init(j) * beta(j).
// A thread reads its own states before the reduction; when the row's states
// were written by lanes other than the reader (lanes > 1: a state's lane 0
// writes it), a barrier comes first.  The thread's largest new value goes to
// the warp partials `part`; ends with a barrier.
template <typename R>
__device__ void leak(bool alpha, R* b, int off, R* copy, const R* log_init, int io, R log_c, int s0, int s1,
                     R* part, R* sm, int lanes) {
  if (lanes > 1) __syncthreads();
  LogAcc<R> acc;
  acc.init();
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x)
    acc.add(alpha ? b[s - off] : b[s - off] + log_init[s - io]);
  const R tot = block_logsum<R>(acc, sm);
  R mx = Num<R>::neg_inf();
  for (int s = s0 + (int)threadIdx.x; s < s1; s += (int)blockDim.x) {
    const R v = log_add<R>(b[s - off], log_c + tot + (alpha ? log_init[s - io] : R(0)));
    b[s - off] = v;
    if (copy) copy[s - s0] = v;
    mx = max_nan<R>(mx, v);
  }
  put_warp_max<R>(mx, part);
  __syncthreads();
}

// Where a thread stands in the state loop when `n` consecutive lanes share a
// state (n a power of two <= 32, the same for the whole block): the thread is
// lane `lane` of its state's group and adds its arcs lane, lane + n, ...;
// `live` is false past the sequence's last state (the thread still takes
// part in its warp's shuffles).
struct Lanes {
  int lane, n;
  bool live;
};

// The lanes a state takes as the launcher asked (a power of two in [1, 32]);
// 1 for any other value, so no value of it moves an access out of the arrays.
__device__ __forceinline__ int valid_lanes(int n) { return n >= 1 && n <= 32 && (n & (n - 1)) == 0 ? n : 1; }

// Merge the n lanes' accumulators of a state: a fixed butterfly of warp
// shuffles (lane l takes lane l ^ o for o = 1, 2, ..., n / 2), so lane 0's
// result has one order, fixed by n.  Every lane of the warp calls it.
template <typename R>
__device__ __forceinline__ void merge_lanes(LogAcc<R>& acc, int n) {
  for (int o = 1; o < n; o <<= 1) {
    const R om = __shfl_xor_sync(kFullWarp, acc.m, o), os = __shfl_xor_sync(kFullWarp, acc.s, o);
    acc.merge(om, os);
  }
}

// Forward step of state s at frame t (the log-sum of its in-arcs, before the
// frame's offset when every arc covers one frame); rows: the alpha rows, xs:
// the score rows (column ids gc + in_col).  I: the type of the arcs' state,
// column and span ids (int in the lattice's arrays, 16-bit in an ArcTable).
template <typename R, typename I>
__device__ __forceinline__ R alpha_state(int s, int t, int gs, int gc, const int* in_ptr, const I* in_src,
                                         const R* in_lp, const I* in_col, const I* in_span, int M,
                                         const View<R>& rows, const View<R>& xs, const double* P, double Pt,
                                         bool staged, Lanes ln) {
  LogAcc<R> acc;
  acc.init();
  const int e = ln.live ? in_ptr[s - gs + 1] : 0;
  const int a0 = ln.live ? in_ptr[s - gs] + ln.lane : 0;
  if (in_span) {
    for (int a = a0; a < e; a += ln.n) {
      const int k = in_span[a];
      if (k < 1 || k > t || k > M) continue;  // read before frame 0 (or not a span)
      const int f = t - k;
      acc.add(rows.get(f, gs + in_src[a]) + in_lp[a] + xs.get(f, gc + in_col[a]) + (R)(P[f] - Pt));
      CHAINFB_WORK(work_arc<R>(staged), 1);
    }
  } else {
    const R* prev = rows.row(t - 1);
    const R* x = xs.row(t - 1);
    for (int a = a0; a < e; a += ln.n) {
      acc.add(prev[gs + in_src[a] - rows.off] + in_lp[a] + x[gc + in_col[a] - xs.off]);
      CHAINFB_WORK(work_arc<R>(staged), 1);
    }
  }
  merge_lanes<R>(acc, ln.n);
  if (ln.live) CHAINFB_WORK(work_state<R>(staged), 1);
  return acc.result();
}

// Backward step of state s at frame t (before the frame's offset when every
// arc covers one frame); reach = min(L - t, M), the longest span landing; x
// [i - xoff]: frame t's score of column i; I as in alpha_state.
template <typename R, typename I>
__device__ __forceinline__ R beta_state(int s, int t, int reach, int gs, int gc, const int* out_ptr,
                                        const I* out_dst, const R* out_lp, const I* out_col, const I* out_span,
                                        const Ring<R>& rows, const R* x, int xoff, const double* Q, double Qt,
                                        bool staged, Lanes ln) {
  LogAcc<R> acc;
  acc.init();
  const int e = ln.live ? out_ptr[s - gs + 1] : 0;
  const int a0 = ln.live ? out_ptr[s - gs] + ln.lane : 0;
  if (out_span) {
    for (int a = a0; a < e; a += ln.n) {
      const int d = out_span[a];
      if (d < 1 || d > reach) continue;  // lands past L (or not a span)
      acc.add(out_lp[a] + x[gc + out_col[a] - xoff] + rows.get(t + d, gs + out_dst[a]) + (R)(Q[t + d] - Qt));
      CHAINFB_WORK(work_arc<R>(staged), 1);
    }
  } else {
    const R* next = rows.row(t + 1);
    for (int a = a0; a < e; a += ln.n) {
      acc.add(out_lp[a] + x[gc + out_col[a] - xoff] + next[gs + out_dst[a] - rows.off]);
      CHAINFB_WORK(work_arc<R>(staged), 1);
    }
  }
  merge_lanes<R>(acc, ln.n);
  if (ln.live) CHAINFB_WORK(work_state<R>(staged), 1);
  return acc.result();
}

// Where a block keeps what it reads every frame (`mode`, chosen by the
// launcher from the sizes and the shared memory it may use):
//   0: everything in device memory;
//   1: the rows' ring in dynamic shared memory ([M + 1, W], W the sequence's
//      states);
//   2: as 1, and each frame's scores staged in shared memory one frame ahead
//      (Staged): [M + 1, nc] score rows after the ring;
//   plus kArcTable: the arcs the recursion reads every frame (into the
//      sequence's states for the forward, out of them for the backward)
//      copied once, before the frame loop, into an ArcTable after the
//      mode's rows.  The sums read the same values in the same order, so
//      every mode gives the same bits.
constexpr int kArcTable = 4;

// A sequence's arcs of one direction in shared memory, a CSR local to it:
// state s0 + i's arcs are [ptr[i], ptr[i + 1]); arc k has weight lp[k], its
// other state s0 + end[k], column c0 + col[k] and span span[k] (nullptr:
// every arc spans one frame).  16-bit ids: the launcher uses a table only
// when W and nc are at most 65536 and max_span below 65535 (a span outside
// [0, 65535] is stored as 0 or 65535, which the recursion skips as it
// skips the original).  Layout from base: lp [A] (R), ptr [W + 1] (int),
// end, col and span [A] (u16), A the sequence's arcs.
typedef unsigned short u16;
template <typename R>
struct ArcTable {
  int* ptr;
  R* lp;
  u16 *end, *col, *span;
};

// Copy the arcs of states [s0, s1) -- CSR ptr / end / lp / col / span with
// the SeqSpan's origins gs, gc (see SeqSpan) -- into an ArcTable in the
// dynamic shared memory sm, after the rows of `mode` (the ring, [M + 1, W],
// in modes 1 and 2; the staged scores, [M + 1, nc], in mode 2), as the
// launcher sizes them.  The block's barrier after it (the rows'
// initialisation) publishes it.
template <typename R>
__device__ ArcTable<R> load_arc_table(R* sm, int mode, int M, int nc, int s0, int s1, int c0, int gs, int gc,
                                      const int* ptr, const int* end, const R* lp, const int* col, const int* span) {
  const int tid = threadIdx.x, nt = blockDim.x, W = s1 - s0;
  const int a0 = ptr[s0 - gs], A = ptr[s1 - gs] - a0;
  R* base = sm + (mode ? (i64)(M + 1) * W : 0) + (mode == 2 ? (i64)(M + 1) * nc : 0);
  ArcTable<R> tb;
  tb.lp = base;
  tb.ptr = reinterpret_cast<int*>(base + A);
  tb.end = reinterpret_cast<u16*>(tb.ptr + W + 1);
  tb.col = tb.end + A;
  tb.span = span ? tb.col + A : nullptr;
  for (int i = tid; i <= W; i += nt) tb.ptr[i] = ptr[s0 - gs + i] - a0;
  for (int k = tid; k < A; k += nt) {
    tb.lp[k] = lp[a0 + k];
    tb.end[k] = (u16)(gs + end[a0 + k] - s0);
    tb.col[k] = (u16)(gc + col[a0 + k] - c0);
    if (span) {
      const int d = span[a0 + k];
      tb.span[k] = (u16)(d < 0 ? 0 : (d > 65535 ? 65535 : d));
    }
  }
  return tb;
}

// Normalised alphas of rows 0..L (alpha, and the offsets P_t in P [T + 1]),
// loglike[n] = P_L + z and lz[n] = z; frames >= L of the sequence's columns
// of X are set to -inf.
template <typename R, int K = 1>
__device__ void forward_body(const SeqSpan& q, int n, const R* final_, const int* in_ptr, const int* in_src,
                             const R* in_lp, const int* in_col, const int* in_span, int max_span, i64 length, R* X,
                             int T, int C, R* alpha, int S, double* P, int mode, int lanes, const R* log_init,
                             R log_c, R* loglike, R* lz) {
  CHAINFB_SHARED_ARRAY(R, sm_max, 64);
  CHAINFB_SHARED_ARRAY(R, sm_sum, 256);
  CHAINFB_DYNAMIC_SHARED(R, sm_top);
  const int tid = threadIdx.x;
  const Group<R, K> g(sm_max, sm_top);
  R* const sm_dyn = g.after_slots(sm_top);
  const int s0 = q.s0, s1 = q.s1, gs = q.gs, gc = q.gc, W = s1 - s0;
  const int c0 = q.c0, nc = q.c1 - q.c0;
  const int L = clamp_len(length, T);
  const int M = (in_span && max_span > 1) ? max_span : 1;
  lanes = valid_lanes(lanes);
  const bool table = (mode & kArcTable) != 0;
  mode &= ~kArcTable;
  const R ninf = Num<R>::neg_inf();

  // frames past the length never contribute (and the caller sees them as -inf)
  const i64 masked = (i64)(T - L) * nc;
  for (i64 i = g.t; i < masked; i += g.n) X[(i64)(L + (int)(i / nc)) * C + c0 + (int)(i % nc)] = ninf;

  // the rows the recursion reads: the shared ring, or alpha itself; the scores: staged, or X
  const Ring<R> ring = mode ? Ring<R>{sm_dyn, W, M + 1, s0} : Ring<R>{alpha, S, T + 1, 0};
  const View<R> rows{ring.p, ring.stride, ring.rows, ring.off};
  R* xs_buf = sm_dyn + (i64)(M + 1) * W;
  const View<R> xs = mode == 2 ? View<R>{xs_buf, nc, M + 1, c0} : View<R>{X, C, T, 0};
  ArcTable<R> tb{};
  if (table)
    tb = load_arc_table<R>(sm_dyn, mode, M, nc, s0, s1, c0, gs, gc, in_ptr, in_src, in_lp, in_col, in_span);
  R mx = ninf;
  for (int s = s0 + g.t; s < s1; s += g.n) {
    const R v = log_init ? log_init[s - q.io] : (s == q.start ? R(0) : ninf);
    alpha[s] = v;
    if (mode) sm_dyn[s - s0] = v;
    mx = max_nan<R>(mx, v);
  }
  if (g.t == 0) P[0] = 0.0;
  if (mode == 2 && L > 0) {
    Staged<R> x0;
    x0.load(X + c0, nc);
    x0.store(xs_buf, nc);
  }
  if (log_init) {
    leak<R>(true, alpha, 0, mode ? sm_dyn : nullptr, log_init, q.io, log_c, s0, s1, g.slots(0), sm_sum, 1);
  } else {
    g.put_max(mx, 0);
    g.sync();
  }

  double Pt = 0.0;
  for (int t = 1; t <= L; ++t) {
    Staged<R> next;  // frame t's scores, for the frames after this one
    if (mode == 2 && t < L) next.load(X + (i64)t * C + c0, nc);
    const double d = row_offset<R>(g.max(t - 1));
    Pt += d;
    if (g.t == 0) P[t] = Pt;
    R* cur = alpha + (i64)t * S;
    R* cur_sh = mode ? ring.row(t) : nullptr;
    mx = ninf;
    if (mode < 2 && s0 + g.t / lanes < s1) CHAINFB_WORK(kWorkMemoryWait, 1);  // the frame's first device read
    for (int base = s0; base < s1; base += g.n / lanes) {  // the same passes for every thread: lanes shuffle
      const int s = base + g.t / lanes;
      const Lanes ln{tid % lanes, lanes, s < s1};
      R v = table ? alpha_state<R, u16>(s, t, s0, c0, tb.ptr, tb.end, tb.lp, tb.col, tb.span, M, rows, xs, P, Pt,
                                        mode == 2, ln)
                  : alpha_state<R, int>(s, t, gs, gc, in_ptr, in_src, in_lp, in_col, in_span, M, rows, xs, P, Pt,
                                        mode == 2, ln);
      if (!ln.live || ln.lane) continue;
      if (!in_span) v -= (R)d;
      cur[s] = v;
      if (cur_sh) cur_sh[s - s0] = v;
      mx = max_nan<R>(mx, v);
    }
    if (mode == 2 && t < L) next.store(xs_buf + (i64)(t % (M + 1)) * nc, nc);
    if (log_init) {
      leak<R>(true, cur, 0, cur_sh, log_init, q.io, log_c, s0, s1, g.slots(t), sm_sum, lanes);
    } else {
      g.put_max(mx, t);
      g.sync();
    }
  }

  if (g.rank) return;  // (a cluster: its first block sums the last row, which the last barrier published)
  const R z = fixed_logsum<R>(alpha + (i64)L * S + s0, final_ + s0 - gs, s0, s1, sm_sum);
  if (tid == 0) {
    loglike[n] = (R)(Pt + (double)z);
    lz[n] = z;
  }
}

// Normalised betas of rows L..0 (beta [(T + 1), S]) and their offsets Q_t in
// Q [T + 1]; independent of the forward (the two run as blocks of one launch).
template <typename R, int K = 1>
__device__ void beta_body(const SeqSpan& q, const R* final_, const int* out_ptr, const int* out_dst,
                          const R* out_lp, const int* out_col, const int* out_span, int max_span, i64 length,
                          const R* X, int T, int C, R* beta, int S, double* Q, int mode, int lanes,
                          const R* log_init, R log_c) {
  CHAINFB_SHARED_ARRAY(R, sm_max, 64);
  CHAINFB_SHARED_ARRAY(R, sm_sum, 64);
  CHAINFB_DYNAMIC_SHARED(R, sm_top);
  const int tid = threadIdx.x;
  const Group<R, K> g(sm_max, sm_top);
  R* const sm_dyn = g.after_slots(sm_top);
  const int s0 = q.s0, s1 = q.s1, gs = q.gs, gc = q.gc, W = s1 - s0;
  const int c0 = q.c0, nc = q.c1 - q.c0;
  const int L = clamp_len(length, T);
  const int M = (out_span && max_span > 1) ? max_span : 1;
  lanes = valid_lanes(lanes);
  const bool table = (mode & kArcTable) != 0;
  mode &= ~kArcTable;
  const R ninf = Num<R>::neg_inf();

  const Ring<R> ring = mode ? Ring<R>{sm_dyn, W, M + 1, s0} : Ring<R>{beta, S, T + 1, 0};
  R* xb = sm_dyn + (i64)(M + 1) * W;  // mode 2: [2, nc] score rows
  ArcTable<R> tb{};
  if (table)
    tb = load_arc_table<R>(sm_dyn, mode, M, nc, s0, s1, c0, gs, gc, out_ptr, out_dst, out_lp, out_col,
                           M > 1 ? out_span : nullptr);
  R mx = ninf;
  R* bL = beta + (i64)L * S;
  for (int s = s0 + g.t; s < s1; s += g.n) {
    const R v = final_[s - gs];
    bL[s] = v;
    if (mode) ring.row(L)[s - s0] = v;
    mx = max_nan<R>(mx, v);
  }
  if (g.t == 0) Q[L] = 0.0;
  if (mode == 2 && L > 0) {
    Staged<R> x0;
    x0.load(X + (i64)(L - 1) * C + c0, nc);
    x0.store(xb + ((L - 1) & 1) * (i64)nc, nc);
  }
  if (log_init) {
    leak<R>(false, bL, 0, mode ? ring.row(L) : nullptr, log_init, q.io, log_c, s0, s1, g.slots(L), sm_sum, 1);
  } else {
    g.put_max(mx, L);
    g.sync();
  }

  double Qt = 0.0;  // Q_{t+1} at the top of each frame, Q_t after its offset
  for (int t = L - 1; t >= 0; --t) {
    Staged<R> next;  // frame t - 1's scores, for the next step
    if (mode == 2 && t > 0) next.load(X + (i64)(t - 1) * C + c0, nc);
    const double Qn = Qt;
    Qt = Qn + row_offset<R>(g.max(t + 1));
    if (g.t == 0) Q[t] = Qt;
    const int reach = L - t < M ? L - t : M;  // the longest span landing by frame L
    const R* x = mode == 2 ? xb + (t & 1) * (i64)nc : X + (i64)t * C;
    const int xoff = mode == 2 ? c0 : 0;
    R* bc = beta + (i64)t * S;
    R* bc_sh = mode ? ring.row(t) : nullptr;
    const R e = (R)(Qt - Qn);
    mx = ninf;
    if (mode < 2 && s0 + g.t / lanes < s1) CHAINFB_WORK(kWorkMemoryWait, 1);
    for (int base = s0; base < s1; base += g.n / lanes) {  // as in forward_body
      const int s = base + g.t / lanes;
      const Lanes ln{tid % lanes, lanes, s < s1};
      R v = table ? beta_state<R, u16>(s, t, reach, s0, c0, tb.ptr, tb.end, tb.lp, tb.col, tb.span, ring, x, xoff, Q,
                                       Qt, mode == 2, ln)
                  : beta_state<R, int>(s, t, reach, gs, gc, out_ptr, out_dst, out_lp, out_col,
                                       M > 1 ? out_span : nullptr, ring, x, xoff, Q, Qt, mode == 2, ln);
      if (!ln.live || ln.lane) continue;
      if (M == 1) v -= e;
      bc[s] = v;
      if (bc_sh) bc_sh[s - s0] = v;
      mx = max_nan<R>(mx, v);
    }
    if (mode == 2 && t > 0) next.store(xb + ((t - 1) & 1) * (i64)nc, nc);
    if (log_init) {
      leak<R>(false, bc, 0, bc_sh, log_init, q.io, log_c, s0, s1, g.slots(t), sm_sum, lanes);
    } else {
      g.put_max(mx, t);
      g.sync();
    }
  }
}

// The sum of v [0, n) in an order fixed by n alone: lanes of warp 0 over the
// entries (lane l sums l, l + 32, ...), then a fixed shuffle tree; returned
// to every thread.  sm [1]; the caller's barrier must follow the writes of v.
template <typename R>
__device__ R fixed_sum(const R* v, int n, R* sm) {
  if (threadIdx.x < 32) {
    R acc = R(0);
    for (int i = (int)threadIdx.x; i < n; i += 32) acc += v[i];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(kFullWarp, acc, o);
    if (threadIdx.x == 0) sm[0] = acc;
  }
  __syncthreads();
  return sm[0];
}

// post[t, c0 + i] = v for the frames t in [a, b) and the nc columns i of a
// sequence (the block's threads over the cells).
template <typename R>
__device__ __forceinline__ void fill_frames(R* post, int C, int c0, int nc, int a, int b, R v) {
  const i64 cells = (i64)(b > a ? b - a : 0) * nc;
  for (i64 i = threadIdx.x; i < cells; i += blockDim.x) post[(a + i / nc) * C + c0 + i % nc] = v;
}

// Posteriors of sequence n's columns at frames [t0, t1) (t1 <= T), every
// one of them written (post needs no fill beforehand): zero past the
// sequence's length and for an impossible sequence, NaN up to its length for
// a NaN one; else per frame, each chunk's sum into
// chunk_sum [J] (shared), then with one-frame arcs the frame's total (1 in
// exact arithmetic; every posterior is divided by it), then each column's
// posterior: its chunk's sum, or one warp adding its chunks' sums.  Every sum
// has an order fixed by the lattice: the same bits for every block size.
template <typename R>
__device__ void posterior_body(const SeqSpan& q, int n, int t0, int t1, const int* ca_src, const int* ca_dst,
                               const R* ca_lp, const int* ca_span, int max_span, const int* chunk_arc,
                               const int* chunk_col, const int* chunk_sole, const int* mc_col, const int* mc_begin,
                               const int* mc_end, const i64* lengths, const R* X, int T, int C, const R* alpha,
                               const R* beta, int S, const double* P, const double* Q, const R* loglike,
                               const R* lz, R* post) {
  CHAINFB_SHARED_ARRAY(R, sm_tot, 32);
  CHAINFB_DYNAMIC_SHARED(R, chunk_sum);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int gs = q.gs, gc = q.gc, c0 = q.c0, nc = q.c1 - q.c0;
  const int L = clamp_len(lengths[n], T);
  const int t_end = t1 < T ? t1 : T;
  if (t1 > L) t1 = L;
  const R total = loglike[n];
  const bool nan = total != total, impossible = !nan && !(total > Num<R>::neg_inf());
  // the frames past the length (every frame of an impossible sequence): zero
  fill_frames<R>(post, C, c0, nc, impossible ? t0 : (t1 > t0 ? t1 : t0), t_end, R(0));
  if (impossible) return;
  if (nan) {  // (uniform over the block) NaN posteriors up to its length, as NumPy
    fill_frames<R>(post, C, c0, nc, t0, t1, total);
    return;
  }
  const int M = (ca_span && max_span > 1) ? max_span : 1;
  const double PL = P[L];
  const R z = lz[n];
  const int J = q.j1 - q.j0;
  const int lane = tid & 31, nw = nt >> 5;
  for (int t = t0; t < t1; ++t) {
    const R* a = alpha + (i64)t * S + gs;
    const R* x = X + (i64)t * C + gc;
    const int reach = L - t < M ? L - t : M;
    const double Pt = P[t];
    const R k1 = (R)(Pt + Q[t + 1] - PL) - z;  // the offset of one-frame arcs
    if (q.j0 + tid < q.j1) CHAINFB_WORK(kWorkMemoryWait, 1);
    for (int j = q.j0 + tid; j < q.j1; j += nt) {
      const R xc = x[chunk_col[j]];
      R sum = R(0);
      for (int k = chunk_arc[j], e = chunk_arc[j + 1]; k < e; ++k) {
        const int d = M > 1 ? ca_span[k] : 1;
        if (d < 1 || d > reach) continue;  // lands past L (or not a span)
        const R off = M > 1 ? (R)(Pt + Q[t + d] - PL) - z : k1;
        sum += Num<R>::exp_(a[ca_src[k]] + ca_lp[k] + xc + beta[(i64)(t + d) * S + gs + ca_dst[k]] + off);
        CHAINFB_WORK(work_arc<R>(), 1);
      }
      chunk_sum[j - q.j0] = sum;
    }
    __syncthreads();
    const R div = M == 1 ? fixed_sum<R>(chunk_sum, J, sm_tot) : R(1);
    const R scale = div > R(0) ? div : R(1);  // (0 only if every path died in rounding)
    R* row = post + (i64)t * C + gc;
    for (int j = q.j0 + tid; j < q.j1; j += nt)
      if (chunk_sole[j]) {
        row[chunk_col[j]] = scale == R(1) ? chunk_sum[j - q.j0] : chunk_sum[j - q.j0] / scale;
        CHAINFB_WORK(work_state<R>(), 1);
      }
    for (int m = q.m0 + (tid >> 5); m < q.m1; m += nw) {
      R sum = R(0);
      for (int i = mc_begin[m] + lane, e = mc_end[m]; i < e; i += 32) sum += chunk_sum[i - q.j0];
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFullWarp, sum, o);
      if (lane == 0) row[mc_col[m]] = scale == R(1) ? sum : sum / scale;
    }
    __syncthreads();  // chunk_sum and sm_tot are reused by the next frame
  }
}

}  // namespace chainfb

#endif  // CHAINFB_FORWARD_BACKWARD_CUH
