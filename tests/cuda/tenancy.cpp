// tenancy: what one guest can do to another, and what a tenant may hold.
// Each mode is one guest; the GPU suite and the end-to-end tests run several
// at once, natively and through gpuplex, and compare.
//
//   tenancy hold          holds a buffer of a known pattern, prints its
//                         address, waits for a line on stdin, then says
//                         whether the pattern is intact
//   tenancy poke ADDR     a kernel reads and overwrites ADDR (another
//                         guest's buffer); prints what the synchronize said
//   tenancy fault         a kernel writes through a wild pointer
//   tenancy assert        a kernel's assert fails
//   tenancy printf N      N rounds of host and device output, interleaved
//   tenancy compute N     N rounds of a kernel whose every result is checked
//   tenancy sleep MS      one kernel that runs MS milliseconds
//   tenancy memory        every path that takes device memory, against the
//                         total the device reports (a tenant's limit)
//   tenancy connect       how long cuInit (through gpuplex: connecting and
//                         the first answered call) and the first context take
#include "common.h"

#include <chrono>
#include <string>
#include <vector>

EMBED(tenancy_fatbin, "tenancy.fatbin");
EMBED(tenancy_big_fatbin, "tenancy_big.fatbin");

static CUfunction function(CUmodule mod, const char *name) {
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, name));
    return fn;
}

static const uint64_t PATTERN_SEED = 0x7e4a47;
static const size_t HELD_WORDS = 1 << 16;

static int hold() {
    // A pad first, so that the held buffer is not where another process's
    // first allocation would land.
    CUdeviceptr pad, held;
    CHECK(cuMemAlloc(&pad, 1 << 20));
    CHECK(cuMemAlloc(&held, HELD_WORDS * 8));
    std::vector<uint64_t> words(HELD_WORDS), back(HELD_WORDS);
    fill_pattern(words.data(), HELD_WORDS * 8, PATTERN_SEED);
    CHECK(cuMemcpyHtoD(held, words.data(), HELD_WORDS * 8));
    printf("pointer 0x%llx\n", (unsigned long long)held);
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof line, stdin) == nullptr) {
        fprintf(stderr, "hold: stdin closed before the go-ahead\n");
    }
    CHECK(cuMemcpyDtoH(back.data(), held, HELD_WORDS * 8));
    for (size_t i = 0; i < HELD_WORDS; i++) {
        if (back[i] != words[i]) {
            printf("changed: word %zu is 0x%llx, was 0x%llx\n", i, (unsigned long long)back[i],
                   (unsigned long long)words[i]);
            return 1;
        }
    }
    printf("intact\n");
    return 0;
}

static int poke(CUmodule mod, const char *address) {
    CUdeviceptr target = (CUdeviceptr)strtoull(address, nullptr, 0), seen;
    CHECK(cuMemAlloc(&seen, 8));
    CHECK(cuMemsetD8(seen, 0, 8));
    unsigned long long value = 0xbadc0ffee0ddf00dull;
    void *params[] = {&target, &seen, &value};
    CHECK(cuLaunchKernel(function(mod, "peek_poke"), 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
    CUresult rc = cuCtxSynchronize();
    printf("poke: %s\n", err_name(rc));
    if (rc == CUDA_SUCCESS) {
        uint64_t read = 0;
        CHECK(cuMemcpyDtoH(&read, seen, 8));
        printf("poke read 0x%llx\n", (unsigned long long)read);
    }
    return 0;
}

// After a fault the context is unusable: what the next calls say.
static void after_fault() {
    CUdeviceptr p;
    printf("then cuMemAlloc: %s\n", err_name(cuMemAlloc(&p, 4)));
    printf("then cuCtxSynchronize: %s\n", err_name(cuCtxSynchronize()));
}

static int fault(CUmodule mod) {
    CUdeviceptr wild = 0x7f0000000000ull;
    void *params[] = {&wild};
    CHECK(cuLaunchKernel(function(mod, "wild_write"), 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
    printf("fault: %s\n", err_name(cuCtxSynchronize()));
    after_fault();
    return 0;
}

static int failed_assert(CUmodule mod) {
    int v = 1;
    void *params[] = {&v};
    CHECK(cuLaunchKernel(function(mod, "check"), 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
    printf("assert: %s\n", err_name(cuCtxSynchronize()));
    after_fault();
    return 0;
}

static int device_printf(CUmodule mod, int rounds) {
    CUfunction say = function(mod, "say");
    for (int round = 0; round < rounds; round++) {
        printf("host before round %d\n", round);
        void *params[] = {&round};
        CHECK(cuLaunchKernel(say, 1, 1, 1, 2, 1, 1, 0, nullptr, params, nullptr));
        CHECK(cuCtxSynchronize());
        printf("host after round %d\n", round);
    }
    return 0;
}

static int compute(CUmodule mod, int rounds) {
    const unsigned n = 1 << 20;
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, n * 4));
    std::vector<unsigned> back(n);
    CUfunction affine = function(mod, "affine");
    for (int round = 0; round < rounds; round++) {
        unsigned a = 2654435761u * (unsigned)(round + 1), b = (unsigned)round * 40503u, count = n;
        void *params[] = {&out, &a, &b, &count};
        CHECK(cuLaunchKernel(affine, n / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
        CHECK(cuMemcpyDtoH(back.data(), out, n * 4));
        for (unsigned i = 0; i < n; i++) {
            if (back[i] != a * i + b) {
                printf("compute: round %d wrong at %u: %u, want %u\n", round, i, back[i], a * i + b);
                return 1;
            }
        }
    }
    printf("compute: %d rounds ok\n", rounds);
    return 0;
}

static int sleep_kernel(CUmodule mod, unsigned ms) {
    void *params[] = {&ms};
    CHECK(cuLaunchKernel(function(mod, "sleep_ms"), 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
    CHECK(cuCtxSynchronize());
    printf("slept %u ms\n", ms);
    return 0;
}

// Every path of the driver API that takes device memory, tried against the
// total the device reports: through gpuplex, the tenant's limit.
static int memory(CUdevice dev) {
    size_t free_bytes, total;
    CHECK(cuMemGetInfo(&free_bytes, &total));
    size_t device_total;
    CHECK(cuDeviceTotalMem(&device_total, dev));
    printf("total %zu MiB, device total %zu MiB, free within total: %s\n", total >> 20, device_total >> 20,
           yes_no(free_bytes <= total));
    CUdeviceptr p;
    printf("alloc total + 1 MiB: %s\n", err_name(cuMemAlloc(&p, total + (1 << 20))));
    // Eighths of the total until refused: at most 8 fit.
    std::vector<CUdeviceptr> held;
    size_t chunk = total / 8;
    while (held.size() < 16) {
        CUresult rc = cuMemAlloc(&p, chunk);
        if (rc != CUDA_SUCCESS) {
            printf("alloc eighths: %zu fit, then %s\n", held.size(), err_name(rc));
            break;
        }
        held.push_back(p);
    }
    if (held.size() == 16) printf("alloc eighths: 16 fit, no limit\n");
    CHECK(cuMemGetInfo(&free_bytes, &total));
    printf("free after: %s\n", free_bytes < chunk ? "less than an eighth" : "an eighth or more");
    for (CUdeviceptr q : held) CHECK(cuMemFree(q));
    size_t pitch;
    printf("pitched total: %s\n", err_name(cuMemAllocPitch(&p, &pitch, total / 2, 3, 4)));
    CUresult rc = cuMemAllocPitch(&p, &pitch, 4096, 4, 4);
    printf("pitched 16 KiB: %s\n", err_name(rc));
    if (rc == CUDA_SUCCESS) CHECK(cuMemFree(p));
    CUmodule big;
    rc = cuModuleLoadData(&big, tenancy_big_fatbin);
    printf("module with a 1.5 GiB global: %s\n", err_name(rc));
    if (rc == CUDA_SUCCESS) CHECK(cuModuleUnload(big));
    CUlibrary lib;
    rc = cuLibraryLoadData(&lib, tenancy_big_fatbin, nullptr, nullptr, 0, nullptr, nullptr, 0);
    printf("library with a 1.5 GiB global: %s\n", err_name(rc));
    if (rc == CUDA_SUCCESS) CHECK(cuLibraryUnload(lib));
    // Managed memory is host memory through gpuplex (shared with the server,
    // mapped for the device; a remote guest gets none), so it takes nothing
    // of the limit.
    size_t free_before, free_after;
    CHECK(cuMemGetInfo(&free_before, &total));
    rc = cuMemAllocManaged(&p, 1 << 20, CU_MEM_ATTACH_GLOBAL);
    CHECK(cuMemGetInfo(&free_after, &total));
    printf("managed 1 MiB: takes nothing of the limit: %s\n", yes_no(free_after == free_before));
    if (rc == CUDA_SUCCESS) CHECK(cuMemFree(p));
    // Stream-ordered allocations draw on the same limit, and so does what a
    // pool keeps for reuse, until the pool gives it back: which a charge
    // that would not fit otherwise makes it do.
    printf("stream-ordered total + 1 MiB: %s\n", err_name(cuMemAllocAsync(&p, total + (1 << 20), nullptr)));
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    cuuint64_t keep_all = ~0ull;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    rc = cuMemAllocAsync(&p, 6 * chunk, nullptr);
    printf("stream-ordered six eighths: %s\n", err_name(rc));
    if (rc == CUDA_SUCCESS) {
        CHECK(cuMemFreeAsync(p, nullptr));
        CHECK(cuCtxSynchronize());
        CHECK(cuMemGetInfo(&free_bytes, &total));
        printf("freed, kept by the pool: free is less than three eighths: %s\n", yes_no(free_bytes < 3 * chunk));
        rc = cuMemAlloc(&p, 4 * chunk);
        printf("alloc half while the pool keeps six eighths: %s\n", err_name(rc));
        if (rc == CUDA_SUCCESS) CHECK(cuMemFree(p));
    }
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    size_t granularity = 0;
    rc = cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    printf("virtual memory granularity: %s\n", err_name(rc));
    if (rc == CUDA_SUCCESS) {
        // Physical memory counts from its creation until it is both
        // released and unmapped: half the total, mapped and released, still
        // leaves no room for the other half and a granule more.
        CUmemGenericAllocationHandle half, rest;
        size_t half_size = total / 2 / granularity * granularity;
        size_t rest_size = (total - half_size) / granularity * granularity + granularity;
        printf("virtual memory total + a granule: %s\n", err_name(cuMemCreate(&rest, rest_size + half_size, &prop, 0)));
        CHECK(cuMemCreate(&half, half_size, &prop, 0));
        CUdeviceptr range;
        CHECK(cuMemAddressReserve(&range, half_size, 0, 0, 0));
        CHECK(cuMemMap(range, half_size, 0, half, 0));
        CHECK(cuMemRelease(half));
        rc = cuMemCreate(&rest, rest_size, &prop, 0);
        printf("virtual memory beside half, released but mapped: %s\n", err_name(rc));
        if (rc == CUDA_SUCCESS) CHECK(cuMemRelease(rest));
        CHECK(cuMemUnmap(range, half_size));
        CHECK(cuMemAddressFree(range, half_size));
        rc = cuMemCreate(&rest, rest_size, &prop, 0);
        printf("the same once unmapped: %s\n", err_name(rc));
        if (rc == CUDA_SUCCESS) CHECK(cuMemRelease(rest));
    }
    // Arrays are charged by their elements' bytes.
    CUDA_ARRAY3D_DESCRIPTOR desc = {};
    desc.Width = 16384;
    desc.Height = total / (16384 * 4) + 1;
    desc.Format = CU_AD_FORMAT_FLOAT;
    desc.NumChannels = 1;
    CUarray array;
    printf("array of total + 64 KiB: %s\n", err_name(cuArray3DCreate(&array, &desc)));
    desc.Width = 1024;
    desc.Height = 1024;
    rc = cuArray3DCreate(&array, &desc);
    printf("array 4 MiB: %s\n", err_name(rc));
    if (rc == CUDA_SUCCESS) CHECK(cuArrayDestroy(array));
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: tenancy hold|poke ADDR|fault|assert|printf N|compute N|sleep MS|memory\n");
        return 2;
    }
    std::string mode = argv[1];
    if (mode == "connect") {
        using clock = std::chrono::steady_clock;
        auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
        auto start = clock::now();
        CHECK(cuInit(0));
        auto connected = clock::now();
        int count = 0;
        CHECK(cuDeviceGetCount(&count));
        CUdevice dev;
        CUcontext primary;
        CHECK(cuDeviceGet(&dev, 0));
        CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
        auto retained = clock::now();
        fprintf(stderr, "connect: cuInit %.1f ms, first context %.1f ms\n", ms(connected - start), ms(retained - connected));
        printf("devices %d\n", count);
        return 0;
    }
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, tenancy_fatbin));
    int arg = argc > 2 ? atoi(argv[2]) : 0;
    if (mode == "hold") return hold();
    if (mode == "poke" && argc > 2) return poke(mod, argv[2]);
    if (mode == "fault") return fault(mod);
    if (mode == "assert") return failed_assert(mod);
    if (mode == "printf") return device_printf(mod, arg);
    if (mode == "compute") return compute(mod, arg);
    if (mode == "sleep") return sleep_kernel(mod, (unsigned)arg);
    if (mode == "memory") return memory(dev);
    fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
}
