// Replays kernel launches recorded by EmulatedBackend (backend.py, record_to=DIR)
// in a standalone program, so the emulation can run under
// sanitizers that cannot be preloaded into Python (ThreadSanitizer).  Built
// with emulate_launch.cpp; usage: replay FILE...  Each file holds one launch:
//   u32 name_len, name, u32 grid, u32 block, u32 shared_mem (dynamic, bytes),
//   u32 nargs,
//   per argument: u8 kind (0 array, 1 scalar), u64 nbytes, the bytes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

extern "C" int cfb_launch_ex(const char* name, unsigned grid, unsigned block, unsigned shared_mem, void** args,
                             int count);
extern "C" const char* cfb_last_error();

template <class T>
static bool get(FILE* f, T* v) {
  return std::fread(v, sizeof(T), 1, f) == 1;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    FILE* f = std::fopen(argv[i], "rb");
    if (!f) return 2;
    std::uint32_t len = 0, grid = 0, block = 0, shared_mem = 0, nargs = 0;
    if (!get(f, &len)) return 3;
    std::vector<char> name(len + 1, 0);
    if (std::fread(name.data(), 1, len, f) != len || !get(f, &grid) || !get(f, &block) || !get(f, &shared_mem) ||
        !get(f, &nargs))
      return 3;
    std::vector<std::vector<unsigned char>> data(nargs);
    std::vector<void*> ptrs(nargs), args(nargs);
    for (std::uint32_t a = 0; a < nargs; ++a) {
      std::uint8_t kind = 0;
      std::uint64_t n = 0;
      if (!get(f, &kind) || !get(f, &n)) return 3;
      data[a].resize(n ? n : 1);
      if (n && std::fread(data[a].data(), 1, n, f) != n) return 3;
      ptrs[a] = n ? data[a].data() : nullptr;
      args[a] = kind == 0 ? static_cast<void*>(&ptrs[a]) : static_cast<void*>(data[a].data());
    }
    std::fclose(f);
    int rc = cfb_launch_ex(name.data(), grid, block, shared_mem, args.data(), 0);
    if (rc != 0) {
      std::fprintf(stderr, "%s: %s\n", name.data(), rc == -1 ? "unknown kernel" : cfb_last_error());
      return 4;
    }
  }
  std::printf("REPLAYED %d\n", argc - 1);
  return 0;
}
