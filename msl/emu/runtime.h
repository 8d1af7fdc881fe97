// runtime.h — the C ABI between the MSL shim (metal_stdlib), the fiber runtime (runtime.cpp) and the
// Rust host (src/backend/metal/emu). Kernel code never calls these directly: the shim wraps them.
#ifndef MSL_EMU_RUNTIME_H
#define MSL_EMU_RUNTIME_H
#include <stddef.h>
#include <stdint.h>

// Builtin values of the running GPU thread (one per fiber), read by `[[thread_position_in_grid]]`
// and friends through the shim.
struct msl_emu_thread {
    uint32_t tpig[3], tpitg[3], tgpig[3], tptg[3], tgpg[3], tpg[3];
    uint32_t tiitg, tiisg, sgitg, sgptg;
};

// One `kernel void name(...)` of the library: the pre-pass emits a table of these.
struct msl_emu_kernel {
    const char* name;
    void (*run)();
    const char* file;
    unsigned line;
};

// Everything one dispatch needs; filled by the host.
struct msl_emu_dispatch_desc {
    void (*kernel)();
    const char* kernel_name;
    uint32_t groups[3], threads[3];
    uint32_t n_buffers;
    const uint32_t* buffer_index;
    unsigned char* const* buffer_ptr;
    const size_t* buffer_len;
    uint32_t n_tg;
    const uint32_t* tg_index;
    const size_t* tg_len;
    int random;             // 0: FIFO, 1: seeded random interleaving
    uint64_t seed;
    int incoherent;         // per-threadgroup private copies of device buffers
    uint32_t max_resident;  // 0: every group resident
    uint64_t livelock_polls;
};

enum { MSL_EMU_LOAD = 0, MSL_EMU_STORE = 1, MSL_EMU_RMW = 2 };

extern "C" {
const msl_emu_thread* msl_emu_self(void);
void* msl_emu_buffer(uint32_t index, const char* file, unsigned line);
void* msl_emu_tg_arg(uint32_t index, const char* file, unsigned line);
void* msl_emu_tg_var(void* tag, size_t size, size_t align);
void msl_emu_tg_barrier(const char* file, unsigned line, unsigned col);
// Deposits `size` bytes (<= 32) for this lane, waits for every live lane of the simdgroup and
// returns the 32 lane slots (32 bytes apart); `*active` gets the mask of lanes that took part.
const unsigned char* msl_emu_simd(const void* value, size_t size, const char* file, unsigned line,
                                  unsigned col, uint32_t* active);
void msl_emu_atomic_point(int kind, const char* file, unsigned line, unsigned col);
void msl_emu_progress(void);
void* msl_emu_atomic_addr(void* p);
void msl_emu_fence(unsigned flags, int order, int scope, const char* file, unsigned line, unsigned col);
int msl_emu_dispatch(const msl_emu_dispatch_desc* desc, char* err, size_t err_len);
}
#endif
