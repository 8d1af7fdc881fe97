// runtime.cpp — the MSL emulator's scheduler: runs one dispatch as a grid of threadgroups whose GPU
// threads are fibers on the calling OS thread. Deterministic for a given mode and seed, reentrant
// (all state lives in the dispatch object; the only global is a thread-local pointer to it), and it
// reports kernel faults (deadlock, livelock, divergent barriers or simd ops) instead of hanging.
#include "runtime.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace {

// ---------------------------------------------------------------- context switch
#if defined(__x86_64__)
// A hand-written switch: ucontext's swapcontext makes a sigprocmask syscall per switch (~4x
// slower). Saves callee-saved registers plus the SSE and x87 control words.
extern "C" void msl_emu_switch(void** save_sp, void* new_sp);
extern "C" void msl_emu_fiber_entry();
asm(R"(
.text
.p2align 4
.globl msl_emu_switch
.hidden msl_emu_switch
.type msl_emu_switch,@function
msl_emu_switch:
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
.size msl_emu_switch,.-msl_emu_switch
.p2align 4
.globl msl_emu_fiber_entry
.hidden msl_emu_fiber_entry
.type msl_emu_fiber_entry,@function
msl_emu_fiber_entry:
    movq %rbx, %rdi
    call msl_emu_fiber_main
    ud2
.size msl_emu_fiber_entry,.-msl_emu_fiber_entry
)");
#endif

const size_t kStack = 256 * 1024;  // kernels may keep sizeable local arrays

struct Stack {
    void* base;  // guard page first
    size_t len;
};

// Stacks are pooled per OS thread: a megakernel dispatch creates thousands of fibers.
struct StackPool {
    std::vector<Stack> free;
    ~StackPool() {
        for (auto& s : free) munmap(s.base, s.len);
    }
    bool get(Stack* out) {
        if (!free.empty()) {
            *out = free.back();
            free.pop_back();
            return true;
        }
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t len = kStack + page;
        void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return false;
        mprotect(p, page, PROT_NONE);  // overflow faults instead of corrupting a neighbour
        *out = Stack{p, len};
        return true;
    }
    void put(const Stack& s) {
        if (free.size() < 16384) free.push_back(s);
        else munmap(s.base, s.len);
    }
};
thread_local StackPool t_pool;

struct Site {
    const char* file = nullptr;
    unsigned line = 0, col = 0;
    bool same(const Site& o) const {
        return line == o.line && col == o.col && (file == o.file || (file && o.file && !strcmp(file, o.file)));
    }
    std::string str() const {
        if (!file) return "?";
        return std::string(file) + ":" + std::to_string(line);
    }
};

enum FState { RUNNABLE, WAIT_TG, WAIT_SIMD, DONE };

struct Group;
struct Fiber {
    msl_emu_thread info;
    Group* g = nullptr;
    Stack stack{};
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
    FState st = RUNNABLE;
    Site wait;          // where it blocks (or last polled)
    unsigned simd_buf = 0;
    bool started = false;
};

struct Simd {
    uint32_t active = 0, arrived = 0;
    unsigned gen = 0;
    uint32_t done_active[2] = {0, 0};  // lanes that took part, per slot set
    Site site;
    alignas(32) unsigned char slots[2][32][32];
};

struct TgVar {
    void* tag;
    unsigned char* mem;
};

struct Priv {  // incoherent mode: this group's view of one device buffer
    std::vector<unsigned char> mine, twin;
};

struct Group {
    uint32_t id[3];
    std::vector<Fiber> fibers;
    std::vector<Simd> simds;
    uint32_t live = 0, exited = 0, at_barrier = 0;
    Site bsite;
    std::vector<TgVar> vars;
    std::vector<std::vector<unsigned char>> tg_args;
    std::vector<Priv> priv;
};

struct Dispatch {
    const msl_emu_dispatch_desc* d;
    std::vector<Group*> resident;
    uint64_t next_group = 0, n_groups = 0, groups_done = 0;
    std::deque<Fiber*> fifo;
    std::vector<Fiber*> pool;  // random mode: runnable set
    uint64_t rng;
    std::string err;
    uint64_t polls = 0;  // atomic loads / no-op writes since the last sign of progress
    Fiber* cur = nullptr;
#if defined(__x86_64__)
    void* sched_sp = nullptr;
#else
    ucontext_t sched_uc;
#endif
    uint32_t per_group = 0;
};

thread_local Dispatch* t_d = nullptr;

uint64_t next_rand(Dispatch& D) {  // splitmix64: stable across platforms
    uint64_t z = (D.rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void make_runnable(Dispatch& D, Fiber* f) {
    f->st = RUNNABLE;
    if (D.d->random) D.pool.push_back(f);
    else D.fifo.push_back(f);
}

Fiber* pick(Dispatch& D) {
    if (D.d->random) {
        if (D.pool.empty()) return nullptr;
        size_t i = (size_t)(next_rand(D) % D.pool.size());
        Fiber* f = D.pool[i];
        D.pool[i] = D.pool.back();
        D.pool.pop_back();
        return f;
    }
    if (D.fifo.empty()) return nullptr;
    Fiber* f = D.fifo.front();
    D.fifo.pop_front();
    return f;
}

void to_sched(Fiber* f) {
    Dispatch& D = *t_d;
#if defined(__x86_64__)
    msl_emu_switch(&f->sp, D.sched_sp);
#else
    swapcontext(&f->uc, &D.sched_uc);
#endif
}

std::string who(const Fiber* f) {
    const msl_emu_thread& t = f->info;
    char b[128];
    snprintf(b, sizeof b, "thread (%u,%u,%u) of group (%u,%u,%u)", t.tpitg[0], t.tpitg[1], t.tpitg[2],
             t.tgpig[0], t.tgpig[1], t.tgpig[2]);
    return b;
}

[[noreturn]] void fault(const std::string& msg) {
    Dispatch& D = *t_d;
    if (D.err.empty()) D.err = msg;
    Fiber* f = D.cur;
    f->st = DONE;  // never resumed: the dispatch is abandoned
    to_sched(f);
    __builtin_trap();
}

// A scheduling point: the fiber goes to the back of the queue (FIFO) or into the random pool.
void yield_point() {
    Dispatch& D = *t_d;
    Fiber* f = D.cur;
    make_runnable(D, f);
    to_sched(f);
}

void block(FState st) {
    Dispatch& D = *t_d;
    Fiber* f = D.cur;
    f->st = st;
    to_sched(f);
}

// ------------------------------------------------------------ incoherent device memory
// Release: bytes this group changed since its last sync go to the shared copy.
void publish(Dispatch& D, Group* g) {
    for (uint32_t b = 0; b < g->priv.size(); b++) {
        unsigned char* s = D.d->buffer_ptr[b];
        unsigned char* m = g->priv[b].mine.data();
        unsigned char* t = g->priv[b].twin.data();
        size_t n = g->priv[b].mine.size();
        for (size_t k = 0; k < n; k++)
            if (m[k] != t[k]) { s[k] = m[k]; t[k] = m[k]; }
    }
}
// Acquire: bytes this group has not changed are refreshed from the shared copy.
void refresh(Dispatch& D, Group* g) {
    for (uint32_t b = 0; b < g->priv.size(); b++) {
        unsigned char* s = D.d->buffer_ptr[b];
        unsigned char* m = g->priv[b].mine.data();
        unsigned char* t = g->priv[b].twin.data();
        size_t n = g->priv[b].mine.size();
        for (size_t k = 0; k < n; k++)
            if (m[k] == t[k]) { m[k] = s[k]; t[k] = s[k]; }
    }
}

// ------------------------------------------------------------ groups and fibers
extern "C" void msl_emu_fiber_main(Fiber* f);

bool start_group(Dispatch& D) {
    const msl_emu_dispatch_desc* d = D.d;
    uint64_t lin = D.next_group++;
    Group* g = new Group();
    g->id[0] = (uint32_t)(lin % d->groups[0]);
    g->id[1] = (uint32_t)((lin / d->groups[0]) % d->groups[1]);
    g->id[2] = (uint32_t)(lin / ((uint64_t)d->groups[0] * d->groups[1]));
    uint32_t n = D.per_group;
    uint32_t nsg = (n + 31) / 32;
    g->simds.resize(nsg);
    for (uint32_t s = 0; s < nsg; s++) {
        uint32_t lanes = n - s * 32 < 32 ? n - s * 32 : 32;
        g->simds[s].active = lanes == 32 ? 0xFFFFFFFFu : ((1u << lanes) - 1);
    }
    for (uint32_t i = 0; i < d->n_tg; i++) g->tg_args.emplace_back(d->tg_len[i], (unsigned char)0xFF);
    if (d->incoherent) {
        g->priv.resize(d->n_buffers);
        for (uint32_t b = 0; b < d->n_buffers; b++) {
            g->priv[b].mine.assign(d->buffer_ptr[b], d->buffer_ptr[b] + d->buffer_len[b]);
            g->priv[b].twin = g->priv[b].mine;
        }
    }
    g->fibers.resize(n);
    g->live = n;
    for (uint32_t i = 0; i < n; i++) {
        Fiber* f = &g->fibers[i];
        f->g = g;
        msl_emu_thread& t = f->info;
        uint32_t x = i % d->threads[0], y = (i / d->threads[0]) % d->threads[1], z = i / (d->threads[0] * d->threads[1]);
        uint32_t pos[3] = {x, y, z};
        for (int k = 0; k < 3; k++) {
            t.tpitg[k] = pos[k];
            t.tgpig[k] = g->id[k];
            t.tptg[k] = d->threads[k];
            t.tgpg[k] = d->groups[k];
            t.tpg[k] = d->threads[k] * d->groups[k];
            t.tpig[k] = g->id[k] * d->threads[k] + pos[k];
        }
        t.tiitg = i;
        t.tiisg = i % 32;
        t.sgitg = i / 32;
        t.sgptg = nsg;
        if (!t_pool.get(&f->stack)) {
            D.err = "out of memory for fiber stacks";
            return false;
        }
        char* top = (char*)f->stack.base + f->stack.len;
#if defined(__x86_64__)
        // Frame consumed by msl_emu_switch: control words, r15..r12, rbx (= the fiber), rbp, then
        // the return address into msl_emu_fiber_entry, placed so the entry runs 16-byte aligned.
        uint64_t* sp = (uint64_t*)(top - 16);
        *--sp = (uint64_t)(uintptr_t)&msl_emu_fiber_entry;  // at top-24: after ret, rsp = top-16
        *--sp = 0;                        // rbp
        *--sp = (uint64_t)(uintptr_t)f;   // rbx
        *--sp = 0; *--sp = 0; *--sp = 0; *--sp = 0;  // r12..r15
        *--sp = 0x1F80ull | (0x037Full << 32);       // mxcsr, x87 control word
        f->sp = sp;
#else
        getcontext(&f->uc);
        f->uc.uc_stack.ss_sp = (char*)f->stack.base + sysconf(_SC_PAGESIZE);
        f->uc.uc_stack.ss_size = kStack;
        f->uc.uc_link = nullptr;
        makecontext(&f->uc, (void (*)())msl_emu_fiber_main, 1, f);
#endif
    }
    D.resident.push_back(g);
    for (uint32_t i = 0; i < n; i++) make_runnable(D, &g->fibers[i]);
    return true;
}

void finish_group(Dispatch& D, Group* g) {
    if (D.d->incoherent) publish(D, g);
    for (auto& v : g->vars) free(v.mem);
    for (size_t i = 0; i < D.resident.size(); i++)
        if (D.resident[i] == g) { D.resident.erase(D.resident.begin() + i); break; }
    delete g;
    D.groups_done++;
}

void simd_complete(Dispatch& D, Group* g, uint32_t sg) {
    Simd& s = g->simds[sg];
    s.done_active[s.gen & 1] = s.arrived;
    s.arrived = 0;
    s.gen++;
    for (uint32_t l = 0; l < 32; l++) {
        uint32_t i = sg * 32 + l;
        if (i < g->fibers.size() && g->fibers[i].st == WAIT_SIMD && &g->fibers[i] != D.cur) make_runnable(D, &g->fibers[i]);
    }
    D.polls = 0;
}

void thread_exit(Fiber* f) {
    Dispatch& D = *t_d;
    Group* g = f->g;
    g->live--;
    g->exited++;
    if (g->at_barrier > 0)
        fault(who(f) + " returned while " + std::to_string(g->at_barrier) +
              " threads of its threadgroup wait at threadgroup_barrier " + g->bsite.str() +
              " (every thread must reach each barrier)");
    uint32_t sg = f->info.sgitg;
    Simd& s = g->simds[sg];
    s.active &= ~(1u << f->info.tiisg);
    if (s.arrived && s.arrived == s.active) simd_complete(D, g, sg);
    D.polls = 0;
    f->st = DONE;
}

}  // namespace

extern "C" void msl_emu_fiber_main(Fiber* f) {
    t_d->d->kernel();
    thread_exit(f);
    to_sched(f);
    __builtin_trap();
}

// ------------------------------------------------------------ ABI used by the shim
extern "C" const msl_emu_thread* msl_emu_self(void) { return &t_d->cur->info; }

extern "C" void* msl_emu_buffer(uint32_t index, const char* file, unsigned line) {
    Dispatch& D = *t_d;
    for (uint32_t b = 0; b < D.d->n_buffers; b++)
        if (D.d->buffer_index[b] == index)
            return D.d->incoherent ? (void*)D.cur->g->priv[b].mine.data() : (void*)D.d->buffer_ptr[b];
    Site s{file, line, 0};
    fault("[[buffer(" + std::to_string(index) + ")]] at " + s.str() + " is not bound by the dispatch");
}

extern "C" void* msl_emu_tg_arg(uint32_t index, const char* file, unsigned line) {
    Dispatch& D = *t_d;
    for (uint32_t b = 0; b < D.d->n_tg; b++)
        if (D.d->tg_index[b] == index) return D.cur->g->tg_args[b].data();
    Site s{file, line, 0};
    fault("[[threadgroup(" + std::to_string(index) + ")]] at " + s.str() + " has no length set by the dispatch");
}

extern "C" void* msl_emu_tg_var(void* tag, size_t size, size_t align) {
    Group* g = t_d->cur->g;
    for (auto& v : g->vars)
        if (v.tag == tag) return v.mem;
    if (align < 16) align = 16;
    size_t n = (size + align - 1) / align * align;
    unsigned char* m = (unsigned char*)aligned_alloc(align, n ? n : align);
    memset(m, 0xFF, n);  // poison: a read before any write shows up as NaN / all ones
    g->vars.push_back(TgVar{tag, m});
    return m;
}

extern "C" void msl_emu_tg_barrier(const char* file, unsigned line, unsigned col) {
    Dispatch& D = *t_d;
    Fiber* f = D.cur;
    Group* g = f->g;
    Site here{file, line, col};
    if (g->exited > 0)
        fault(who(f) + " reached threadgroup_barrier " + here.str() +
              " after other threads of its threadgroup returned (every thread must reach each barrier)");
    if (g->at_barrier > 0 && !g->bsite.same(here))
        fault("threadgroup_barrier in divergent control flow: " + who(f) + " is at " + here.str() +
              " while others wait at " + g->bsite.str());
    if (g->at_barrier == 0) g->bsite = here;
    g->at_barrier++;
    f->wait = here;
    if (g->at_barrier == g->live) {
        g->at_barrier = 0;
        D.polls = 0;
        for (auto& o : g->fibers)
            if (o.st == WAIT_TG) make_runnable(D, &o);
        yield_point();
    } else {
        block(WAIT_TG);
    }
}

extern "C" const unsigned char* msl_emu_simd(const void* value, size_t size, const char* file,
                                             unsigned line, unsigned col, uint32_t* active) {
    Dispatch& D = *t_d;
    Fiber* f = D.cur;
    Group* g = f->g;
    uint32_t sg = f->info.sgitg, lane = f->info.tiisg;
    Simd& s = g->simds[sg];
    Site here{file, line, col};
    if (s.arrived && !s.site.same(here)) {
        uint32_t other = (uint32_t)__builtin_ctz(s.arrived);
        fault("simdgroup operation in divergent control flow: lane " + std::to_string(lane) + " of simdgroup " +
              std::to_string(sg) + " in group (" + std::to_string(g->id[0]) + "," + std::to_string(g->id[1]) + "," +
              std::to_string(g->id[2]) + ") is at " + here.str() + ", lane " + std::to_string(other) + " at " +
              s.site.str());
    }
    if (!s.arrived) s.site = here;
    unsigned buf = s.gen & 1;
    if (size) memcpy(s.slots[buf][lane], value, size);
    s.arrived |= 1u << lane;
    f->wait = here;
    if (s.arrived == s.active) {
        simd_complete(D, g, sg);
        yield_point();
    } else {
        block(WAIT_SIMD);
    }
    *active = s.done_active[buf];
    // A lane can only reuse this slot set after every lane arrived at its next operation, by which
    // time each of them has read this one: two sets suffice.
    return &s.slots[buf][0][0];
}

extern "C" void msl_emu_atomic_point(int kind, const char* file, unsigned line, unsigned col) {
    Dispatch& D = *t_d;
    D.cur->wait = Site{file, line, col};
    if (kind == MSL_EMU_LOAD || kind == MSL_EMU_RMW) {
        if (++D.polls > D.d->livelock_polls) {
            std::string m = "livelock: " + std::to_string(D.polls) +
                            " atomic operations without any atomic write changing memory; " + who(D.cur) +
                            " polls at " + D.cur->wait.str();
            if (D.next_group < D.n_groups)
                m += "; " + std::to_string(D.n_groups - D.next_group) +
                     " threadgroups are not resident (max_resident_groups " + std::to_string(D.d->max_resident) +
                     ", grid " + std::to_string(D.n_groups) +
                     "): a grid barrier needs every group co-resident";
            fault(m);
        }
    }
    yield_point();
}

extern "C" void msl_emu_progress(void) { t_d->polls = 0; }

extern "C" void* msl_emu_atomic_addr(void* p) {
    Dispatch& D = *t_d;
    if (!D.d->incoherent) return p;
    Group* g = D.cur->g;
    unsigned char* q = (unsigned char*)p;
    for (uint32_t b = 0; b < g->priv.size(); b++) {
        unsigned char* m = g->priv[b].mine.data();
        if (q >= m && q < m + g->priv[b].mine.size()) return D.d->buffer_ptr[b] + (q - m);
    }
    return p;
}

extern "C" void msl_emu_fence(unsigned flags, int order, int scope, const char* file, unsigned line, unsigned col) {
    Dispatch& D = *t_d;
    D.cur->wait = Site{file, line, col};
    // Only a device-scope fence on device memory orders anything between threadgroups; the
    // emulator treats a threadgroup's view of device memory as one (intra-group is coherent).
    if (D.d->incoherent && (flags & 1u) && scope == 3) {
        bool rel = order == 2 || order == 3 || order == 4;
        bool acq = order == 1 || order == 3 || order == 4;
        if (rel) publish(D, D.cur->g);
        if (acq) refresh(D, D.cur->g);
    }
    yield_point();
}

// ------------------------------------------------------------ the dispatch
// The one entry point the host calls (the library is built with hidden visibility).
extern "C" __attribute__((visibility("default"))) int msl_emu_dispatch(const msl_emu_dispatch_desc* desc, char* err,
                                                                    size_t err_len) {
    Dispatch D;
    D.d = desc;
    D.rng = desc->seed ^ 0x6D736C2D656D75ull;
    D.per_group = desc->threads[0] * desc->threads[1] * desc->threads[2];
    D.n_groups = (uint64_t)desc->groups[0] * desc->groups[1] * desc->groups[2];
    Dispatch* saved = t_d;
    t_d = &D;
    uint64_t limit = desc->max_resident ? desc->max_resident : D.n_groups;
    while (D.next_group < D.n_groups && D.resident.size() < limit && D.err.empty()) start_group(D);
    std::vector<Stack> used;
    while (D.err.empty() && D.groups_done < D.n_groups) {
        Fiber* f = pick(D);
        if (!f) {
            std::string m = "deadlock: no thread can run.";
            int lines = 0;
            for (Group* g : D.resident) {
                for (uint32_t sg = 0; sg < g->simds.size(); sg++) {
                    uint32_t nt = 0, ns = 0;
                    Site ts, ss;
                    for (uint32_t l = 0; l < 32 && sg * 32 + l < g->fibers.size(); l++) {
                        Fiber& o = g->fibers[sg * 32 + l];
                        if (o.st == WAIT_TG) { nt++; ts = o.wait; }
                        if (o.st == WAIT_SIMD) { ns++; ss = o.wait; }
                    }
                    if ((nt || ns) && lines++ < 12) {
                        m += " group (" + std::to_string(g->id[0]) + "," + std::to_string(g->id[1]) + "," +
                             std::to_string(g->id[2]) + ") simdgroup " + std::to_string(sg) + ":";
                        if (nt) m += " " + std::to_string(nt) + " threads wait at threadgroup_barrier " + ts.str() + ";";
                        if (ns) m += " " + std::to_string(ns) + " lanes wait at a simd operation " + ss.str() + ";";
                    }
                }
            }
            D.err = m;
            break;
        }
        D.cur = f;
#if defined(__x86_64__)
        msl_emu_switch(&D.sched_sp, f->sp);
#else
        swapcontext(&D.sched_uc, &f->uc);
#endif
        D.cur = nullptr;
        if (!D.err.empty()) break;
        if (f->st == DONE) {
            Group* g = f->g;
            t_pool.put(f->stack);
            f->stack.base = nullptr;
            if (g->live == 0) {
                finish_group(D, g);
                while (D.next_group < D.n_groups && D.resident.size() < limit && D.err.empty()) start_group(D);
            }
        }
    }
    // Abandoned fibers (after a fault) give their stacks back too.
    for (Group* g : D.resident) {
        for (auto& f : g->fibers)
            if (f.stack.base) t_pool.put(f.stack);
        for (auto& v : g->vars) free(v.mem);
        delete g;
    }
    t_d = saved;
    if (!D.err.empty()) {
        snprintf(err, err_len, "%s", D.err.c_str());
        return 1;
    }
    return 0;
}

// ------------------------------------------------------------ half conversions
// clang lowers __fp16 conversions to these libcalls on x86-64; libgcc has other names, so the
// emulator brings its own (round to nearest, ties to even).
static uint16_t f2h_bits(uint32_t x) {
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ex = (x >> 23) & 0xFF, man = x & 0x7FFFFF;
    if (ex == 0xFF) return (uint16_t)(sign | 0x7C00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)ex - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;  // may carry into the exponent: correct
    return (uint16_t)(sign | h);
}
static float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, ex = (h >> 10) & 0x1F, man = h & 0x3FF, r;
    if (ex == 0x1F) r = sign | 0x7F800000u | (man << 13);
    else if (ex == 0) {
        if (!man) r = sign;
        else {
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            r = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
        }
    } else r = sign | ((ex + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &r, 4);
    return f;
}
extern "C" float __gnu_h2f_ieee(uint16_t h) { return h2f(h); }
extern "C" float __extendhfsf2(uint16_t h) { return h2f(h); }
extern "C" uint16_t __gnu_f2h_ieee(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return f2h_bits(x);
}
extern "C" uint16_t __truncsfhf2(float f) { return __gnu_f2h_ieee(f); }
// double -> half in one rounding: round to float with sticky bit (round-to-odd), which cannot
// create a tie that was not there, then float -> half.
extern "C" uint16_t __truncdfhf2(double d) {
    float f = (float)d;
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((double)f != d && !__builtin_isnan(d) && !__builtin_isinf(f)) {
        uint32_t y = x;
        if ((double)f > d ? (d > 0) : (d < 0)) y = x - 1;  // truncate toward zero
        x = y | 1;                                          // sticky
    }
    return f2h_bits(x);
}
