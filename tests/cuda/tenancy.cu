// Kernels of the tenancy program: what one guest's kernels may do to
// another's memory, faults, device output, a checked compute loop and a
// long-running kernel.
#include <cassert>
#include <cstdio>

// Reads *target into *seen, then writes value over it.
extern "C" __global__ void peek_poke(unsigned long long *target, unsigned long long *seen,
                                     unsigned long long value) {
    *seen = *target;
    *target = value;
}

// Writes through a pointer that is nobody's memory.
extern "C" __global__ void wild_write(unsigned *p) { p[threadIdx.x] = 1; }

// Device printf, one line per thread.
extern "C" __global__ void say(int round) { printf("device round %d thread %u\n", round, threadIdx.x); }

// Device assert: fails for v != 0.
extern "C" __global__ void check(int v) { assert(v == 0); }

// out[i] = a * i + b for i < n.
extern "C" __global__ void affine(unsigned *out, unsigned a, unsigned b, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * i + b;
}

// One thread waits ms milliseconds; the others return at once.
extern "C" __global__ void sleep_ms(unsigned ms) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(100000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < (unsigned long long)ms * 1000000ull);
}
