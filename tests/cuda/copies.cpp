// copies: every copy direction and API form, from pageable and pinned host
// memory, at sizes from 1 byte to 256 MiB, each checked byte for byte. Every
// step moves a fresh pattern, so a copy that did nothing cannot pass.
#include "common.h"

static const size_t SIZES[] = {1, 3, 4096, (1u << 20) + 7, 64u << 20, 256u << 20};
static const size_t OFF = 5; // allocations are this much larger, for offset copies

struct Bufs {
    size_t n;
    unsigned char *src, *dst; // pageable, n + OFF bytes
    CUdeviceptr d1, d2;       // n + OFF bytes
    CUstream s;
    unsigned step;
};

static uint64_t next_seed(Bufs &b) { return (uint64_t)b.n * 1000 + b.step++; }

// Compares `got` with `want` and prints the step's checksum.
static void report(const Bufs &b, const char *what, const void *got, const void *want, size_t len) {
    EXPECT(memcmp(got, want, len) == 0, "size %zu %s: content differs", b.n, what);
    printf("size=%zu %s ok checksum=%016llx\n", b.n, what, (unsigned long long)checksum(got, len));
}

// A fresh pattern in b.src, copied to `d` with the plain synchronous copy.
static void put(Bufs &b, CUdeviceptr d, size_t len) {
    fill_pattern(b.src, len, next_seed(b));
    CHECK(cuMemcpyHtoD(d, b.src, len));
}

// Reads `d` back with the plain synchronous copy and checks it against b.src.
static void get_check(Bufs &b, CUdeviceptr d, const char *what) {
    CHECK(cuMemcpyDtoH(b.dst, d, b.n));
    report(b, what, b.dst, b.src, b.n);
}

// The copy forms between pageable host memory and device memory, on `stream`
// (or synchronously when `async` is false).
static void pageable(Bufs &b, bool async, CUstream stream, const char *tag) {
    char what[64];
    size_t n = b.n;
    fill_pattern(b.src, n, next_seed(b));
    if (async) {
        CHECK(cuMemcpyHtoDAsync(b.d1, b.src, n, stream));
        CHECK(cuStreamSynchronize(stream));
    } else {
        CHECK(cuMemcpyHtoD(b.d1, b.src, n));
    }
    snprintf(what, sizeof what, "htod%s", tag);
    get_check(b, b.d1, what);

    put(b, b.d1, n);
    if (async) {
        CHECK(cuMemcpyDtoHAsync(b.dst, b.d1, n, stream));
        CHECK(cuStreamSynchronize(stream));
    } else {
        CHECK(cuMemcpyDtoH(b.dst, b.d1, n));
    }
    snprintf(what, sizeof what, "dtoh%s", tag);
    report(b, what, b.dst, b.src, n);

    put(b, b.d1, n);
    if (async) {
        CHECK(cuMemcpyDtoDAsync(b.d2, b.d1, n, stream));
        CHECK(cuStreamSynchronize(stream));
    } else {
        CHECK(cuMemcpyDtoD(b.d2, b.d1, n));
    }
    snprintf(what, sizeof what, "dtod%s", tag);
    get_check(b, b.d2, what);
}

// cuMemcpy / cuMemcpyAsync, which infer the direction from the addresses.
static void unified(Bufs &b, bool async, const char *tag) {
    char what[64];
    size_t n = b.n;
    auto copy = [&](CUdeviceptr dst, CUdeviceptr src) {
        if (async) {
            CHECK(cuMemcpyAsync(dst, src, n, b.s));
            CHECK(cuStreamSynchronize(b.s));
        } else {
            CHECK(cuMemcpy(dst, src, n));
        }
    };
    fill_pattern(b.src, n, next_seed(b));
    copy(b.d1, (CUdeviceptr)b.src);
    snprintf(what, sizeof what, "%s htod", tag);
    get_check(b, b.d1, what);

    put(b, b.d1, n);
    copy((CUdeviceptr)b.dst, b.d1);
    snprintf(what, sizeof what, "%s dtoh", tag);
    report(b, what, b.dst, b.src, n);

    put(b, b.d1, n);
    copy(b.d2, b.d1);
    snprintf(what, sizeof what, "%s dtod", tag);
    get_check(b, b.d2, what);

    fill_pattern(b.src, n, next_seed(b));
    copy((CUdeviceptr)b.dst, (CUdeviceptr)b.src);
    snprintf(what, sizeof what, "%s htoh", tag);
    report(b, what, b.dst, b.src, n);
}

// Copies that start inside allocations; the bytes before them must survive.
static void offsets(Bufs &b) {
    size_t n = b.n, whole = n + OFF;
    unsigned char *want = (unsigned char *)malloc(whole);
    EXPECT(want != nullptr, "host memory");
    put(b, b.d1, whole);
    memcpy(want, b.src, OFF);
    fill_pattern(b.src, n, next_seed(b));
    memcpy(want + OFF, b.src, n);
    CHECK(cuMemcpyHtoD(b.d1 + OFF, b.src, n));
    CHECK(cuMemcpyDtoH(b.dst, b.d1, whole));
    report(b, "htod at offset", b.dst, want, whole);

    memmove(want + 3, want + OFF, n); // what d1 holds from OFF lands at 3
    put(b, b.d2, whole);
    memcpy(want, b.src, 3);
    CHECK(cuMemcpyDtoD(b.d2 + 3, b.d1 + OFF, n));
    CHECK(cuMemcpyDtoH(b.dst, b.d2, n + 3));
    report(b, "dtod between offsets", b.dst, want, n + 3);
    free(want);
}

enum HostKind { ALLOC_HOST, HOST_ALLOC, HOST_ALLOC_PORTABLE, HOST_REGISTER };
static const char *const KIND_NAMES[] = {"cuMemAllocHost", "cuMemHostAlloc(0)",
                                         "cuMemHostAlloc(PORTABLE)", "cuMemHostRegister"};

static void *host_alloc(HostKind kind, size_t n) {
    void *p = nullptr;
    switch (kind) {
    case ALLOC_HOST: CHECK(cuMemAllocHost(&p, n)); break;
    case HOST_ALLOC: CHECK(cuMemHostAlloc(&p, n, 0)); break;
    case HOST_ALLOC_PORTABLE: CHECK(cuMemHostAlloc(&p, n, CU_MEMHOSTALLOC_PORTABLE)); break;
    case HOST_REGISTER:
        p = malloc(n);
        EXPECT(p != nullptr, "host memory");
        CHECK(cuMemHostRegister(p, n, 0));
        break;
    }
    return p;
}

static void host_free(HostKind kind, void *p) {
    if (kind == HOST_REGISTER) {
        CHECK(cuMemHostUnregister(p));
        free(p);
    } else {
        CHECK(cuMemFreeHost(p));
    }
}

// Copies to and from pinned host memory of each kind.
static void pinned(Bufs &b, HostKind kind) {
    char what[96];
    size_t n = b.n;
    unsigned char *src = (unsigned char *)host_alloc(kind, n);
    unsigned char *dst = (unsigned char *)host_alloc(kind, n);
    for (int async = 0; async < 2; async++) {
        const char *tag = async ? " async" : "";
        fill_pattern(src, n, next_seed(b));
        memcpy(b.src, src, n);
        if (async) {
            CHECK(cuMemcpyHtoDAsync(b.d1, src, n, b.s));
            CHECK(cuStreamSynchronize(b.s));
        } else {
            CHECK(cuMemcpyHtoD(b.d1, src, n));
        }
        snprintf(what, sizeof what, "htod from %s%s", KIND_NAMES[kind], tag);
        get_check(b, b.d1, what);

        put(b, b.d1, n);
        if (async) {
            CHECK(cuMemcpyDtoHAsync(dst, b.d1, n, b.s));
            CHECK(cuStreamSynchronize(b.s));
        } else {
            CHECK(cuMemcpyDtoH(dst, b.d1, n));
        }
        snprintf(what, sizeof what, "dtoh to %s%s", KIND_NAMES[kind], tag);
        report(b, what, dst, b.src, n);

        // Allocated pinned memory is a device address too (unified
        // addressing): device-to-device copies from and to it.
        if (kind == HOST_REGISTER) continue;
        fill_pattern(src, n, next_seed(b));
        memcpy(b.src, src, n);
        if (async) {
            CHECK(cuMemcpyDtoDAsync(b.d2, (CUdeviceptr)src, n, b.s));
            CHECK(cuStreamSynchronize(b.s));
        } else {
            CHECK(cuMemcpyDtoD(b.d2, (CUdeviceptr)src, n));
        }
        snprintf(what, sizeof what, "dtod from %s%s", KIND_NAMES[kind], tag);
        get_check(b, b.d2, what);
        if (async) {
            CHECK(cuMemcpyDtoDAsync((CUdeviceptr)dst, b.d2, n, b.s));
            CHECK(cuStreamSynchronize(b.s));
        } else {
            CHECK(cuMemcpyDtoD((CUdeviceptr)dst, b.d2, n));
            CHECK(cuCtxSynchronize());
        }
        snprintf(what, sizeof what, "dtod to %s%s", KIND_NAMES[kind], tag);
        report(b, what, dst, b.src, n);

        // Host copies to and from it through its device address.
        fill_pattern(b.src, n, next_seed(b));
        if (async) {
            CHECK(cuMemcpyHtoDAsync((CUdeviceptr)src, b.src, n, b.s));
            CHECK(cuMemcpyDtoHAsync(b.dst, (CUdeviceptr)src, n, b.s));
            CHECK(cuStreamSynchronize(b.s));
        } else {
            CHECK(cuMemcpyHtoD((CUdeviceptr)src, b.src, n));
            CHECK(cuMemcpyDtoH(b.dst, (CUdeviceptr)src, n));
        }
        snprintf(what, sizeof what, "htod and dtoh through %s%s", KIND_NAMES[kind], tag);
        report(b, what, b.dst, b.src, n);
    }
    host_free(kind, src);
    host_free(kind, dst);
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    Bufs b;
    // A blocking stream: it waits for the legacy stream, where a synchronous
    // pageable copy may still be moving data when the call returns.
    CHECK(cuStreamCreate(&b.s, CU_STREAM_DEFAULT));
    for (size_t n : SIZES) {
        b.n = n;
        b.step = 0;
        b.src = (unsigned char *)malloc(n + OFF);
        b.dst = (unsigned char *)malloc(n + OFF);
        EXPECT(b.src != nullptr && b.dst != nullptr, "host memory for %zu bytes", n);
        CHECK(cuMemAlloc(&b.d1, n + OFF));
        CHECK(cuMemAlloc(&b.d2, n + OFF));

        pageable(b, false, nullptr, "");
        pageable(b, true, b.s, " async stream");
        pageable(b, true, nullptr, " async null-stream");
        unified(b, false, "cuMemcpy");
        unified(b, true, "cuMemcpyAsync");
        offsets(b);
        for (int kind = ALLOC_HOST; kind <= HOST_REGISTER; kind++) pinned(b, (HostKind)kind);

        CHECK(cuMemFree(b.d1));
        CHECK(cuMemFree(b.d2));
        free(b.src);
        free(b.dst);
        fflush(stdout); // progress, which the server checks wait for
    }
    CHECK(cuStreamDestroy(b.s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
