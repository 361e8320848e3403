// Host-side launcher for the emulated kernels (see emulate.h): the same .cu
// sources, built with g++ -std=c++20 -DCHAINFB_EMULATE into a shared library.
// cfb_launch_ex(name, grid, block, shared_mem, args, count) runs the kernel
// instantiation `name` (spelled as in chainfb/cuda/kernels.py) with args[i]
// pointing at the value of parameter i, like CUDA's kernelParams, and
// `shared_mem` bytes of dynamic shared memory per block; with `count` it
// keeps the launch's work counts for cfb_last_launch_stats.
// cfb_launch(name, grid, block, args) is the same without either.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "cluster.cu"
#include "engine.cu"
#include "pdf_map.cu"
#include "shared_graph.cu"
#include "transducer.cu"
#ifdef CHAINFB_EMULATE_SELFTEST
#include "emulate_selftest.h"
#endif

namespace {

template <class... A, std::size_t... I>
void call_with(void (*k)(A...), void** args, std::index_sequence<I...>) {
  k(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

template <class... A>
struct Call {
  void (*k)(A...);
  void** args;
  static void run(void* self) {
    Call* c = static_cast<Call*>(self);
    call_with(c->k, c->args, std::index_sequence_for<A...>{});
  }
};

template <class... A>
std::string run(void (*k)(A...), const cfb_emu::LaunchConfig& cfg, void** args) {
  Call<A...> c{k, args};
  return cfb_emu::launch(cfg, &Call<A...>::run, &c);
}

typedef std::string (*Runner)(const cfb_emu::LaunchConfig&, void**);

thread_local std::string last_error;
cfb_emu::Stats last_stats;
bool have_stats = false;

// The names of chainfb::Work's categories, as Python sees them.
const char* const kWorkNames[] = {"kWorkArcF",         "kWorkArcD",         "kWorkStateF",       "kWorkStateD",
                                  "kWorkBytes",        "kWorkShuffle",      "kWorkArcSharedF",   "kWorkArcSharedD",
                                  "kWorkStateSharedF", "kWorkStateSharedD", "kWorkMemoryWait"};
static_assert(sizeof(kWorkNames) / sizeof(kWorkNames[0]) == chainfb::kWorkCount, "a name per chainfb::Work");
static_assert(chainfb::kWorkCount <= cfb_emu::kMaxWork, "at most 16 work categories");
static_assert(chainfb::kWorkShuffle == cfb_emu::kShuffleWork, "the category the emulation counts shuffles in");
struct Entry {
  const char* name;
  Runner fn;
  unsigned cluster = 1;  // the kernel's __cluster_dims__
};

#define CFB_ENTRY(NAME, ...) \
  Entry { NAME, [](const cfb_emu::LaunchConfig& c, void** a) { return run(&__VA_ARGS__, c, a); } }
#define CFB_CLUSTER_ENTRY(NAME, K, ...) \
  Entry { NAME, [](const cfb_emu::LaunchConfig& c, void** a) { return run(&__VA_ARGS__, c, a); }, K }

using chainfb::BF16;
using chainfb::F16;

const Entry kTable[] = {
    CFB_ENTRY("chainfb::fb_recursion<float>", chainfb::fb_recursion<float>),
    CFB_ENTRY("chainfb::fb_recursion<double>", chainfb::fb_recursion<double>),
    CFB_ENTRY("chainfb::fb_posteriors<float>", chainfb::fb_posteriors<float>),
    CFB_ENTRY("chainfb::fb_posteriors<double>", chainfb::fb_posteriors<double>),
    CFB_CLUSTER_ENTRY("chainfb::fb_cluster_recursion<float, 2>", 2, chainfb::fb_cluster_recursion<float, 2>),
    CFB_CLUSTER_ENTRY("chainfb::fb_cluster_recursion<float, 4>", 4, chainfb::fb_cluster_recursion<float, 4>),
    CFB_CLUSTER_ENTRY("chainfb::fb_cluster_recursion<float, 8>", 8, chainfb::fb_cluster_recursion<float, 8>),
    CFB_CLUSTER_ENTRY("chainfb::fb_cluster_recursion<double, 2>", 2, chainfb::fb_cluster_recursion<double, 2>),
    CFB_CLUSTER_ENTRY("chainfb::fb_cluster_recursion<double, 4>", 4, chainfb::fb_cluster_recursion<double, 4>),
    CFB_CLUSTER_ENTRY("chainfb::fb_cluster_recursion<double, 8>", 8, chainfb::fb_cluster_recursion<double, 8>),
    CFB_ENTRY("chainfb::fb_shared_recursion<float>", chainfb::fb_shared_recursion<float>),
    CFB_ENTRY("chainfb::fb_shared_recursion<double>", chainfb::fb_shared_recursion<double>),
    CFB_ENTRY("chainfb::fb_shared_posteriors<float>", chainfb::fb_shared_posteriors<float>),
    CFB_ENTRY("chainfb::fb_shared_posteriors<double>", chainfb::fb_shared_posteriors<double>),
    CFB_ENTRY("chainfb::pdf_gather<float, float>", chainfb::pdf_gather<float, float>),
    CFB_ENTRY("chainfb::pdf_gather<float, double>", chainfb::pdf_gather<float, double>),
    CFB_ENTRY("chainfb::pdf_gather<double, double>", chainfb::pdf_gather<double, double>),
    CFB_ENTRY("chainfb::pdf_scatter<float, float>", chainfb::pdf_scatter<float, float>),
    CFB_ENTRY("chainfb::pdf_scatter<double, float>", chainfb::pdf_scatter<double, float>),
    CFB_ENTRY("chainfb::pdf_scatter<double, double>", chainfb::pdf_scatter<double, double>),
    CFB_ENTRY("chainfb::transducer_gather<float, float>", chainfb::transducer_gather<float, float>),
    CFB_ENTRY("chainfb::transducer_gather<double, double>", chainfb::transducer_gather<double, double>),
    CFB_ENTRY("chainfb::transducer_gather<chainfb::F16, float>", chainfb::transducer_gather<F16, float>),
    CFB_ENTRY("chainfb::transducer_gather<chainfb::BF16, float>", chainfb::transducer_gather<BF16, float>),
    CFB_ENTRY("chainfb::transducer_grad<float, float>", chainfb::transducer_grad<float, float>),
    CFB_ENTRY("chainfb::transducer_grad<double, double>", chainfb::transducer_grad<double, double>),
    CFB_ENTRY("chainfb::transducer_grad<chainfb::F16, float>", chainfb::transducer_grad<F16, float>),
    CFB_ENTRY("chainfb::transducer_grad<chainfb::BF16, float>", chainfb::transducer_grad<BF16, float>),
#ifdef CHAINFB_EMULATE_SELFTEST
    CFB_ENTRY("cfb_selftest::early_exit_then_sync", cfb_selftest::early_exit_then_sync),
    CFB_ENTRY("cfb_selftest::read_shared_first", cfb_selftest::read_shared_first),
    CFB_ENTRY("cfb_selftest::too_much_shared", cfb_selftest::too_much_shared),
    CFB_ENTRY("cfb_selftest::block_order", cfb_selftest::block_order),
    CFB_ENTRY("cfb_selftest::shared_race", cfb_selftest::shared_race),
    CFB_ENTRY("cfb_selftest::work_counts", cfb_selftest::work_counts),
    CFB_ENTRY("cfb_selftest::shuffles", cfb_selftest::shuffles),
    CFB_ENTRY("cfb_selftest::warp_sum", cfb_selftest::warp_sum),
    CFB_ENTRY("cfb_selftest::phase_order", cfb_selftest::phase_order),
    CFB_ENTRY("cfb_selftest::warp_misuse", cfb_selftest::warp_misuse),
    CFB_ENTRY("cfb_selftest::warp_handoff", cfb_selftest::warp_handoff),
    CFB_ENTRY("cfb_selftest::dynamic_shared", cfb_selftest::dynamic_shared),
    CFB_CLUSTER_ENTRY("cfb_selftest::cluster_exchange", 2, cfb_selftest::cluster_exchange),
    CFB_ENTRY("cfb_selftest::math_funcs<float>", cfb_selftest::math_funcs<float>),
    CFB_ENTRY("cfb_selftest::math_funcs<double>", cfb_selftest::math_funcs<double>),
#endif
};

}  // namespace

extern "C" int cfb_num_kernels() { return (int)(sizeof(kTable) / sizeof(kTable[0])); }

extern "C" const char* cfb_kernel_name(int i) { return kTable[i].name; }

// 0: done; -1: unknown kernel; 1: the launch failed or the kernel broke a
// rule the emulation checks (message in cfb_last_error()).
extern "C" int cfb_launch_ex(const char* name, unsigned grid, unsigned block, unsigned shared_mem, void** args,
                             int count) {
  for (const Entry& e : kTable) {
    if (std::strcmp(e.name, name) == 0) {
      cfb_emu::Stats stats;
      last_error = e.fn(cfb_emu::LaunchConfig{name, grid, block, shared_mem, count != 0, &stats, e.cluster}, args);
      if (count) {
        last_stats = std::move(stats);
        have_stats = true;
      }
      return last_error.empty() ? 0 : 1;
    }
  }
  return -1;
}

extern "C" int cfb_launch(const char* name, unsigned grid, unsigned block, void** args) {
  return cfb_launch_ex(name, grid, block, 0, args, 0);
}

extern "C" const char* cfb_last_error() { return last_error.c_str(); }

extern "C" int cfb_num_work_categories() { return chainfb::kWorkCount; }

extern "C" const char* cfb_work_category_name(int i) {
  return i >= 0 && i < chainfb::kWorkCount ? kWorkNames[i] : nullptr;
}

// Weights of the categories 0..n-1 in the weighted span of later launches
// (the others keep theirs; every weight is 1 at first).
extern "C" void cfb_set_work_weights(const double* w, int n) {
  for (int i = 0; i < n && i < cfb_emu::kMaxWork; ++i) cfb_emu::g_weights[i] = w[i];
}

// The counts of the last launch run with count != 0: per block its phases
// (barriers + 1) and weighted span ([grid] each), per category the span
// (the largest over blocks) and the total ([cfb_num_work_categories()]
// each).  0, or -1 when there is none or its grid is not `grid`.
extern "C" int cfb_last_launch_stats(unsigned grid, long long* phases, double* span_weighted, long long* span,
                                     long long* work) {
  if (!have_stats || last_stats.phases.size() != grid) return -1;
  std::copy(last_stats.phases.begin(), last_stats.phases.end(), phases);
  std::copy(last_stats.span_weighted.begin(), last_stats.span_weighted.end(), span_weighted);
  std::copy(last_stats.span, last_stats.span + chainfb::kWorkCount, span);
  std::copy(last_stats.work, last_stats.work + chainfb::kWorkCount, work);
  return 0;
}
