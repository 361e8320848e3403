// Transducer score maps on the GPU: the fused log-softmax + skewed gather of
// the engine's scores from 4-D logits, and the fused gradient.  In = storage
// type of the logits (float, double, F16, BF16), R = compute type (float for
// the 16/32-bit inputs, double for double).
//
// logits [B, T, U1, V + D] contiguous: V token logits, then D >= 0 duration
// logits (TDT; D = 0 for RNN-T and multi-blank).  Each row (b, u) of the
// transducer grid has J arc kinds j = 0..J-1, described by tables of shape
// [B, U1, J]: sym (the token the arc reads, or -1), colidx (the arc's
// compact engine column, or -1) and, optionally, count (the arc is read at
// frames t < count only); and by kind_dur [J] (optional: the duration logit
// kind j reads, or -1 for none).  Entry (b, u, j) is *used* iff colidx is in
// [0, C), sym in [0, V) and kind_dur in [-1, D); it is *read* at frame t iff
// used and t < count.  The kernels attach no meaning to j.  Device tables
// are not range-checked on the host: an entry outside those ranges is
// ignored like an unused one, and any lengths and counts are safe (they
// only decide which in-bounds rows are live and read).  Row (b, t, u) is
// *live* iff t < T_b and u <= U_b, and *read* iff live and, when count is
// given, some entry is read at t.  A NaN logit makes its row's normaliser
// NaN (and so every score gathered from that row).  A group of `tpr`
// consecutive threads (a power of two dividing blockDim.x) handles one row:
// lanes stride over the row, in 16-byte packs where the row's start allows
// (Pack), so reads and writes are coalesced.
//
// Bytes moved are reported through CHAINFB_WORK(chainfb::kWorkBytes, n) (the
// emulation counts them; nothing on the GPU): the logits row once per kernel
// where it is read, each element
// of X, lse, post and the gradient where it is first accessed.  The [B, U1,
// J] tables and the lengths, re-read from cache by the T rows of each (b,
// u), and the gradient's second stores of a few elements (in cache) are not
// counted.
#include "common.cuh"


// A loop over the arc kinds, rolled: it runs once or a few times per row,
// off the per-element path, and unrolled copies would only cost registers.
#ifdef CHAINFB_EMULATE
#define CHAINFB_ROLLED
#else
#define CHAINFB_ROLLED _Pragma("unroll 1")
#endif

namespace chainfb {

template <typename R>
__device__ __forceinline__ bool is_finite(R x) {
  return x > Num<R>::neg_inf() && x < -Num<R>::neg_inf();
}

// 16 bytes of In, the unit of the vectorised row accesses: loaded and
// stored as one 128-bit word (uint4 on the device; any 16-byte copy in the
// host build of the tests).
#ifdef CHAINFB_EMULATE
struct alignas(16) PackBits {
  unsigned x, y, z, w;
};
#else
typedef uint4 PackBits;
#endif

template <typename In>
union Pack {
  static constexpr int N = 16 / (int)sizeof(In);
  PackBits bits;
  In v[N];
};

// The elements [0, n) of a row at p, split among the `tpr` lanes of its
// group: [head, head + packs * N) in 16-byte packs (lane l takes packs l,
// l + tpr, ...), the elements before and after one by one (lane l takes l,
// l + tpr, ...).  head puts the first pack on a 16-byte boundary; with a
// second row q (written beside p), packs only when q sits at the same offset
// within 16 bytes (else every element one by one).  Each lane visits its
// elements in increasing order.
template <typename In>
struct RowSplit {
  int head, packs;
  __device__ RowSplit(const In* p, const In* q, int n) {
    const unsigned long long a = (unsigned long long)(const void*)p;
    const unsigned long long c = q ? (unsigned long long)(const void*)q : a;
    head = (int)(((16 - a % 16) % 16) / sizeof(In));
    if (a % 16 != c % 16 || a % sizeof(In) != 0 || head > n) head = n;
    packs = (n - head) / Pack<In>::N;
  }
  __device__ int tail() const { return head + packs * Pack<In>::N; }
  // The lane that takes element k.
  __device__ int owner(int k, int tpr) const {
    return (k < head ? k : (k < tail() ? (k - head) / Pack<In>::N : k - tail())) % tpr;
  }
};

// acc.add(x[m]) for m < M: the same result with one rescale per block,
// without a branch per element, where the block holds no NaN and no +inf
// (those take acc.add, whose handling of them is the reference).
template <typename R, int M>
__device__ __forceinline__ void add_block(LogAcc<R>& acc, const R (&x)[M]) {
  R mx = x[0];
  bool odd = !(x[0] < -Num<R>::neg_inf());  // NaN or +inf
  for (int m = 1; m < M; ++m) {
    mx = x[m] > mx ? x[m] : mx;
    odd = odd || !(x[m] < -Num<R>::neg_inf());
  }
  if (odd) {
    for (int m = 0; m < M; ++m) acc.add(x[m]);
    return;
  }
  if (mx > acc.m) {  // a new maximum (acc.m = -inf: s = 0 stays 0)
    acc.s *= Num<R>::exp_(acc.m - mx);
    acc.m = mx;
  }
  if (acc.m > Num<R>::neg_inf())  // else every term so far is -inf (or acc.m is NaN: it stays)
    for (int m = 0; m < M; ++m) acc.s += Num<R>::exp_(x[m] - acc.m);
}

// f(k0, x) for the row p[0, n) lane `lane` takes (RowSplit over p and g), a
// block of M consecutive elements at a time (M = 1, or a pack's N): x[0, M)
// = p[k0, k0 + M) in the compute type.  With a row g, f turns x into the
// values to store there: g[k0, k0 + M) = x.  Each lane visits its blocks in
// increasing k0.
template <typename In, typename R, typename F>
__device__ __forceinline__ void visit_row(const In* p, In* g, int n, int lane, int tpr, F f) {
  const RowSplit<In> s(p, g, n);
  constexpr int N = Pack<In>::N;
  auto one = [&](int k) {
    R x[1] = {(R)Storage<In>::load(p[k])};
    f(k, x);
    if (g) g[k] = Storage<In>::store(x[0]);
  };
  for (int k = lane; k < s.head; k += tpr) one(k);
  const PackBits* pp = reinterpret_cast<const PackBits*>(p + s.head);
  for (int q = lane; q < s.packs; q += tpr) {
    Pack<In> v;
    v.bits = pp[q];
    R x[N];
    for (int m = 0; m < N; ++m) x[m] = (R)Storage<In>::load(v.v[m]);
    f(s.head + q * N, x);
    if (g) {
      for (int m = 0; m < N; ++m) v.v[m] = Storage<In>::store(x[m]);
      reinterpret_cast<PackBits*>(g + s.head)[q] = v.bits;
    }
  }
  for (int k = s.tail() + lane; k < n; k += tpr) one(k);
}

// g[0, n) = 0, the elements lane `lane` takes (RowSplit).
template <typename In>
__device__ __forceinline__ void zero_row(In* g, int n, int lane, int tpr) {
  const RowSplit<In> s(g, nullptr, n);
  const In z = Storage<In>::store(0.0f);
  for (int k = lane; k < s.head; k += tpr) g[k] = z;
  PackBits* gp = reinterpret_cast<PackBits*>(g + s.head);
  Pack<In> v;
  for (int m = 0; m < Pack<In>::N; ++m) v.v[m] = z;
  for (int q = lane; q < s.packs; q += tpr) gp[q] = v.bits;
  for (int k = s.tail() + lane; k < n; k += tpr) g[k] = z;
}

// The arc entries of grid row (b, u) at frame t (see the top of the file).
struct Entries {
  const int *sym, *colidx, *count, *kind_dur;
  i64 e0;  // (b * U1 + u) * J
  int J, t, V, D, C;

  // Whether entry j is used; col, k, d: its column, token and duration index.
  __device__ bool used(int j, int& col, int& k, int& d) const {
    col = colidx[e0 + j];
    k = sym[e0 + j];
    d = kind_dur ? kind_dur[j] : -1;
    return col >= 0 && col < C && k >= 0 && k < V && d >= -1 && d < D;
  }
  __device__ bool read_at_t(int j) const { return count == nullptr || t < count[e0 + j]; }
  __device__ bool read(int j, int& col, int& k, int& d) const { return used(j, col, k, d) && read_at_t(j); }
  __device__ bool any_read() const {
    int col, k, d;
    CHAINFB_ROLLED
    for (int j = 0; j < J; ++j)
      if (read(j, col, k, d)) return true;
    return false;
  }
};

// The gather.  For every live row: lse[b,t,u] = logsumexp_{k<V} logits[b,t,u,k]
// (0 when !fused), and, when D > 0, dlse[b,t,u] = logsumexp_{i<D}
// logits[b,t,u,V+i]; both 0 on rows that are not read.  lse_out is [B, T,
// U1] for D = 0 and [B, T, U1, 2] (lse, dlse) for D > 0.  Scores: for each
// used entry (column c = colidx[b,u,j]) and every step n in [0, num_rows),
//
//   X[n, c] = logits[b,t,u,sym_j] - lse  (+ logits[b,t,u,V+d_j] - dlse  when d_j >= 0)  - shift
//
// with t = n - u, where the entry is read at t on a read row, and -inf at
// every other step (t outside [0, T), the row not read, the entry not read at
// t or not used: the kind's log-probabilities are log-softmaxes of the token
// and duration logits, and `shift` a constant subtracted from every arc, e.g.
// TDT's sigma).  Zero column: X[n, zero_col[b]] = 0 for n < T_b + U_b, -inf
// after.  The row (b, t, u) writes step t + u of its columns and, so that
// every step of the column is written by exactly one row, the steps e < u
// (before frame 0) and e + T (past frame T - 1) for e = t, t + T, ...; rows
// (b, t, 0) write the zero column's steps t, t + T, ...  So X needs no fill
// beforehand when colidx and zero_col name each column of X exactly once
// (the other columns are left as they are).
template <typename In, typename R>
CHAINFB_KERNEL void transducer_gather(const In* logits, int B, int T, int U1, int V, int D, const int* sym,
                                      const int* colidx, const int* count, const int* kind_dur, int J,
                                      const int* T_len, const int* U_len, int fused, int tpr, R shift, R* X,
                                      int num_rows, int C, const int* zero_col, R* lse_out) {
  const int lane = threadIdx.x % tpr;
  const i64 row = (i64)blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
  const i64 rows = (i64)B * T * U1;
  int b = 0, t = 0, u = 0;
  bool read = false;
  Entries en{sym, colidx, count, kind_dur, 0, J, 0, V, D, C};
  if (row < rows) {
    b = (int)(row / ((i64)T * U1));
    t = (int)((row / U1) % T);
    u = (int)(row % U1);
    en.e0 = ((i64)b * U1 + u) * J;
    en.t = t;
    read = t < T_len[b] && u <= U_len[b] && (count == nullptr || en.any_read());
  }
  const int W = V + D;
  const In* p = logits + row * W;
  LogAcc<R> acc;
  acc.init();
  if (read && fused) visit_row<In, R>(p, nullptr, V, lane, tpr, [&](int, auto& x) { add_block(acc, x); });
  R norm = group_logsum<R>(acc, tpr);  // every thread takes part (no early exit before it)
  if (row >= rows) return;
  if (!read || !fused) norm = R(0);
  R dnorm = R(0);
  if (read && D > 0) {  // a few duration logits: every lane sums them all (no second group reduction)
    LogAcc<R> dacc;
    dacc.init();
    for (int i = 0; i < D; ++i) dacc.add((R)Storage<In>::load(p[V + i]));
    dnorm = dacc.result();
  }
  if (lane == 0) {
    if (read) CHAINFB_WORK(chainfb::kWorkBytes, (i64)(fused ? W : D) * (i64)sizeof(In));
    if (D > 0) {
      lse_out[2 * row] = norm;
      lse_out[2 * row + 1] = dnorm;
    } else {
      lse_out[row] = norm;
    }
    CHAINFB_WORK(chainfb::kWorkBytes, (D > 0 ? 2 : 1) * (i64)sizeof(R));
  }
  const R ninf = Num<R>::neg_inf();
  const int n = t + u;
  if (n < num_rows) {
    for (int j = lane; j < J; j += tpr) {
      int col, k, d;
      const bool used = en.used(j, col, k, d);
      if (col < 0 || col >= C) continue;  // no column (or out of range: ignored)
      R v = ninf;
      if (read && used && en.read_at_t(j)) {
        v = (R)Storage<In>::load(p[k]) - norm;
        if (!fused) CHAINFB_WORK(chainfb::kWorkBytes, (i64)sizeof(In));
        if (d >= 0) v += (R)Storage<In>::load(p[V + d]) - dnorm;
        if (shift != R(0)) v -= shift;
      }
      X[(i64)n * C + col] = v;
      CHAINFB_WORK(chainfb::kWorkBytes, (i64)sizeof(R));
    }
  }
  // the steps of the row's columns that no frame reaches: e < u, then e + T
  const int before = u < num_rows ? u : num_rows;
  const int after = num_rows - u - T > 0 ? num_rows - u - T : 0;
  for (i64 ex = t; ex < before + after; ex += T) {
    const i64 m = ex < before ? ex : ex + T;
    for (int j = lane; j < J; j += tpr) {
      const int col = colidx[en.e0 + j];
      if (col < 0 || col >= C) continue;
      X[m * C + col] = ninf;
      CHAINFB_WORK(chainfb::kWorkBytes, (i64)sizeof(R));
    }
  }
  if (zero_col != nullptr && u == 0 && lane == 0) {
    const int zc = zero_col[b];
    if (zc >= 0 && zc < C) {
      const i64 steps = (i64)T_len[b] + U_len[b];
      for (i64 m = t; m < num_rows; m += T) {
        X[m * C + zc] = m < steps ? R(0) : ninf;
        CHAINFB_WORK(chainfb::kWorkBytes, (i64)sizeof(R));
      }
    }
  }
}

// The gradient.  With P_j = post[t+u, colidx[b,u,j]] for the entries read
// at t on a read row (0 for the others), w = kind_weight [J]:
//
//   grad[b,t,u,k]   = scale[b] * clamp(softmax_k * sum_j w_j P_j  -  sum_j w_j P_j [k == sym_j])    (k < V)
//   grad[b,t,u,V+i] = scale[b] * (dsoftmax_i * sum_{j: d_j >= 0} P_j  -  sum_j P_j [d_j == i])      (i < D)
//
// softmax = exp(logits[:V] - lse), dsoftmax = exp(logits[V:] - dlse), each
// taken as 0 where its normaliser is not finite (a +inf logit: the row's
// scores are -inf, its posteriors 0) and the first as 0 when !fused; the
// clamp to [-clamp, clamp] only when clamp > 0, on the token part only.
// Zero on rows that are not read, at steps t + u >= num_rows, and on every
// row of an utterance with scale[b] == 0 (even where the formula is NaN).
//
// Derivation: the entry j at (b, t, u) scores x_j = logits[sym_j] - lse (+
// logits[V + d_j] - dlse) - shift, so d x_j / d logits[k] = [k == sym_j] -
// softmax_k for k < V and [i == d_j] - dsoftmax_i for the duration logit
// V + i (the latter only when d_j >= 0), and the engine's P_j is d logP /
// d x_j.  A cost whose gradient w.r.t. x_j is -w_j P_j through the token
// logits and -P_j through the duration logits (FastEmit weighs only the
// former, as NeMo does) has, by the chain rule, the gradient above: with w =
// 1 that is d(-logP) / d logits.  RNN-T with FastEmit passes w = [1, 1 +
// lambda, 1, ...] (blank, label, big blanks); TDT w_j = 1 on the blanks and
// 1 + lambda on the labels of every duration.
//
// The token part is written in one pass of softmax terms (no per-element
// test, whatever J is); then the lane that wrote the element of each token
// some entry reads writes it again with the entries' terms.
template <typename In, typename R>
CHAINFB_KERNEL void transducer_grad(const In* logits, int B, int T, int U1, int V, int D, const int* sym,
                                    const int* colidx, const int* count, const int* kind_dur, int J,
                                    const int* T_len, const int* U_len, int fused, int tpr, const R* post,
                                    int num_rows, int C, const R* lse, const R* scale, const R* kind_weight,
                                    R clamp, In* grad) {
  const int lane = threadIdx.x % tpr;
  const i64 row = (i64)blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
  const i64 rows = (i64)B * T * U1;
  if (row >= rows) return;  // no barrier in this kernel
  const int b = (int)(row / ((i64)T * U1));
  const int t = (int)((row / U1) % T);
  const int u = (int)(row % U1);
  const int W = V + D;
  const In* p = logits + row * W;
  In* g = grad + row * W;
  const int n = t + u;
  Entries en{sym, colidx, count, kind_dur, ((i64)b * U1 + u) * J, J, t, V, D, C};
  bool read = t < T_len[b] && u <= U_len[b] && n < num_rows && scale[b] != R(0);
  const R* post_n = post + (i64)n * C;
  R soft_w = R(0), dur_w = R(0);  // sum_j w_j P_j, sum_{d_j >= 0} P_j
  bool any = false;
  if (read) {
    int col, k, d;
    CHAINFB_ROLLED
    for (int j = 0; j < J; ++j) {
      if (!en.read(j, col, k, d)) continue;
      any = true;
      const R pj = post_n[col];
      soft_w += kind_weight[j] * pj;
      if (d >= 0) dur_w += pj;
      if (lane == 0) CHAINFB_WORK(chainfb::kWorkBytes, (i64)sizeof(R));
    }
    read = count == nullptr || any;
  }
  if (lane == 0) CHAINFB_WORK(chainfb::kWorkBytes, (i64)W * (i64)sizeof(In) * (read ? 2 : 1));
  if (!read) {
    zero_row(g, W, lane, tpr);
    return;
  }
  const R norm = lse[D > 0 ? 2 * row : row];
  if (lane == 0) CHAINFB_WORK(chainfb::kWorkBytes, (D > 0 ? 2 : 1) * (i64)sizeof(R));
  const R sc = scale[b];
  // softmax_k * sum_j w_j P_j as exp(min(x - nm, 0)) * sw, without a branch: where the softmax is taken as
  // 0, sw = 0 and nm = 0 (the min keeps the exponent finite: 0 for +inf or NaN); elsewhere x <= norm
  const bool soft = fused && is_finite(norm);
  const R nm = soft ? norm : R(0), sw = soft ? soft_w : R(0);
  auto token_value = [&](R x, R minus) {
    const R a = x - nm;
    R v = Num<R>::exp_(a < R(0) ? a : R(0)) * sw - minus;
    if (clamp > R(0)) v = v < -clamp ? -clamp : (v > clamp ? clamp : v);
    return sc * v;
  };
  visit_row<In, R>(p, g, V, lane, tpr, [&](int, auto& x) {
    for (int m = 0; m < (int)(sizeof(x) / sizeof(x[0])); ++m) x[m] = token_value(x[m], R(0));
  });
  // the tokens the entries read: the lane that stored the element stores it again with the entries' terms
  // (its line still in cache), once per token (at its first entry), the terms summed in j order
  const RowSplit<In> split(p, g, V);
  int col, k, d, col2, k2, d2;
  CHAINFB_ROLLED
  for (int j = 0; j < J; ++j) {
    if (!en.read(j, col, k, d) || split.owner(k, tpr) != lane) continue;
    R w = R(0);
    bool first = true;
    CHAINFB_ROLLED
    for (int i = 0; i < J && first; ++i) {
      if (!en.read(i, col2, k2, d2) || k2 != k) continue;
      first = i >= j;
      w += kind_weight[i] * post_n[col2];
    }
    if (first) g[k] = Storage<In>::store(token_value((R)Storage<In>::load(p[k]), w));
  }
  if (D > 0) {
    const R dnorm = lse[2 * row + 1];
    const bool dsoft = is_finite(dnorm);
    for (int i = lane; i < D; i += tpr) {
      R pd = R(0);
      int col, k, d;
      CHAINFB_ROLLED
      for (int j = 0; j < J; ++j)
        if (en.read(j, col, k, d) && d == i) pd += post_n[col];
      const R v = (dsoft ? Num<R>::exp_((R)Storage<In>::load(p[V + i]) - dnorm) * dur_w : R(0)) - pd;
      g[V + i] = Storage<In>::store(sc * v);
    }
  }
}

}  // namespace chainfb
