// Helpers shared by the driver-API test programs: checked calls, embedded
// device images, and a fast pattern and checksum for content checks.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// The driver's name for a status, or its number when it has none.
static inline const char *err_name(CUresult rc) {
    const char *name = nullptr;
    if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == nullptr) {
        static thread_local char buf[32];
        snprintf(buf, sizeof buf, "CUresult(%d)", (int)rc);
        return buf;
    }
    return name;
}

// Stops the program at the first failed driver call, naming it.
#define CHECK(call)                                                             \
    do {                                                                        \
        CUresult rc_ = (call);                                                  \
        if (rc_ != CUDA_SUCCESS) {                                              \
            fflush(stdout);                                                     \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__,       \
                    #call, err_name(rc_));                                      \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

#include "expect.h"

// Embeds a file built by scripts/build-cuda-tests.sh (found through the
// assembler's include path) as `sym`, 64-byte aligned, with a NUL after the
// last byte so PTX text is a C string. `sym##_end` marks the end (before the
// NUL).
#define EMBED(sym, file)                                                        \
    __asm__(".section .rodata." #sym ",\"a\"\n"                                 \
            ".balign 64\n" #sym ":\n"                                           \
            ".incbin \"" file "\"\n" #sym "_end:\n"                             \
            ".byte 0\n"                                                         \
            ".previous\n");                                                     \
    extern "C" const unsigned char sym[], sym##_end[]

// Current context on device 0 through the primary context, as the runtime
// would set it up.
static inline CUdevice init_primary(CUcontext *ctx) {
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(ctx, dev));
    CHECK(cuCtxSetCurrent(*ctx));
    return dev;
}

// A 1D copy of `bytes` between host memory and device memory, in the form
// memcpy nodes take.
static inline CUDA_MEMCPY3D copy_1d(CUmemorytype src_type, const void *src, CUmemorytype dst_type, void *dst,
                                    size_t bytes) {
    CUDA_MEMCPY3D c = {};
    c.srcMemoryType = src_type;
    c.dstMemoryType = dst_type;
    if (src_type == CU_MEMORYTYPE_HOST)
        c.srcHost = src;
    else
        c.srcDevice = (CUdeviceptr)src;
    if (dst_type == CU_MEMORYTYPE_HOST)
        c.dstHost = dst;
    else
        c.dstDevice = (CUdeviceptr)dst;
    c.WidthInBytes = bytes, c.Height = 1, c.Depth = 1;
    return c;
}

// splitmix64's finaliser: a good 64-bit mix of a counter.
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Deterministic bytes for content checks: word i is mix64(seed-derived base
// + i), so the words are independent and fast to make.
static inline void fill_pattern(void *buf, size_t n, uint64_t seed) {
    uint64_t base = mix64(seed);
    unsigned char *p = (unsigned char *)buf;
    size_t words = n / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t v = mix64(base + i);
        memcpy(p + 8 * i, &v, 8);
    }
    uint64_t tail = mix64(base + words);
    memcpy(p + 8 * words, &tail, n % 8);
}

// FNV-1a style over 8-byte words in four independent lanes, then the tail
// bytes and the length.
static inline uint64_t checksum(const void *buf, size_t n) {
    const uint64_t prime = 0x100000001b3ull;
    const unsigned char *p = (const unsigned char *)buf;
    uint64_t lane[4] = {0xcbf29ce484222325ull, 1, 2, 3};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; k++) {
            uint64_t v;
            memcpy(&v, p + i + 8 * k, 8);
            lane[k] = (lane[k] ^ v) * prime;
        }
    }
    uint64_t h = lane[0];
    for (int k = 1; k < 4; k++) h = (h ^ lane[k]) * prime;
    for (; i < n; i++) h = (h ^ p[i]) * prime;
    return (h ^ n) * prime;
}
