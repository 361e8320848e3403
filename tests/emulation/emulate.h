// Host emulation of the CUDA subset chainfb's kernels use, so the SAME .cu
// sources (chainfb/cuda/) build with g++ (-std=c++20 -x c++
// -DCHAINFB_EMULATE, this directory on the include path: common.cuh
// includes this header in place of the CUDA headers) and run on the CPU in
// tests.
//
// Every CUDA thread of a launch is a user-level fiber (emulate_fiber.h) run
// by the launching OS thread; a fiber runs until it reaches a
// __syncthreads(), a warp intrinsic (emulate_warp.h) whose other lanes have
// not arrived yet, or its end.  A block's phase ends when every live thread
// of the block waits at __syncthreads(); the next phase starts them again.
// To catch more than a GPU run would by chance:
//   - several blocks run at once (CHAINFB_EMULATE_CONCURRENT_BLOCKS, 4 by
//     default), started in a random order and their fibers interleaved at
//     random (CHAINFB_EMULATE_SEED), each block with its own shared memory;
//   - the threads of a phase run in an order shuffled per phase, so a race
//     that depends on the order changes results from seed to seed;
//   - shared memory (CHAINFB_SHARED_ARRAY and CHAINFB_DYNAMIC_SHARED, see
//     common.cuh; a bare __shared__ does not compile here) is poisoned with
//     all-ones bytes (NaN for float and double, -1 for integers) when the
//     block starts;
//   - a barrier completed after any thread of the block has exited is an
//     error (a thread that returns drops out of the barrier, as on the GPU,
//     but the kernel then relies on undefined behaviour);
//   - a deadlock (threads waiting for others that never come, and no thread
//     able to run) is an error naming the block, not a hang;
//   - launch limits: 1..1024 threads per block, 1..2^31-1 blocks, at most
//     48 KiB of static shared memory per block and 227 KiB of static and
//     dynamic shared memory together.
// Thread block clusters (a kernel declared with __cluster_dims__(K, 1, 1),
// sm_90; its launch entry gives K): blocks K c .. K c + K - 1 form cluster
// c and always run in the same group; cluster_sync() is the cluster's
// barrier (every live thread of its K blocks), cluster_rank() a block's
// rank in it, and cluster_map(p, r) maps a pointer into the block's dynamic
// shared memory to the same place in block r's (distributed shared
// memory).  A block whose threads wait at both barriers at once, or that
// maps a pointer outside its dynamic shared memory or to a rank outside the
// cluster, is an error.
// It also counts the work the kernels annotate (CHAINFB_WORK, common.cuh):
// per block its phases, per category the span (the sum over phases of the
// largest count of any one thread in the phase), a weighted span and the
// total; and moves the results of exp / log / log1p by a few ulps on
// request (CHAINFB_EMULATE_MATH, emulate_math.h).  Errors are collected per
// launch and reported by cfb_launch (emulate_launch.cpp).
#ifndef CHAINFB_EMULATE_H
#define CHAINFB_EMULATE_H

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "emulate_fiber.h"

namespace cfb_emu {

struct uint3 {
  unsigned x, y, z;
};
using dim3 = uint3;

constexpr unsigned kMaxThreads = 1024;
constexpr std::size_t kMaxStaticShared = 48 * 1024;
constexpr std::size_t kMaxShared = 227 * 1024;  // static + dynamic, per block
constexpr int kMaxWork = 16;                    // work categories
constexpr int kShuffleWork = 5;                 // chainfb::kWorkShuffle (checked in emulate_launch.cpp)

// A small fast generator (splitmix64) for the schedule and the math noise.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return (std::size_t)(((next() >> 32) * (std::uint64_t)n) >> 32); }
};

inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) { return Rng{a ^ (b * 0xd1342543de82ef95ull)}.next(); }

enum class St : unsigned char { Ready, Running, Barrier, Warp, Exited };

struct Block;
struct WarpOp;

// One CUDA thread.
struct Fiber : Context {
  uint3 tid{0, 0, 0};
  Block* blk = nullptr;
  St state = St::Ready;
  std::uint64_t value = 0;  // its operand in a warp intrinsic, and its result
  std::uint64_t result = 0;
  int arg = 0;  // source lane, delta or lane mask
  Rng math{0};  // emulate_math.h
  std::uint64_t work[kMaxWork] = {};
};

// What one launch reports when it counts (see cfb_last_launch_stats).
struct Stats {
  std::vector<long long> phases;        // [grid]
  std::vector<double> span_weighted;    // [grid]
  long long span[kMaxWork] = {};        // max over blocks
  long long work[kMaxWork] = {};        // total
};

struct Launch {
  uint3 grid_dim{1, 1, 1}, block_dim{1, 1, 1};
  unsigned cluster_dim = 1;  // blocks a cluster
  std::size_t dynamic_shared = 0;
  void (*body)(void*) = nullptr;  // runs the kernel in the current fiber
  void* body_arg = nullptr;
  std::string error;  // the first one
  bool fatal = false;  // stop: fibers are abandoned
  Rng rng{0};          // the schedule
  std::uint64_t math_seed = 0;
  double weights[kMaxWork] = {};
  Stats* stats = nullptr;
  Context main;  // the launching thread
  std::vector<Block*> ready;  // blocks with queued fibers
  char done_sync = 0;         // TSan: fibers' ends happen before the launcher goes on
};

inline Launch* g_launch = nullptr;
inline Fiber* g_cur = nullptr;  // the running fiber
inline bool g_counting = false;
inline double g_weights[kMaxWork] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

// The blocks of one thread block cluster and its barrier.
struct Cluster {
  std::vector<Block*> blocks;  // by rank
  unsigned arrived = 0;        // blocks whose every live thread waits at cluster_sync()
  char sync[2] = {0, 0};       // TSan: as Block::sync
  long long barriers = 0;
};

struct Block {
  unsigned index = 0;
  Cluster* cluster = nullptr;  // with cluster_dim > 1
  unsigned rank = 0;           // in its cluster
  int barrier_kind = 0;        // what its waiting threads wait at: 0 nothing, 1 __syncthreads, 2 cluster_sync
  uint3 idx{0, 0, 0};
  unsigned threads = 0;
  std::unique_ptr<Fiber[]> fibers;
  std::vector<Fiber*> queue;  // to run in this phase, from `head`
  std::size_t head = 0;
  bool in_ready = false;
  bool done = false;
  unsigned live = 0;  // not exited
  unsigned exited = 0;
  std::vector<Fiber*> at_barrier;
  long long barriers = 0;  // completed
  std::vector<unsigned> exited_lanes;  // per warp
  std::vector<WarpOp*> pending;        // warp intrinsics waiting for lanes
  std::vector<WarpOp*> free_ops;
  std::vector<std::pair<const void*, unsigned char*>> statics;  // CHAINFB_SHARED_ARRAY: site -> memory
  std::size_t static_bytes = 0;
  unsigned char* dynamic = nullptr;
  char sync[2] = {0, 0};  // TSan: barrier k is an edge through sync[k & 1]
  double span_weighted = 0;
  long long span[kMaxWork] = {};
  long long total[kMaxWork] = {};
};

inline void fail(const std::string& e, bool fatal) {
  Launch& L = *g_launch;
  if (L.error.empty()) L.error = e;
  L.fatal = L.fatal || fatal;
}

inline std::string block_name(const Block* b) { return "block " + std::to_string(b->index); }

inline std::string thread_name(const Fiber* f) {
  return "thread " + std::to_string(f->tid.x) + " (warp " + std::to_string(f->tid.x / 32) + ", lane " +
         std::to_string(f->tid.x % 32) + ") of " + block_name(f->blk);
}

// ------------------------------------------------------------------ schedule

inline void make_ready(Block* b) {
  if (!b->in_ready) {
    b->in_ready = true;
    g_launch->ready.push_back(b);
  }
}

// Queue `f` at a random place among the block's queued fibers.
inline void enqueue(Block* b, Fiber* f) {
  f->state = St::Ready;
  b->queue.push_back(f);
  const std::size_t j = b->head + g_launch->rng.below(b->queue.size() - b->head);
  std::swap(b->queue[j], b->queue.back());
  make_ready(b);
}

// The next fiber to run: the next of a block drawn at random, or nullptr
// (every block waits, is done, or the launch failed).
inline Fiber* pick() {
  Launch& L = *g_launch;
  if (L.fatal || L.ready.empty()) return nullptr;
  const std::size_t i = L.ready.size() == 1 ? 0 : L.rng.below(L.ready.size());
  Block* b = L.ready[i];
  Fiber* f = b->queue[b->head++];
  if (b->head == b->queue.size()) {
    b->queue.clear();
    b->head = 0;
    b->in_ready = false;
    L.ready[i] = L.ready.back();
    L.ready.pop_back();
  }
  f->state = St::Running;
  return f;
}

// The end of a phase: its counts into the block's span and totals.
inline void end_phase(Block* b) {
  if (!g_counting) return;
  const double* w = g_launch->weights;
  long long top[kMaxWork] = {};
  double wtop = 0;
  for (unsigned t = 0; t < b->threads; ++t) {
    std::uint64_t* c = b->fibers[t].work;
    double ws = 0;
    for (int k = 0; k < kMaxWork; ++k) {
      ws += w[k] * (double)c[k];
      top[k] = std::max(top[k], (long long)c[k]);
      b->total[k] += (long long)c[k];
      c[k] = 0;
    }
    wtop = std::max(wtop, ws);
  }
  b->span_weighted += wtop;
  for (int k = 0; k < kMaxWork; ++k) b->span[k] += top[k];
}

inline void finish_block(Block* b) {
  end_phase(b);
  b->done = true;
  Stats* s = g_launch->stats;
  if (!s) return;
  s->phases[b->index] = b->barriers + 1;
  s->span_weighted[b->index] = b->span_weighted;
  for (int k = 0; k < kMaxWork; ++k) {
    s->span[k] = std::max(s->span[k], b->span[k]);
    s->work[k] += b->total[k];
  }
}

inline std::string describe_deadlock(Block* b);
inline std::string warp_waits_for(const Fiber* f);

// Every thread of `b` waiting at a barrier goes on: the phase ends.
inline void release_barrier(Block* b) {
  end_phase(b);
  ++b->barriers;
  b->barrier_kind = 0;
  b->queue.swap(b->at_barrier);
  b->at_barrier.clear();
  b->head = 0;
  Rng& r = g_launch->rng;
  for (std::size_t i = b->queue.size(); i > 1; --i) std::swap(b->queue[i - 1], b->queue[r.below(i)]);
  for (Fiber* f : b->queue) f->state = St::Ready;
  make_ready(b);
}

// Called when no fiber of `b` is queued or running: start its next phase,
// finish it, or report that it can go no further.
inline void advance(Block* b) {
  if (b->live == 0) {
    finish_block(b);
    return;
  }
  if (b->at_barrier.size() == b->live) {
    if (b->exited > 0)
      fail(std::string(b->barrier_kind == 2 ? "cluster_sync()" : "__syncthreads()") + " reached after a thread of " +
               block_name(b) + " had exited",
           false);
    if (b->barrier_kind == 2) {  // the block waits for the rest of its cluster
      Cluster* c = b->cluster;
      if (++c->arrived < c->blocks.size()) return;
      c->arrived = 0;
      ++c->barriers;
      for (Block* m : c->blocks) release_barrier(m);
      return;
    }
    release_barrier(b);
    return;
  }
  fail(describe_deadlock(b), true);
}

// The context to run after the running fiber `f` stops (made current): the
// next fiber, `f` itself again, or the launcher when none can run.
inline Context* next_context(Fiber* f) {
  Block* b = f->blk;
  if (b->head == b->queue.size()) advance(b);
  Fiber* n = pick();
  g_cur = n;
  return n ? static_cast<Context*>(n) : &g_launch->main;
}

// Suspend the running fiber `f` and run the next one (see next_context).
inline void yield(Fiber* f) {
  Context* to = next_context(f);
  if (to != f) switch_context(f, to, false);
}

// Stop the launch from inside a fiber: record `e` and never come back.
[[noreturn]] inline void abort_launch(const std::string& e) {
  fail(e, true);
  Fiber* f = g_cur;
  g_cur = nullptr;
  switch_context(f, &g_launch->main, true);
  __builtin_unreachable();
}

// ------------------------------------------------------------ CUDA surface

// Wait at a barrier of `kind` (1: the block's, 2: its cluster's).
inline void barrier(int kind) {
  IgnoreScope ignore;
  Fiber* f = g_cur;
  Block* b = f->blk;
  const std::string what = kind == 2 ? "cluster_sync()" : "__syncthreads()";
  const std::string waiting = warp_waits_for(f);
  if (!waiting.empty())
    abort_launch("deadlock in " + block_name(b) + ": " + thread_name(f) + " waits at " + what + " while " + waiting);
  if (kind == 2 && !b->cluster) abort_launch("cluster_sync() in a kernel launched without clusters");
  if (b->barrier_kind && b->barrier_kind != kind)
    abort_launch("deadlock in " + block_name(b) + ": " + thread_name(f) + " waits at " + what +
                 " while other threads of the block wait at the other barrier");
  b->barrier_kind = kind;
  char* edge = kind == 2 ? &b->cluster->sync[b->cluster->barriers & 1] : &b->sync[b->barriers & 1];
  tsan_release(edge);
  f->state = St::Barrier;
  b->at_barrier.push_back(f);
  yield(f);
  tsan_acquire(edge);
}

inline void syncthreads() { barrier(1); }
inline void cluster_sync() { barrier(2); }
inline unsigned cluster_rank() { return g_cur->blk->rank; }

// `p` (in the calling block's dynamic shared memory) at the same place in
// the dynamic shared memory of block `rank` of its cluster.
template <class T>
inline T* cluster_map(T* p, unsigned rank) {
  Block* b = g_cur->blk;
  const auto* at = reinterpret_cast<const unsigned char*>(p);
  if (!b->cluster || rank >= b->cluster->blocks.size())
    abort_launch("cluster_map: rank " + std::to_string(rank) + " outside the cluster of " + block_name(b));
  if (at < b->dynamic || at >= b->dynamic + g_launch->dynamic_shared)
    abort_launch("cluster_map: a pointer outside the dynamic shared memory of " + block_name(b));
  return reinterpret_cast<T*>(b->cluster->blocks[rank]->dynamic + (at - b->dynamic));
}

inline void fiber_exit(Fiber* f);

inline void fiber_main(void* p) {
  Fiber* f = static_cast<Fiber*>(p);
  after_switch(f);
  g_launch->body(g_launch->body_arg);
  fiber_exit(f);
}

// The block's copy of the static shared array declared at `tag`, poisoned
// on first use.
inline void* shared_array(const void* tag, std::size_t bytes) {
  IgnoreScope ignore;
  Block* b = g_cur->blk;
  for (auto& e : b->statics)
    if (e.first == tag) return e.second;
  b->static_bytes += bytes;
  if (b->static_bytes > kMaxStaticShared)
    fail(block_name(b) + " uses " + std::to_string(b->static_bytes) + " bytes of static shared memory (limit " +
             std::to_string(kMaxStaticShared) + ")",
         false);
  else if (b->static_bytes + g_launch->dynamic_shared > kMaxShared)
    fail(block_name(b) + " uses " + std::to_string(b->static_bytes) + " bytes of static and " +
             std::to_string(g_launch->dynamic_shared) + " of dynamic shared memory (limit " +
             std::to_string(kMaxShared) + " together)",
         false);
  auto* mem = static_cast<unsigned char*>(::operator new[](bytes, std::align_val_t(16)));
  std::memset(mem, 0xff, bytes);
  b->statics.emplace_back(tag, mem);
  return mem;
}

template <class T>
inline T* shared_array(const void* tag, std::size_t n) {
  return static_cast<T*>(shared_array(tag, n * sizeof(T)));
}

template <class T>
inline T* dynamic_shared() {
  return reinterpret_cast<T*>(g_cur->blk->dynamic);
}

// CHAINFB_WORK: nothing unless the launch counts.
inline void add_work(int cat, unsigned long long n) {
  if (g_counting) [[unlikely]] {
    if (cat < 0 || cat >= kMaxWork) abort_launch("CHAINFB_WORK: category " + std::to_string(cat) + " out of range");
    g_cur->work[cat] += n;
  }
}

inline unsigned env_unsigned(const char* name, unsigned dflt) {
  const char* v = std::getenv(name);
  return v && *v ? (unsigned)std::strtoul(v, nullptr, 10) : dflt;
}

}  // namespace cfb_emu

#include "emulate_math.h"
#include "emulate_warp.h"

namespace cfb_emu {

inline void fiber_exit(Fiber* f) {
  Context* to;
  {
    IgnoreScope ignore;  // (ended before the last switch: TSan wants a fiber to end outside one)
    Block* b = f->blk;
    tsan_release(&g_launch->done_sync);
    const std::string waiting = warp_waits_for(f);
    if (!waiting.empty())
      abort_launch("deadlock in " + block_name(b) + ": " + thread_name(f) + " exited while " + waiting);
    f->state = St::Exited;
    --b->live;
    ++b->exited;
    b->exited_lanes[f->tid.x / 32] |= 1u << (f->tid.x % 32);
    to = next_context(f);
  }
  switch_context(f, to, true);
  __builtin_unreachable();
}

// What a launch needs besides the kernel.
struct LaunchConfig {
  const char* name;
  unsigned grid, block;
  std::size_t shared_mem;  // dynamic shared memory per block, bytes
  bool count;
  Stats* stats;          // filled when counting
  unsigned cluster = 1;  // blocks a cluster (the kernel's __cluster_dims__)
};

inline void release_block(Block* b) {
  // (a fiber abandoned by an error may be inside an IgnoreScope: its TSan state is left alone)
  for (unsigned t = 0; t < b->threads; ++t) free_context(&b->fibers[t], b->fibers[t].state == St::Exited);
  for (auto& e : b->statics) ::operator delete[](e.second, std::align_val_t(16));
  ::operator delete[](b->dynamic, std::align_val_t(16));
  for (WarpOp* op : b->pending) delete op;
  for (WarpOp* op : b->free_ops) delete op;
}

// Run blocks order[first, last) together.
inline void run_group(Launch& L, const std::vector<unsigned>& order, unsigned first, unsigned last) {
  std::vector<std::unique_ptr<Block>> blocks;
  for (unsigned i = first; i < last; ++i) {
    auto b = std::make_unique<Block>();
    b->index = order[i];
    b->idx = {order[i], 0, 0};
    b->threads = L.block_dim.x;
    b->live = b->threads;
    b->fibers.reset(new Fiber[b->threads]);
    b->exited_lanes.assign((b->threads + 31) / 32, 0u);
    b->dynamic = static_cast<unsigned char*>(::operator new[](L.dynamic_shared, std::align_val_t(16)));
    std::memset(b->dynamic, 0xff, L.dynamic_shared);
    b->queue.reserve(b->threads);
    b->at_barrier.reserve(b->threads);
    for (unsigned t = 0; t < b->threads; ++t) {
      Fiber* f = &b->fibers[t];
      f->tid = {t, 0, 0};
      f->blk = b.get();
      f->math = Rng{mix(L.math_seed, ((std::uint64_t)b->index << 11) | t)};
      b->queue.push_back(f);
    }
    blocks.push_back(std::move(b));
  }
  // a cluster's K blocks are next to each other in the group (launch() orders them so); by rank in it
  std::vector<std::unique_ptr<Cluster>> clusters;
  const unsigned K = L.cluster_dim;
  for (std::size_t i = 0; K > 1 && i < blocks.size(); ++i) {
    if (i % K == 0) {
      clusters.push_back(std::make_unique<Cluster>());
      clusters.back()->blocks.resize(K);
    }
    Block* b = blocks[i].get();
    b->cluster = clusters.back().get();
    b->rank = b->index % K;
    b->cluster->blocks[b->rank] = b;
  }
  init_main_context(&L.main);
  try {
    for (auto& b : blocks)
      for (unsigned t = 0; t < b->threads; ++t) make_context<fiber_main>(&b->fibers[t], &b->fibers[t], &L.main);
  } catch (...) {  // no stack for a fiber: nothing ran yet
    for (auto& b : blocks) release_block(b.get());
    throw;
  }
  for (auto& b : blocks) {
    for (std::size_t i = b->queue.size(); i > 1; --i) std::swap(b->queue[i - 1], b->queue[L.rng.below(i)]);
    make_ready(b.get());
  }
  Fiber* n = pick();
  if (n) {
    g_cur = n;
    switch_context(&L.main, n, false);
  }
  g_cur = nullptr;
  tsan_acquire(&L.done_sync);
  L.ready.clear();
  for (auto& b : blocks) {
    if (!b->done && !L.fatal) fail("internal: " + block_name(b.get()) + " did not finish", true);
    release_block(b.get());
  }
}

inline std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

inline std::uint64_t hash_name(const char* s) {
  std::uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

// Run `body(arg)` as a 1-D grid of `grid` blocks of `block` threads; returns
// "" or the first error.
inline std::string launch(const LaunchConfig& c, void (*body)(void*), void* arg) {
  if (c.block < 1 || c.block > kMaxThreads)
    return "block size " + std::to_string(c.block) + " outside 1.." + std::to_string(kMaxThreads);
  if (c.grid < 1 || c.grid > 0x7fffffffu) return "grid size " + std::to_string(c.grid) + " outside 1..2^31-1";
  if (c.cluster < 1 || c.cluster > 8 || c.grid % c.cluster)
    return "a cluster of " + std::to_string(c.cluster) + " blocks for a grid of " + std::to_string(c.grid) +
           " (1..8 blocks, dividing the grid)";
  if (c.shared_mem > kMaxShared)
    return std::to_string(c.shared_mem) + " bytes of dynamic shared memory per block (limit " +
           std::to_string(kMaxShared) + " with the static)";
  std::string math_error;
  const MathMode math = math_mode_from_env(&math_error);
  if (!math_error.empty()) return math_error;
  std::lock_guard<std::mutex> lock(launch_mutex());
  IgnoreScope ignore;
  const unsigned env_seed = env_unsigned("CHAINFB_EMULATE_SEED", 12345u);
  const unsigned wanted = std::max(1u, env_unsigned("CHAINFB_EMULATE_CONCURRENT_BLOCKS", 4u));
  const unsigned concurrent = (wanted + c.cluster - 1) / c.cluster * c.cluster;  // whole clusters
  Launch L;
  L.grid_dim = {c.grid, 1, 1};
  L.block_dim = {c.block, 1, 1};
  L.dynamic_shared = c.shared_mem;
  L.body = body;
  L.body_arg = arg;
  // the schedule and the math noise: functions of the seed, the kernel and the launch's shape only, so that
  // a run repeats exactly (another seed explores another schedule)
  const std::uint64_t key = mix(mix(env_seed, hash_name(c.name)), ((std::uint64_t)c.grid << 32) ^ c.block);
  L.rng = Rng{mix(key, c.shared_mem)};
  L.math_seed = mix(key, 0x6d617468u);
  std::copy(g_weights, g_weights + kMaxWork, L.weights);
  L.stats = c.count ? c.stats : nullptr;
  if (L.stats) {
    *L.stats = Stats{};
    L.stats->phases.assign(c.grid, 0);
    L.stats->span_weighted.assign(c.grid, 0.0);
  }
  L.cluster_dim = c.cluster;
  // the blocks in a random order, a cluster's together (in a random order among themselves)
  std::vector<unsigned> clusters(c.grid / c.cluster), order;
  std::iota(clusters.begin(), clusters.end(), 0u);
  for (std::size_t i = clusters.size(); i > 1; --i) std::swap(clusters[i - 1], clusters[L.rng.below(i)]);
  order.reserve(c.grid);
  for (unsigned k : clusters) {
    const std::size_t first = order.size();
    for (unsigned r = 0; r < c.cluster; ++r) order.push_back(k * c.cluster + r);
    for (std::size_t i = c.cluster; i > 1; --i) std::swap(order[first + i - 1], order[first + L.rng.below(i)]);
  }
  g_launch = &L;
  g_counting = c.count;
  g_math = math;
  try {
    for (unsigned first = 0; first < c.grid && !L.fatal; first += concurrent)
      run_group(L, order, first, std::min(c.grid, first + concurrent));
  } catch (const std::bad_alloc&) {
    fail("out of memory for the emulated threads' stacks", true);
  }
  g_launch = nullptr;
  g_counting = false;
  g_math = MathMode::Exact;
  return L.error;
}

inline float int_as_float(int v) { return std::bit_cast<float>(v); }
inline int float_as_int(float v) { return std::bit_cast<int>(v); }
inline double longlong_as_double(long long v) { return std::bit_cast<double>(v); }

// CUDA's atomics are relaxed: no ordering between threads (ThreadSanitizer
// sees none either).
template <class T>
inline T atomic_add(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_relaxed);
}

}  // namespace cfb_emu

#define threadIdx (::cfb_emu::g_cur->tid)
#define blockIdx (::cfb_emu::g_cur->blk->idx)
#define blockDim (::cfb_emu::g_launch->block_dim)
#define gridDim (::cfb_emu::g_launch->grid_dim)
#define __syncthreads() (::cfb_emu::syncthreads())
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __cluster_dims__(...)

inline constexpr int warpSize = 32;

inline float __int_as_float(int v) { return cfb_emu::int_as_float(v); }
inline int __float_as_int(float v) { return cfb_emu::float_as_int(v); }
inline double __longlong_as_double(long long v) { return cfb_emu::longlong_as_double(v); }
// products rounded on their own (on the device: never contracted into a fused multiply-add)
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float expf(float x) { return std::exp(x); }
inline float logf(float x) { return std::log(x); }
inline float log1pf(float x) { return std::log1p(x); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }
inline float fminf(float a, float b) { return std::fmin(a, b); }
inline float fabsf(float a) { return std::fabs(a); }
using std::exp;
using std::fabs;
using std::fmax;
using std::fmin;
using std::log;
using std::log1p;
inline int atomicAdd(int* p, int v) { return cfb_emu::atomic_add(p, v); }
inline float atomicAdd(float* p, float v) { return cfb_emu::atomic_add(p, v); }
inline double atomicAdd(double* p, double v) { return cfb_emu::atomic_add(p, v); }

#include "emulate_half.h"

#endif  // CHAINFB_EMULATE_H
