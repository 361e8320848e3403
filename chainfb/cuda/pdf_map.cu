// The score map of pdf-labelled graphs on the GPU (the device half of
// chainfb/score_map.py, Kaldi's CopySpecificPdfsIndirect and
// AddSpecificPdfsIndirect): the engine's compact scores gathered from the
// network output, and the posteriors scattered back into its gradient, each
// in one launch.
//
// Layout.  The network output is any strided [N, T, P] array; element
// (n, t, p) lives at n * sN + t * sT + p * sP (in elements).  Compact column
// c = (n, p) is the fixed offset offs[c] = n * sN + p * sP, so frame t of
// column c is element t * sT + offs[c] -- a [T, width] view with row stride
// sT.  The kernels take the array as its n elements from (0, 0, 0) (a 1-D
// view of its extent), the row stride and offs [C] (int64, non-negative).
// An element outside [0, n) is never read or written: the gather gives NaN
// there and the scatter skips it (the launcher's offsets are in range, so
// neither happens).
//
// Both kernels run a grid-stride loop over the T x C entries, column
// fastest: consecutive threads read (write) one frame's columns, which
// share the frame's row of the array.
//
// Arithmetic, fixed so that the result is the NumPy path's to the bit:
//   gather:  out[t, c] = (Out) scores[t * sT + offs[c]], then clipped to
//            [(Out) lo, (Out) hi] when has_clip (a NaN stays NaN)
//   scatter: v = post[t, c]; v = v * (P) scale (when scale != 1);
//            v = v * seq_scale[col_seq[c]] (when seq_scale is given);
//            target[t * sT + offs[c]] = (G) v, or += (G) v (accumulate)
// with every product rounded on its own (mul_rn: no fused multiply-add,
// which the device compiler would otherwise form in `target + v * s`).
//
// Bytes moved are reported through CHAINFB_WORK(chainfb::kWorkBytes, n) (the
// emulation counts them; nothing on the GPU): the compact arrays' elements
// (read or written in order), and a 32-byte sector of the strided array for
// each element whose sector is not its frame's previous column's (columns
// of nearby pdfs share sectors; those of distant ones, as a CTC batch's
// labels in a large vocabulary, take one each).
#include "common.cuh"

namespace chainfb {

// The bytes of the sector holding element o of an array of `item`-byte
// elements, or 0 when the frame's previous column (element prev, -1 for
// none) was in the same sector.
__device__ __forceinline__ i64 sector_bytes(i64 o, i64 prev, int item) {
  return prev >= 0 && (o * item) / 32 == (prev * item) / 32 ? 0 : 32;
}

// a * b rounded once, never contracted with a following add.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// The compact scores out [T, C] (row-major) of the strided scores (n
// elements from (0, 0, 0); In, Out: float or double), clipped to [lo, hi]
// when has_clip (the LF-MMI denominator's [-30, 30]).
template <typename In, typename Out>
CHAINFB_KERNEL void pdf_gather(const In* scores, i64 n, i64 row_stride, const i64* offs, int T, int C, int has_clip,
                               double lo, double hi, Out* out) {
  const i64 total = (i64)T * (i64)C;
  const i64 step = (i64)gridDim.x * (i64)blockDim.x;
  const Out l = (Out)lo, h = (Out)hi;
  for (i64 i = (i64)blockIdx.x * (i64)blockDim.x + (i64)threadIdx.x; i < total; i += step) {
    const i64 t = i / C;
    const i64 c = i - t * C;
    const i64 o = t * row_stride + offs[c];
    Out v = o >= 0 && o < n ? (Out)scores[o] : Num<Out>::nan();
    if (has_clip) v = v < l ? l : (v > h ? h : v);
    out[i] = v;
    CHAINFB_WORK(kWorkBytes, sector_bytes(o, c ? t * row_stride + offs[c - 1] : -1, (int)sizeof(In)) +
                                 (i64)sizeof(Out));
  }
}

// The posteriors post [T, C] (row-major, P: float or double) written
// (accumulate == 0) or added into the strided target (n elements from
// (0, 0, 0), G: float or double), times scale (when has_scale) and, when
// seq_scale is not null, times seq_scale[col_seq[c]] (seq_scale [N] in P,
// col_seq [C]: each column's sequence).  Columns are distinct elements of a
// frame, so no two threads write one element: exact and deterministic.
template <typename P, typename G>
CHAINFB_KERNEL void pdf_scatter(G* target, i64 n, i64 row_stride, const i64* offs, const P* post, int T, int C,
                                int has_scale, double scale, const P* seq_scale, const i64* col_seq, int accumulate) {
  const i64 total = (i64)T * (i64)C;
  const i64 step = (i64)gridDim.x * (i64)blockDim.x;
  const P s = (P)scale;
  for (i64 i = (i64)blockIdx.x * (i64)blockDim.x + (i64)threadIdx.x; i < total; i += step) {
    const i64 t = i / C;
    const i64 c = i - t * C;
    const i64 o = t * row_stride + offs[c];
    if (o < 0 || o >= n) continue;
    P v = post[i];
    if (has_scale) v = mul_rn(v, s);
    if (seq_scale) v = mul_rn(v, seq_scale[col_seq[c]]);
    const G g = (G)v;
    target[o] = accumulate ? target[o] + g : g;
    CHAINFB_WORK(kWorkBytes, (i64)sizeof(P) + (accumulate ? 2 : 1) * sector_bytes(o, c ? t * row_stride + offs[c - 1]
                                                                                        : -1, (int)sizeof(G)));
  }
}

}  // namespace chainfb
