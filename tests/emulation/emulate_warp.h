// Warp intrinsics of the kernel emulation (included by emulate.h):
// __shfl_sync, __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync (int,
// unsigned, long, unsigned long, long long, unsigned long long, float,
// double), __syncwarp and __activemask.  A warp is 32 consecutive threads
// of the block; the last one may be partial.
//
// A thread calling a shuffle or __syncwarp waits until every lane its mask
// names has made the same call (the same intrinsic at the same source
// line, with the same mask, width and operand size); the values are then
// exchanged as PTX's shfl.sync defines them (a source lane outside the
// lane's segment of `width` lanes gives the lane its own value), and the
// lanes go on in a random order.  An error stops the launch: a mask that
// does not name the caller or names lanes the warp does not have, a lane
// named in the mask that has exited, waits at __syncthreads() or calls
// another intrinsic (the warp diverged), a width that is not a power of two
// in 1..32, or a read from a lane outside the mask (undefined on the GPU).
// __activemask() gives the lanes of the warp that exist and have not
// exited.  Each call of a shuffle or __syncwarp counts one kWorkShuffle.
// __syncwarp orders memory among its lanes (a happens-before edge for
// ThreadSanitizer); a shuffle exchanges registers only, as on the GPU.
#ifndef CHAINFB_EMULATE_WARP_H
#define CHAINFB_EMULATE_WARP_H

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <source_location>
#include <string>

namespace cfb_emu {

enum class WarpKind : unsigned char { Idx, Up, Down, Xor, Sync };

// One warp intrinsic call that lanes are waiting at.
struct WarpOp {
  unsigned warp = 0;
  WarpKind kind = WarpKind::Sync;
  unsigned mask = 0;
  int width = 32;
  unsigned size = 0;
  const char* file = "";
  unsigned line = 0;
  unsigned arrived = 0;  // lanes
  int refs = 0;          // lanes that have not yet taken their result
  char edge = 0;         // TSan: __syncwarp's happens-before edge
};

inline const char* warp_kind_name(WarpKind k) {
  switch (k) {
    case WarpKind::Idx: return "__shfl_sync";
    case WarpKind::Up: return "__shfl_up_sync";
    case WarpKind::Down: return "__shfl_down_sync";
    case WarpKind::Xor: return "__shfl_xor_sync";
    default: return "__syncwarp";
  }
}

inline std::string hex_mask(unsigned m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", m);
  return buf;
}

// "3", "0-4, 7": the set bits of a lane mask
inline std::string lane_list(unsigned bits) {
  std::string s;
  for (int l = 0; l < 32; ++l) {
    if (!(bits >> l & 1u)) continue;
    int e = l;
    while (e < 31 && (bits >> (e + 1) & 1u)) ++e;
    if (!s.empty()) s += ", ";
    s += std::to_string(l);
    if (e > l) s += "-" + std::to_string(e);
    l = e;
  }
  return s;
}

inline std::string site_name(WarpKind kind, unsigned mask, const char* file, unsigned line) {
  const char* base = std::strrchr(file, '/');
  return std::string(warp_kind_name(kind)) + "(" + hex_mask(mask) + ") at " + (base ? base + 1 : file) + ":" +
         std::to_string(line);
}

inline std::string op_name(const WarpOp* op) { return site_name(op->kind, op->mask, op->file, op->line); }

// "" or, when lanes of f's warp wait at an intrinsic whose mask names f and
// f has not arrived there, who waits where.
inline std::string warp_waits_for(const Fiber* f) {
  const unsigned warp = f->tid.x / 32, lane = f->tid.x % 32;
  for (const WarpOp* op : f->blk->pending)
    if (op->warp == warp && (op->mask >> lane & 1u) && !(op->arrived >> lane & 1u))
      return "lanes " + lane_list(op->arrived) + " of its warp wait for it at " + op_name(op);
  return "";
}

inline std::string describe_deadlock(Block* b) {
  std::string s = "deadlock in " + block_name(b) + ": no thread can go on (" + std::to_string(b->at_barrier.size()) +
                  " wait at __syncthreads()";
  for (const WarpOp* op : b->pending)
    s += "; lanes " + lane_list(op->arrived) + " of warp " + std::to_string(op->warp) + " wait at " + op_name(op) +
         " for lanes " + lane_list(op->mask & ~op->arrived);
  return s + ")";
}

// The lanes warp `warp` of `b` has.
inline unsigned warp_lanes(const Block* b, unsigned warp) {
  const unsigned n = std::min(32u, b->threads - warp * 32);
  return n == 32 ? ~0u : (1u << n) - 1u;
}

// Where lane l reads from in `op` (PTX shfl.sync: segmask from the width,
// an out-of-segment source gives the lane's own value).
inline unsigned source_lane(const WarpOp* op, unsigned l, int arg) {
  const unsigned seg = (unsigned)(32 - op->width) & 31u;
  const unsigned b = (unsigned)arg & 31u;
  const int lo = (int)(l & seg), hi = (int)((l & seg) | (31u & ~seg));
  int j = (int)l;
  switch (op->kind) {
    case WarpKind::Idx: j = lo | (int)(b & ~seg); break;
    case WarpKind::Up: j = (int)l - (int)b; if (j < lo) j = (int)l; break;
    case WarpKind::Down: j = (int)l + (int)b; if (j > hi) j = (int)l; break;
    case WarpKind::Xor: j = (int)(l ^ b); if (j > hi) j = (int)l; break;
    default: break;
  }
  return (unsigned)j;
}

// Every lane of `op` has arrived (`f` last): results out, the others queued.
inline void complete(Block* b, WarpOp* op, Fiber* f) {
  const unsigned first = op->warp * 32;
  for (unsigned l = 0; l < 32; ++l) {
    if (!(op->mask >> l & 1u)) continue;
    Fiber* g = &b->fibers[first + l];
    if (op->kind != WarpKind::Sync) {
      const unsigned j = source_lane(op, l, g->arg);
      if (!(op->mask >> j & 1u))
        abort_launch(thread_name(g) + " reads lane " + std::to_string(j) + " in " + op_name(op) +
                     ", a lane outside the mask (undefined on the GPU)");
      g->result = b->fibers[first + j].value;
    }
    if (g != f) enqueue(b, g);
  }
  for (std::size_t i = 0; i < b->pending.size(); ++i)
    if (b->pending[i] == op) {
      b->pending[i] = b->pending.back();
      b->pending.pop_back();
      break;
    }
}

inline std::uint64_t warp_op(WarpKind kind, unsigned mask, std::uint64_t value, int arg, int width, unsigned size,
                             const std::source_location& loc) {
  IgnoreScope ignore;
  Fiber* f = g_cur;
  Block* b = f->blk;
  if (g_counting) f->work[kShuffleWork] += 1;
  const unsigned warp = f->tid.x / 32, lane = f->tid.x % 32;
  const unsigned have = warp_lanes(b, warp);
  auto here = [&] { return thread_name(f) + " calls " + site_name(kind, mask, loc.file_name(), loc.line()); };
  if (!(mask >> lane & 1u)) abort_launch(here() + ", a mask without its own lane");
  if (mask & ~have)
    abort_launch(here() + ": the mask names lanes " + lane_list(mask & ~have) + " that warp " +
                 std::to_string(warp) + " does not have (it has lanes " + lane_list(have) + ")");
  if (width < 1 || width > 32 || (width & (width - 1)))
    abort_launch(here() + " with width " + std::to_string(width) + " (a power of two in 1..32)");
  WarpOp* op = nullptr;
  for (WarpOp* o : b->pending)
    if (o->warp == warp && (o->mask & mask)) op = o;
  if (op && (op->mask != mask || op->kind != kind || op->width != width || op->size != size ||
             op->line != loc.line() || std::strcmp(op->file, loc.file_name()) != 0))
    abort_launch("deadlock in " + block_name(b) + ": warp " + std::to_string(warp) + " diverged: " + here() +
                 " while lanes " + lane_list(op->arrived) + " wait at " + op_name(op));
  if (!op) {
    const unsigned gone = mask & b->exited_lanes[warp];
    if (gone)
      abort_launch("deadlock in " + block_name(b) + ": " + here() + " but lanes " + lane_list(gone) +
                   " of the mask have exited");
    unsigned at_barrier = 0;
    for (unsigned l = 0; l < 32; ++l)
      if ((mask >> l & 1u) && b->fibers[warp * 32 + l].state == St::Barrier) at_barrier |= 1u << l;
    if (at_barrier)
      abort_launch("deadlock in " + block_name(b) + ": " + here() + " while lanes " + lane_list(at_barrier) +
                   " of the mask wait at __syncthreads()");
    if (b->free_ops.empty()) {
      op = new WarpOp;
    } else {
      op = b->free_ops.back();
      b->free_ops.pop_back();
      *op = WarpOp{};
    }
    op->warp = warp;
    op->kind = kind;
    op->mask = mask;
    op->width = width;
    op->size = size;
    op->file = loc.file_name();
    op->line = loc.line();
    b->pending.push_back(op);
  }
  f->value = value;
  f->arg = arg;
  op->arrived |= 1u << lane;
  ++op->refs;
  if (kind == WarpKind::Sync) tsan_release(&op->edge);
  if (op->arrived != mask) {
    f->state = St::Warp;
  } else {
    complete(b, op, f);
    enqueue(b, f);
  }
  yield(f);
  if (kind == WarpKind::Sync) tsan_acquire(&op->edge);
  const std::uint64_t r = f->result;
  if (--op->refs == 0) b->free_ops.push_back(op);
  return r;
}

template <class T>
inline T shuffle(WarpKind kind, unsigned mask, T var, int arg, int width, const std::source_location& loc) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = warp_op(kind, mask, bits, arg, width, sizeof(T), loc);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

inline unsigned activemask() {
  const Fiber* f = g_cur;
  const unsigned warp = f->tid.x / 32;
  return warp_lanes(f->blk, warp) & ~f->blk->exited_lanes[warp];
}

}  // namespace cfb_emu

#define CFB_EMU_SHUFFLES(T)                                                                                   \
  inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,                                    \
                       std::source_location loc = std::source_location::current()) {                          \
    return ::cfb_emu::shuffle<T>(::cfb_emu::WarpKind::Idx, mask, var, src_lane, width, loc);                  \
  }                                                                                                           \
  inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,                               \
                          std::source_location loc = std::source_location::current()) {                       \
    return ::cfb_emu::shuffle<T>(::cfb_emu::WarpKind::Up, mask, var, (int)(delta & 31u), width, loc);         \
  }                                                                                                           \
  inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,                             \
                            std::source_location loc = std::source_location::current()) {                     \
    return ::cfb_emu::shuffle<T>(::cfb_emu::WarpKind::Down, mask, var, (int)(delta & 31u), width, loc);       \
  }                                                                                                           \
  inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,                               \
                           std::source_location loc = std::source_location::current()) {                      \
    return ::cfb_emu::shuffle<T>(::cfb_emu::WarpKind::Xor, mask, var, lane_mask, width, loc);                 \
  }

CFB_EMU_SHUFFLES(int)
CFB_EMU_SHUFFLES(unsigned)
CFB_EMU_SHUFFLES(long)
CFB_EMU_SHUFFLES(unsigned long)
CFB_EMU_SHUFFLES(long long)
CFB_EMU_SHUFFLES(unsigned long long)
CFB_EMU_SHUFFLES(float)
CFB_EMU_SHUFFLES(double)
#undef CFB_EMU_SHUFFLES

inline void __syncwarp(unsigned mask = 0xffffffffu, std::source_location loc = std::source_location::current()) {
  ::cfb_emu::warp_op(::cfb_emu::WarpKind::Sync, mask, 0, 0, 32, 0, loc);
}

inline unsigned __activemask() { return ::cfb_emu::activemask(); }

#endif  // CHAINFB_EMULATE_WARP_H
