// msl-sim runtime: runs a simulated Metal dispatch on the CPU.
//
// Compiled once (per compiler and flags) into an object file that is linked
// with each generated kernel translation unit. The kernel unit provides
// `msl_sim_rt::kernel_info` (the entry point and buffer names).
//
// Execution model
// * The grid is cut into threadgroups as Metal's dispatchThreads does: the
//   threadgroup size is clamped to the grid and the last threadgroup along a
//   dimension is smaller when the grid is not a multiple of it.
// * Threadgroups are distributed over a pool of OS threads (workers). A
//   worker runs one threadgroup at a time, to completion.
// * Each simulated thread of the threadgroup is a fiber with its own stack;
//   the worker's scheduler resumes fibers one at a time. A fiber runs until it
//   reaches a SIMD-group operation or a threadgroup barrier (or returns), so
//   fibers interleave only at those points: SIMD-group operations execute in
//   lockstep over the 32 lanes, and barriers wait for the whole threadgroup.
// * `threadgroup` variables of the kernel are `static thread_local` storage:
//   one instance per worker, shared by all fibers of the threadgroup the
//   worker is running. The next threadgroup on the same worker finds the old
//   values, which matches Metal (threadgroup memory starts uninitialised).
// * Input and output buffers end exactly at an inaccessible guard page, so
//   accesses just past the end of a buffer fault and are reported by name.

#include "prelude.hpp"

// The prelude's MSL constant macros may clash with the C library's.
#undef MAXFLOAT
#undef FLT_MAX
#undef FLT_MIN
#undef FLT_EPSILON
#undef INFINITY
#undef NAN

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__ELF__) && !defined(MSL_SIM_USE_UCONTEXT)
#define MSL_SIM_ASM_SWITCH 1
#else
#define MSL_SIM_ASM_SWITCH 0
#include <ucontext.h>
#endif

namespace msl_sim_rt {

// ---------------------------------------------------------------------------
// Context switching. On x86-64 ELF a minimal switch saves only the
// callee-saved registers (a ucontext switch makes a signal-mask system call
// each time, about 100x slower). Elsewhere ucontext is used.
// ---------------------------------------------------------------------------
#if MSL_SIM_ASM_SWITCH
extern "C" void msl_sim_switch(void **save_sp, void *new_sp);
extern "C" void msl_sim_fiber_start();
asm(R"(
  .text
  .p2align 4
  .type msl_sim_switch,@function
msl_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  retq
  .size msl_sim_switch, .-msl_sim_switch

  .p2align 4
  .type msl_sim_fiber_start,@function
msl_sim_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size msl_sim_fiber_start, .-msl_sim_fiber_start
)");
#endif

enum : uint8_t { kReady, kAtSimd, kAtBarrier, kDone };

struct Fiber {
  void *sp = nullptr; // saved stack pointer while suspended
  uint8_t state = kDone;
  unsigned lane = 0, sg = 0, index = 0;
  // The operation the fiber waits at.
  const char *op = nullptr;
  const char *file = nullptr;
  int line = 0, col = 0;
  ThreadInfo info{};
  char *stack_top = nullptr;
#if !MSL_SIM_ASM_SWITCH
  ucontext_t ctx;
#endif
};

struct SimdGroup {
  // Two mailboxes, alternating between consecutive collectives: a lane that
  // has resumed from operation k can reach operation k+1 (and write its slot)
  // before the slowest lane has read the slots of operation k.
  Exchange ex[2];
  unsigned parity = 0;
  unsigned first = 0, count = 0;
};

struct Dispatch {
  uint32_t grid[3];
  uint32_t tg[3];  // threadgroup size, clamped to the grid
  uint32_t ntg[3]; // threadgroups per grid
  uint64_t total;  // number of threadgroups
};

struct Worker {
  std::vector<Fiber> fibers;
  std::vector<SimdGroup> sgs;
  void *sched_sp = nullptr;
  Fiber *cur = nullptr;
  uint32_t tgid[3] = {0, 0, 0};
#if !MSL_SIM_ASM_SWITCH
  ucontext_t sched_ctx;
#endif
};

bool strict = false;
static thread_local Worker *tl_worker = nullptr;
static void *const *g_buffers = nullptr;
static const ArgMeta *g_meta = nullptr;

// ---------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------
static std::atomic<int> g_failed{0};

void fatal(const char *fmt, ...) {
  // Only the first error is printed; other workers may be failing too.
  if (g_failed.exchange(1) == 0) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const Worker *w = tl_worker;
    if (w && w->cur) {
      const ThreadInfo &t = w->cur->info;
      fprintf(stderr,
              "msl-sim: error: %s\n  (in thread_position_in_grid (%u, %u, %u), "
              "threadgroup_position_in_grid (%u, %u, %u), thread_index_in_threadgroup %u, "
              "SIMD lane %u of SIMD-group %u)\n",
              msg, t.thread_position_in_grid.x, t.thread_position_in_grid.y,
              t.thread_position_in_grid.z, t.threadgroup_position_in_grid.x,
              t.threadgroup_position_in_grid.y, t.threadgroup_position_in_grid.z,
              t.thread_index_in_threadgroup, t.thread_index_in_simdgroup,
              t.simdgroup_index_in_threadgroup);
    } else {
      fprintf(stderr, "msl-sim: error: %s\n", msg);
    }
    fflush(stderr);
  }
  _exit(3);
}

// ---------------------------------------------------------------------------
// Fibers.
// ---------------------------------------------------------------------------
static void fiber_main(Fiber *f) {
  kernel_info.invoke(f->info, g_buffers, g_meta);
  f->state = kDone;
  Worker *w = tl_worker;
#if MSL_SIM_ASM_SWITCH
  msl_sim_switch(&f->sp, w->sched_sp);
#else
  swapcontext(&f->ctx, &w->sched_ctx);
#endif
  __builtin_trap(); // a finished fiber is never resumed
}

#if !MSL_SIM_ASM_SWITCH
static void fiber_main_uc() { fiber_main(tl_worker->cur); }
#endif

static void fiber_init(Fiber *f, size_t stack_size) {
  f->state = kReady;
#if MSL_SIM_ASM_SWITCH
  // Initial frame popped by msl_sim_switch: r15, r14, r13 = entry, r12 = arg,
  // rbx, rbp, then the return address msl_sim_fiber_start. The stack pointer
  // is 16-byte aligned when msl_sim_fiber_start makes its call.
  void **sp = reinterpret_cast<void **>(f->stack_top) - 9;
  sp[0] = nullptr;
  sp[1] = nullptr;
  sp[2] = reinterpret_cast<void *>(&fiber_main);
  sp[3] = f;
  sp[4] = nullptr;
  sp[5] = nullptr;
  sp[6] = reinterpret_cast<void *>(&msl_sim_fiber_start);
  sp[7] = nullptr;
  sp[8] = nullptr;
  f->sp = sp;
#else
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack_top - stack_size;
  f->ctx.uc_stack.ss_size = stack_size;
  f->ctx.uc_link = nullptr;
  makecontext(&f->ctx, fiber_main_uc, 0);
#endif
  (void)stack_size;
}

static inline void resume(Worker *w, Fiber *f) {
  w->cur = f;
#if MSL_SIM_ASM_SWITCH
  msl_sim_switch(&w->sched_sp, f->sp);
#else
  swapcontext(&w->sched_ctx, &f->ctx);
#endif
  w->cur = nullptr;
}

static inline void yield(Worker *w, Fiber *f) {
#if MSL_SIM_ASM_SWITCH
  msl_sim_switch(&f->sp, w->sched_sp);
#else
  swapcontext(&f->ctx, &w->sched_ctx);
#endif
}

// ---------------------------------------------------------------------------
// Operations called from kernel code.
// ---------------------------------------------------------------------------
unsigned lane() { return tl_worker->cur->lane; }

// Suspends the current fiber at operation `op` until the scheduler resumes it.
static void wait_at(Worker *w, Fiber *f, uint8_t state, const char *op, const char *file,
                    int line, int col) {
  f->state = state;
  f->op = op;
  f->file = file;
  f->line = line;
  f->col = col;
  yield(w, f);
}

const Exchange &collective(const char *op, const void *data, unsigned size, uint32_t param,
                           bool uniform_param, const char *file, int line, int col) {
  Worker *w = tl_worker;
  Fiber *f = w->cur;
  SimdGroup &sg = w->sgs[f->sg];
  Exchange &ex = sg.ex[sg.parity];
  if (size) std::memcpy(ex.slot[f->lane], data, size);
  ex.param[f->lane] = param;
  wait_at(w, f, kAtSimd, op, file, line, col);
  if (uniform_param) {
    for (unsigned l = 0; l < unsigned(kSimdWidth); ++l)
      if (((ex.active >> l) & 1u) && ex.param[l] != param)
        fatal("%s at %s:%d: the argument must be the same on all lanes of the SIMD-group, "
              "but lane %u passed %u and lane %u passed %u",
              op, file, line, f->lane, param, l, ex.param[l]);
  }
  return ex;
}

void threadgroup_barrier(const char *file, int line, int col) {
  wait_at(tl_worker, tl_worker->cur, kAtBarrier, "threadgroup_barrier", file, line, col);
}

// ---------------------------------------------------------------------------
// Scheduler.
// ---------------------------------------------------------------------------
static bool same_site(const Fiber &a, const Fiber &b) {
  return a.line == b.line && a.col == b.col && std::strcmp(a.op, b.op) == 0 &&
         std::strcmp(a.file, b.file) == 0;
}

[[noreturn]] static void divergence(Worker &w, const Fiber &a, const Fiber &b) {
  fatal("SIMD-group divergence in threadgroup (%u, %u, %u), SIMD-group %u: lane %u waits at %s "
        "(%s:%d) while lane %u waits at %s (%s:%d); msl-sim requires every lane of a "
        "SIMD-group that has not returned to reach the same SIMD-group operation",
        w.tgid[0], w.tgid[1], w.tgid[2], a.sg, a.lane, a.op, a.file, a.line, b.lane, b.op,
        b.file, b.line);
}

static void run_threadgroup(Worker &w, const Dispatch &d, uint64_t linear, size_t stack_size) {
  const uint32_t tg[3] = {uint32_t(linear % d.ntg[0]), uint32_t((linear / d.ntg[0]) % d.ntg[1]),
                          uint32_t(linear / (uint64_t(d.ntg[0]) * d.ntg[1]))};
  w.tgid[0] = tg[0];
  w.tgid[1] = tg[1];
  w.tgid[2] = tg[2];
  uint32_t size[3];
  for (int i = 0; i < 3; ++i) size[i] = std::min(d.tg[i], d.grid[i] - tg[i] * d.tg[i]);
  const unsigned n = size[0] * size[1] * size[2];
  const unsigned nominal = d.tg[0] * d.tg[1] * d.tg[2];
  const unsigned nsg = (n + kSimdWidth - 1) / kSimdWidth;

  for (unsigned i = 0; i < n; ++i) {
    Fiber &f = w.fibers[i];
    const unsigned x = i % size[0], y = (i / size[0]) % size[1], z = i / (size[0] * size[1]);
    ThreadInfo &t = f.info;
    t.thread_position_in_threadgroup = metal::uint3(x, y, z);
    t.threadgroup_position_in_grid = metal::uint3(tg[0], tg[1], tg[2]);
    t.thread_position_in_grid =
        metal::uint3(tg[0] * d.tg[0] + x, tg[1] * d.tg[1] + y, tg[2] * d.tg[2] + z);
    t.threads_per_threadgroup = metal::uint3(size[0], size[1], size[2]);
    t.dispatch_threads_per_threadgroup = metal::uint3(d.tg[0], d.tg[1], d.tg[2]);
    t.threadgroups_per_grid = metal::uint3(d.ntg[0], d.ntg[1], d.ntg[2]);
    t.threads_per_grid = metal::uint3(d.grid[0], d.grid[1], d.grid[2]);
    t.grid_size = t.threads_per_grid;
    t.grid_origin = metal::uint3(0u);
    t.thread_index_in_threadgroup = i;
    t.thread_index_in_simdgroup = i % kSimdWidth;
    t.simdgroup_index_in_threadgroup = i / kSimdWidth;
    t.simdgroups_per_threadgroup = nsg;
    t.dispatch_simdgroups_per_threadgroup = (nominal + kSimdWidth - 1) / kSimdWidth;
    t.threads_per_simdgroup = kSimdWidth;
    t.thread_execution_width = kSimdWidth;
    t.thread_index_in_quadgroup = i % 4;
    t.quadgroup_index_in_threadgroup = i / 4;
    t.quadgroups_per_threadgroup = (n + 3) / 4;
    t.dispatch_quadgroups_per_threadgroup = (nominal + 3) / 4;
    f.index = i;
    f.lane = i % kSimdWidth;
    f.sg = i / kSimdWidth;
    fiber_init(&f, stack_size);
  }
  for (unsigned s = 0; s < nsg; ++s) {
    w.sgs[s].first = s * kSimdWidth;
    w.sgs[s].count = std::min<unsigned>(kSimdWidth, n - s * kSimdWidth);
    w.sgs[s].parity = 0;
  }

  for (;;) {
    // Advance each SIMD-group as far as it can go on its own: run its ready
    // lanes until each one blocks, then complete the collective they all
    // wait at, and repeat until its lanes are at the barrier or finished.
    for (unsigned s = 0; s < nsg; ++s) {
      SimdGroup &sg = w.sgs[s];
      Fiber *lanes = &w.fibers[sg.first];
      for (;;) {
        for (unsigned l = 0; l < sg.count; ++l)
          if (lanes[l].state == kReady) resume(&w, &lanes[l]);
        uint32_t live = 0, at_simd = 0;
        for (unsigned l = 0; l < sg.count; ++l) {
          if (lanes[l].state != kDone) live |= 1u << l;
          if (lanes[l].state == kAtSimd) at_simd |= 1u << l;
        }
        if (at_simd == 0) break; // all finished or at the threadgroup barrier
        const Fiber &ref = lanes[__builtin_ctz(at_simd)];
        for (unsigned l = 0; l < sg.count; ++l)
          if (((live >> l) & 1u) && (lanes[l].state != kAtSimd || !same_site(lanes[l], ref)))
            divergence(w, ref, lanes[l]);
        sg.ex[sg.parity].active = live;
        sg.parity ^= 1u;
        for (unsigned l = 0; l < sg.count; ++l)
          if ((live >> l) & 1u) lanes[l].state = kReady;
      }
    }
    // Every thread has now returned or waits at a threadgroup barrier.
    const Fiber *waiting = nullptr, *returned = nullptr;
    unsigned n_waiting = 0;
    for (unsigned i = 0; i < n; ++i) {
      const Fiber &f = w.fibers[i];
      if (f.state == kAtBarrier) {
        if (!waiting) waiting = &f;
        ++n_waiting;
        if (!same_site(f, *waiting))
          fatal("threads of threadgroup (%u, %u, %u) wait at different threadgroup_barrier "
                "calls: thread %u at %s:%d, thread %u at %s:%d",
                tg[0], tg[1], tg[2], waiting->index, waiting->file, waiting->line, f.index,
                f.file, f.line);
      } else if (!returned) {
        returned = &f;
      }
    }
    if (!waiting) return;
    if (returned)
      fatal("threadgroup_barrier at %s:%d is reached by %u of the %u threads of threadgroup "
            "(%u, %u, %u): thread %u (thread_index_in_threadgroup) returned from the kernel "
            "without reaching it, which is undefined behaviour in Metal",
            waiting->file, waiting->line, n_waiting, n, tg[0], tg[1], tg[2], returned->index);
    for (unsigned i = 0; i < n; ++i) w.fibers[i].state = kReady;
  }
}

// ---------------------------------------------------------------------------
// Fault reporting: out-of-bounds buffer accesses and fiber stack overflows
// land on guard pages; the handler names what was hit.
// ---------------------------------------------------------------------------
struct GuardRange {
  uintptr_t lo, hi;  // region
  uintptr_t stride;  // for fiber stacks: each stride bytes begin with a guard of `guard` bytes
  uintptr_t guard;
  const char *what;  // buffer name, or nullptr for fiber stacks
  uint64_t nbytes;
};
static GuardRange g_guards[512];
static std::atomic<int> g_nguards{0};

static void add_guard(const GuardRange &g) {
  const int i = g_nguards.fetch_add(1);
  if (i < int(sizeof g_guards / sizeof g_guards[0])) g_guards[i] = g;
}

static void append(char *buf, size_t &len, const char *s) {
  while (*s && len + 1 < 1024) buf[len++] = *s++;
}
static void append_u64(char *buf, size_t &len, uint64_t v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = char('0' + v % 10);
    v /= 10;
  } while (v);
  while (n && len + 1 < 1024) buf[len++] = tmp[--n];
}

static void on_fault(int sig, siginfo_t *info, void *) {
  char buf[1024];
  size_t len = 0;
  const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  append(buf, len, "msl-sim: error: ");
  bool known = false;
  if (sig == SIGSEGV || sig == SIGBUS) {
    const int n = std::min(g_nguards.load(), int(sizeof g_guards / sizeof g_guards[0]));
    for (int i = 0; i < n && !known; ++i) {
      const GuardRange &g = g_guards[i];
      if (a < g.lo || a >= g.hi) continue;
      if (g.what) {
        append(buf, len, "out-of-bounds access past the end of buffer '");
        append(buf, len, g.what);
        append(buf, len, "' (");
        append_u64(buf, len, g.nbytes);
        append(buf, len, " bytes)");
        known = true;
      } else if ((a - g.lo) % g.stride < g.guard) {
        append(buf, len, "a simulated thread overflowed its fiber stack; set MSL_SIM_STACK_KB "
                         "to a larger size (in KiB)");
        known = true;
      }
    }
    if (!known) append(buf, len, "invalid memory access (segmentation fault) in the kernel");
  } else if (sig == SIGFPE) {
    append(buf, len, "arithmetic exception in the kernel (integer division by zero?)");
  } else {
    append(buf, len, "fatal signal ");
    append_u64(buf, len, uint64_t(sig));
  }
  append(buf, len, "\n");
  if (g_failed.exchange(1) == 0) {
    ssize_t r = write(2, buf, len);
    (void)r;
  }
  _exit(4);
}

static void install_fault_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
  sigaction(SIGFPE, &sa, nullptr);
  sigaction(SIGILL, &sa, nullptr);
}

static size_t page_size() { return size_t(sysconf(_SC_PAGESIZE)); }

static char *map_or_die(size_t bytes) {
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fatal("out of memory (mmap of %zu bytes failed)", bytes);
  return static_cast<char *>(p);
}

// Signal handlers run on an alternate stack so a fiber stack overflow can be
// reported; the alternate stack is per OS thread.
static void install_altstack() {
  const size_t size = 64 * 1024;
  stack_t ss;
  ss.ss_sp = map_or_die(size);
  ss.ss_size = size;
  ss.ss_flags = 0;
  sigaltstack(&ss, nullptr);
}

// ---------------------------------------------------------------------------
// Workers.
// ---------------------------------------------------------------------------
static void worker_main(const Dispatch *d, std::atomic<uint64_t> *next, size_t stack_size) {
  install_altstack();
  Worker w;
  const unsigned capacity = d->tg[0] * d->tg[1] * d->tg[2];
  w.fibers.resize(capacity);
  w.sgs.resize((capacity + kSimdWidth - 1) / kSimdWidth);
  const size_t guard = page_size();
  const size_t stride = stack_size + guard;
  char *stacks = map_or_die(stride * capacity);
  for (unsigned i = 0; i < capacity; ++i) {
    char *lo = stacks + i * stride; // the guard is at the low end: stacks grow down
    if (mprotect(lo, guard, PROT_NONE) != 0) fatal("mprotect failed for a fiber stack guard");
    w.fibers[i].stack_top = lo + stride;
  }
  add_guard(GuardRange{reinterpret_cast<uintptr_t>(stacks),
                       reinterpret_cast<uintptr_t>(stacks) + stride * capacity, stride, guard,
                       nullptr, 0});
  tl_worker = &w;
  for (;;) {
    const uint64_t i = next->fetch_add(1);
    if (i >= d->total) break;
    run_threadgroup(w, *d, i, stack_size);
  }
  tl_worker = nullptr;
}

// ---------------------------------------------------------------------------
// Input/output files (little-endian):
//   input:  "MSLSIMI1", u64 grid[3], u64 threadgroup[3], u32 n_in,
//           per input: u32 ndim, i32 shape[ndim], i64 strides[ndim], u64 nbytes, bytes,
//           u32 n_out, per output: u64 nbytes, bytes (initial contents)
//   output: "MSLSIMO1", u32 n_out, per output: u64 nbytes, bytes
// ---------------------------------------------------------------------------
struct Reader {
  const unsigned char *p, *end;
  void need(size_t n) {
    if (size_t(end - p) < n) fatal("malformed input file (truncated)");
  }
  template <class T> T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
};

static char *guarded_buffer(uint64_t nbytes, const char *name) {
  // The data ends where the guard page begins. The start is then aligned to
  // the largest power of two (up to 16) dividing the size.
  const size_t page = page_size();
  const size_t body = ((nbytes + page - 1) / page) * page + (nbytes == 0 ? page : 0);
  char *base = map_or_die(body + page);
  if (mprotect(base + body, page, PROT_NONE) != 0) fatal("mprotect failed for a buffer guard");
  add_guard(GuardRange{reinterpret_cast<uintptr_t>(base + body),
                       reinterpret_cast<uintptr_t>(base + body + page), page, page, name, nbytes});
  return base + body - nbytes;
}

static std::vector<unsigned char> read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) fatal("cannot open input file %s", path);
  std::vector<unsigned char> data;
  unsigned char chunk[1 << 16];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) data.insert(data.end(), chunk, chunk + n);
  fclose(f);
  return data;
}

static unsigned env_unsigned(const char *name, unsigned fallback) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end = nullptr;
  const unsigned long x = strtoul(v, &end, 10);
  if (*end || x == 0) fatal("environment variable %s must be a positive integer, got '%s'", name, v);
  return unsigned(x);
}

} // namespace msl_sim_rt

int main(int argc, char **argv) {
  using namespace msl_sim_rt;
  if (argc != 3) {
    fprintf(stderr, "usage: %s INPUT_FILE OUTPUT_FILE\n", argv[0]);
    return 2;
  }
  install_fault_handlers();
  install_altstack();
  {
    const char *v = getenv("MSL_SIM_STRICT");
    strict = v && *v && std::strcmp(v, "0") != 0;
  }

  const std::vector<unsigned char> file = read_file(argv[1]);
  Reader r{file.data(), file.data() + file.size()};
  r.need(8);
  if (std::memcmp(r.p, "MSLSIMI1", 8) != 0) fatal("input file has a bad magic number");
  r.p += 8;
  uint64_t grid[3], tgs[3];
  for (auto &g : grid) g = r.get<uint64_t>();
  for (auto &t : tgs) t = r.get<uint64_t>();

  const KernelInfo &k = kernel_info;
  const uint32_t n_in = r.get<uint32_t>();
  if (int(n_in) != k.num_inputs) fatal("input file has %u inputs, kernel expects %d", n_in, k.num_inputs);
  std::vector<void *> buffers;
  // Reads one buffer's size and contents into a guarded buffer.
  auto read_buffer = [&](const char *name) {
    const uint64_t nbytes = r.get<uint64_t>();
    r.need(nbytes);
    char *buf = guarded_buffer(nbytes, name);
    std::memcpy(buf, r.p, nbytes);
    r.p += nbytes;
    buffers.push_back(buf);
    return std::make_pair(buf, nbytes);
  };
  std::vector<ArgMeta> meta(n_in + 1);
  std::vector<std::vector<int>> shapes(n_in);
  std::vector<std::vector<int64_t>> strides(n_in);
  for (uint32_t i = 0; i < n_in; ++i) {
    const uint32_t ndim = r.get<uint32_t>();
    shapes[i].resize(ndim + 1);
    strides[i].resize(ndim + 1);
    for (uint32_t j = 0; j < ndim; ++j) shapes[i][j] = r.get<int32_t>();
    for (uint32_t j = 0; j < ndim; ++j) strides[i][j] = r.get<int64_t>();
    meta[i] = ArgMeta{shapes[i].data(), strides[i].data(), int(ndim)};
    read_buffer(k.buffer_names[i]);
  }
  const uint32_t n_out = r.get<uint32_t>();
  if (int(n_out) != k.num_outputs)
    fatal("input file has %u outputs, kernel expects %d", n_out, k.num_outputs);
  std::vector<std::pair<char *, uint64_t>> outputs;
  for (uint32_t i = 0; i < n_out; ++i) outputs.push_back(read_buffer(k.buffer_names[n_in + i]));
  g_buffers = buffers.data();
  g_meta = meta.data();

  Dispatch d;
  d.total = 1;
  for (int i = 0; i < 3; ++i) {
    if (grid[i] == 0 || tgs[i] == 0 || grid[i] > 0xffffffffull)
      fatal("invalid grid or threadgroup size");
    d.grid[i] = uint32_t(grid[i]);
    d.tg[i] = uint32_t(std::min(tgs[i], grid[i]));
    d.ntg[i] = uint32_t((grid[i] + d.tg[i] - 1) / d.tg[i]);
    d.total *= d.ntg[i];
  }

  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  unsigned nthreads = env_unsigned("MSL_SIM_THREADS", hw);
  if (uint64_t(nthreads) > d.total) nthreads = unsigned(d.total);
  const size_t page = page_size();
  size_t stack_size = size_t(env_unsigned("MSL_SIM_STACK_KB", 64)) * 1024;
  stack_size = (stack_size + page - 1) / page * page;

  std::atomic<uint64_t> next{0};
  if (nthreads == 1) {
    worker_main(&d, &next, stack_size);
  } else {
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < nthreads; ++i)
      threads.emplace_back(worker_main, &d, &next, stack_size);
    for (auto &t : threads) t.join();
  }

  FILE *out = fopen(argv[2], "wb");
  if (!out) fatal("cannot open output file %s", argv[2]);
  bool ok = fwrite("MSLSIMO1", 1, 8, out) == 8 && fwrite(&n_out, 4, 1, out) == 1;
  for (const auto &o : outputs) {
    ok = ok && fwrite(&o.second, 8, 1, out) == 1;
    ok = ok && (o.second == 0 || fwrite(o.first, 1, o.second, out) == o.second);
  }
  if (fclose(out) != 0 || !ok) fatal("cannot write output file %s", argv[2]);
  return 0;
}
