// Host-side launcher for the emulated kernels (see emulate.h): the same .cu
// sources, built with g++ -std=c++20 -DCHAINFB_EMULATE into a shared library.
// cfb_launch(name, grid, block, args) runs the kernel instantiation `name`
// (spelled as in chainfb/cuda/kernels.py) with args[i] pointing at the value
// of parameter i, like CUDA's kernelParams.
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "engine.cu"
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
std::string run(void (*k)(A...), unsigned grid, unsigned block, void** args) {
  return cfb_emu::launch(grid, block, [&] { call_with(k, args, std::index_sequence_for<A...>{}); });
}

typedef std::string (*Runner)(unsigned, unsigned, void**);

thread_local std::string last_error;
struct Entry {
  const char* name;
  Runner fn;
};

#define CFB_ENTRY(NAME, ...) \
  Entry { NAME, [](unsigned g, unsigned b, void** a) { return run(&__VA_ARGS__, g, b, a); } }

using chainfb::BF16;
using chainfb::F16;

const Entry kTable[] = {
    CFB_ENTRY("chainfb::fb_forward<float>", chainfb::fb_forward<float>),
    CFB_ENTRY("chainfb::fb_forward<double>", chainfb::fb_forward<double>),
    CFB_ENTRY("chainfb::fb_backward<float>", chainfb::fb_backward<float>),
    CFB_ENTRY("chainfb::fb_backward<double>", chainfb::fb_backward<double>),
    CFB_ENTRY("chainfb::fb_shared_forward<float>", chainfb::fb_shared_forward<float>),
    CFB_ENTRY("chainfb::fb_shared_forward<double>", chainfb::fb_shared_forward<double>),
    CFB_ENTRY("chainfb::fb_shared_backward<float>", chainfb::fb_shared_backward<float>),
    CFB_ENTRY("chainfb::fb_shared_backward<double>", chainfb::fb_shared_backward<double>),
    CFB_ENTRY("chainfb::transducer_gather<float, float>", chainfb::transducer_gather<float, float>),
    CFB_ENTRY("chainfb::transducer_gather<double, double>", chainfb::transducer_gather<double, double>),
    CFB_ENTRY("chainfb::transducer_gather<chainfb::F16, float>", chainfb::transducer_gather<F16, float>),
    CFB_ENTRY("chainfb::transducer_gather<chainfb::BF16, float>", chainfb::transducer_gather<BF16, float>),
    CFB_ENTRY("chainfb::transducer_grad<float, float>", chainfb::transducer_grad<float, float>),
    CFB_ENTRY("chainfb::transducer_grad<double, double>", chainfb::transducer_grad<double, double>),
    CFB_ENTRY("chainfb::transducer_grad<chainfb::F16, float>", chainfb::transducer_grad<F16, float>),
    CFB_ENTRY("chainfb::transducer_grad<chainfb::BF16, float>", chainfb::transducer_grad<BF16, float>),
    CFB_ENTRY("chainfb::transducer_zero_col<float>", chainfb::transducer_zero_col<float>),
    CFB_ENTRY("chainfb::transducer_zero_col<double>", chainfb::transducer_zero_col<double>),
#ifdef CHAINFB_EMULATE_SELFTEST
    CFB_ENTRY("cfb_selftest::early_exit_then_sync", cfb_selftest::early_exit_then_sync),
    CFB_ENTRY("cfb_selftest::read_shared_first", cfb_selftest::read_shared_first),
    CFB_ENTRY("cfb_selftest::too_much_shared", cfb_selftest::too_much_shared),
    CFB_ENTRY("cfb_selftest::block_order", cfb_selftest::block_order),
#endif
};

}  // namespace

extern "C" int cfb_num_kernels() { return (int)(sizeof(kTable) / sizeof(kTable[0])); }

extern "C" const char* cfb_kernel_name(int i) { return kTable[i].name; }

// 0: done; -1: unknown kernel; 1: the launch failed or the kernel broke a
// rule the emulation checks (message in cfb_last_error()).
extern "C" int cfb_launch(const char* name, unsigned grid, unsigned block, void** args) {
  for (const Entry& e : kTable) {
    if (std::strcmp(e.name, name) == 0) {
      last_error = e.fn(grid, block, args);
      return last_error.empty() ? 0 : 1;
    }
  }
  return -1;
}

extern "C" const char* cfb_last_error() { return last_error.c_str(); }
