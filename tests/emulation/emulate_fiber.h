// User-level fibers for the kernel emulation (emulate.h): one per CUDA
// thread, all of a launch on the launching OS thread, switched
// cooperatively.  On x86-64 a hand-written switch saves what the System V
// ABI asks a callee to keep (rbx, rbp, r12-r15, the stack pointer, MXCSR and
// the x87 control word) and loads another fiber's; elsewhere, or with
// -DCHAINFB_EMULATE_UCONTEXT, swapcontext does it.  Stacks come from mmap
// with a PROT_NONE guard page below them (64 KiB, 256 KiB under a
// sanitizer) and are pooled across launches.
//
// Sanitizers: under AddressSanitizer every switch is announced
// (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber) and a
// stack is unpoisoned before reuse; under ThreadSanitizer each fiber is its
// own TSan fiber (__tsan_create_fiber), switched to without any
// happens-before edge (so two CUDA threads race unless a barrier of the
// emulation orders them, with __tsan_release / __tsan_acquire), and the
// emulation's own bookkeeping is hidden from race detection (IgnoreScope).
#ifndef CHAINFB_EMULATE_FIBER_H
#define CHAINFB_EMULATE_FIBER_H

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define CFB_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define CFB_EMU_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(CFB_EMU_ASAN)
#define CFB_EMU_ASAN 1
#endif
#if __has_feature(thread_sanitizer) && !defined(CFB_EMU_TSAN)
#define CFB_EMU_TSAN 1
#endif
#endif

#if defined(__x86_64__) && !defined(CHAINFB_EMULATE_UCONTEXT)
#define CFB_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#ifdef CFB_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef CFB_EMU_TSAN
#include <sanitizer/tsan_interface.h>
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif

#ifdef CFB_EMU_ASM_SWITCH
// cfb_emu_swap(save, load): push the callee-saved registers and the two
// floating-point control words on the current stack, store the stack
// pointer at *save, continue on the stack `load` (popping what an earlier
// swap, or make_stack, left there).  cfb_emu_entry: a new fiber's first
// return address; calls r13(r12) and never returns.  Weak and hidden: the
// header may be compiled into several objects of one program.
extern "C" void cfb_emu_swap(void** save, void* load);
extern "C" void cfb_emu_entry();
asm(R"(
  .pushsection .text
  .weak cfb_emu_swap
  .hidden cfb_emu_swap
  .type cfb_emu_swap, @function
  .p2align 4
cfb_emu_swap:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size cfb_emu_swap, .-cfb_emu_swap

  .weak cfb_emu_entry
  .hidden cfb_emu_entry
  .type cfb_emu_entry, @function
  .p2align 4
cfb_emu_entry:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size cfb_emu_entry, .-cfb_emu_entry
  .popsection
)");
#endif

namespace cfb_emu {

#if defined(CFB_EMU_ASAN) || defined(CFB_EMU_TSAN)
constexpr std::size_t kStackBytes = 256 * 1024;
#else
constexpr std::size_t kStackBytes = 64 * 1024;
#endif

// Hides the emulation's own reads and writes from ThreadSanitizer while in
// scope (its state passes between fibers that TSan sees as unsynchronised
// threads); nothing elsewhere.
struct IgnoreScope {
#ifdef CFB_EMU_TSAN
  IgnoreScope() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~IgnoreScope() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
#else
  IgnoreScope() {}  // (user-provided: no unused-variable warning)
#endif
  IgnoreScope(const IgnoreScope&) = delete;
  IgnoreScope& operator=(const IgnoreScope&) = delete;
};

// happens-before edges for ThreadSanitizer (nothing otherwise)
inline void tsan_release(void* addr) {
#ifdef CFB_EMU_TSAN
  __tsan_release(addr);
#else
  (void)addr;
#endif
}
inline void tsan_acquire(void* addr) {
#ifdef CFB_EMU_TSAN
  __tsan_acquire(addr);
#else
  (void)addr;
#endif
}

// A fiber's stack: [base, base + size), a guard page below base.
struct Stack {
  unsigned char* base = nullptr;
  std::size_t size = 0;
};

inline std::size_t page_bytes() {
  static const std::size_t p = (std::size_t)sysconf(_SC_PAGESIZE);
  return p;
}

// Stacks of finished fibers, reused by later ones (never unmapped).
inline std::vector<Stack>& stack_pool() {
  static std::vector<Stack> pool;
  return pool;
}

inline Stack take_stack() {
  auto& pool = stack_pool();
  if (!pool.empty()) {
    Stack s = pool.back();
    pool.pop_back();
    return s;
  }
  const std::size_t guard = page_bytes();
  void* m = mmap(nullptr, kStackBytes + guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  mprotect(m, guard, PROT_NONE);
  return Stack{static_cast<unsigned char*>(m) + guard, kStackBytes};
}

inline void give_stack(Stack s) {
#ifdef CFB_EMU_ASAN
  __asan_unpoison_memory_region(s.base, s.size);  // frames a fiber left behind
#endif
  stack_pool().push_back(s);
}

// A place execution can be suspended at and resumed from: a fiber, or the
// launching thread's own stack (`stack` empty).
struct Context {
#ifdef CFB_EMU_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
  Stack stack;
  const void* asan_bottom = nullptr;  // for the sanitizers: this context's stack
  std::size_t asan_size = 0;
  void* asan_fake = nullptr;
  void* tsan_fiber = nullptr;
};

// The context switched away from last: the one a resumed context learns its
// sanitizer stack bounds for.
inline Context* g_prev_ctx = nullptr;

// Called first thing in a context that was just switched to.
inline void after_switch(Context* self) {
#ifdef CFB_EMU_ASAN
  Context* p = g_prev_ctx;
  __sanitizer_finish_switch_fiber(self->asan_fake, &p->asan_bottom, &p->asan_size);
#else
  (void)self;
#endif
}

// Suspend `from` (abandoned for good when `from_done`) and run `to`.
inline void switch_context(Context* from, Context* to, bool from_done) {
#ifdef CFB_EMU_ASAN
  g_prev_ctx = from;
  __sanitizer_start_switch_fiber(from_done ? nullptr : &from->asan_fake, to->asan_bottom, to->asan_size);
#else
  (void)from_done;
#endif
#ifdef CFB_EMU_TSAN
  __tsan_switch_to_fiber(to->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef CFB_EMU_ASM_SWITCH
  cfb_emu_swap(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
  after_switch(from);
}

#ifndef CFB_EMU_ASM_SWITCH
template <void (*Entry)(void*)>
void ucontext_entry(unsigned hi, unsigned lo) {
  Entry(reinterpret_cast<void*>(((std::uintptr_t)hi << 32) | (std::uintptr_t)lo));
}
#endif

// Make `c` (its stack taken from the pool) start in Entry(arg) when first
// switched to.  `main` is the launching thread's context (the ucontext
// fallback returns there if Entry ever returned; it does not).
template <void (*Entry)(void*)>
void make_context(Context* c, void* arg, Context* main) {
  c->stack = take_stack();
  c->asan_bottom = c->stack.base;
  c->asan_size = c->stack.size;
  c->asan_fake = nullptr;
#ifdef CFB_EMU_TSAN
  c->tsan_fiber = __tsan_create_fiber(0);
#endif
#ifdef CFB_EMU_ASM_SWITCH
  (void)main;
  std::uintptr_t top = ((std::uintptr_t)(c->stack.base + c->stack.size)) & ~(std::uintptr_t)15;
  std::uint64_t* sp = reinterpret_cast<std::uint64_t*>(top - 16) - 8;  // 16-byte aligned
  std::uint32_t mxcsr = 0;
  std::uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  sp[0] = (std::uint64_t)mxcsr | ((std::uint64_t)fpucw << 32);
  sp[1] = 0;                                              // r15
  sp[2] = 0;                                              // r14
  sp[3] = reinterpret_cast<std::uint64_t>(Entry);         // r13: what cfb_emu_entry calls
  sp[4] = reinterpret_cast<std::uint64_t>(arg);           // r12: its argument
  sp[5] = 0;                                              // rbx
  sp[6] = 0;                                              // rbp
  sp[7] = reinterpret_cast<std::uint64_t>(&cfb_emu_entry);  // return address
  c->sp = sp;
#else
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = c->stack.base;
  c->uc.uc_stack.ss_size = c->stack.size;
  c->uc.uc_link = &main->uc;
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(arg);
  makecontext(&c->uc, reinterpret_cast<void (*)()>(&ucontext_entry<Entry>), 2, (unsigned)(a >> 32),
              (unsigned)(a & 0xffffffffu));
#endif
}

// Return a finished (or abandoned) context's stack and, when `finished`,
// its ThreadSanitizer state.
inline void free_context(Context* c, bool finished) {
#ifdef CFB_EMU_TSAN
  if (c->tsan_fiber && finished) __tsan_destroy_fiber(c->tsan_fiber);
  c->tsan_fiber = nullptr;
#else
  (void)finished;
#endif
  if (c->stack.base) give_stack(c->stack);
  c->stack = Stack{};
}

// The launching thread's context, before it first switches to a fiber.
inline void init_main_context(Context* m) {
#ifdef CFB_EMU_TSAN
  m->tsan_fiber = __tsan_get_current_fiber();
#else
  (void)m;
#endif
}

}  // namespace cfb_emu

#endif  // CHAINFB_EMULATE_FIBER_H
