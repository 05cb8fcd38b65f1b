// pools: stream-ordered allocation as allocators built on it use it
// (PyTorch's cudaMallocAsync backend, RAPIDS' pool resources): the device's
// default pool kept from releasing memory, allocations made, used by copies,
// a memset and a kernel, and freed in stream order; what the pool keeps and
// a trim giving it back; a pool of the program's own made the device's
// current one, its watermarks reset, and destroyed; a stream-ordered
// allocation freed by cuMemFree. What it prints is the same on any device.
#include "common.h"

#include <vector>

EMBED(vector_add_fatbin, "vector_add.fatbin");

static cuuint64_t attribute(CUmemoryPool pool, CUmemPool_attribute attr) {
    cuuint64_t value = 0;
    CHECK(cuMemPoolGetAttribute(pool, attr, &value));
    return value;
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    int supported = 0;
    CHECK(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev));
    printf("memory pools supported: %s\n", yes_no(supported == 1));

    CUmemoryPool fallback, current;
    CHECK(cuDeviceGetDefaultMemPool(&fallback, dev));
    CHECK(cuDeviceGetMemPool(&current, dev));
    printf("the current pool is the default one: %s\n", yes_no(fallback == current));
    cuuint64_t keep_all = ~0ull;
    CHECK(cuMemPoolSetAttribute(fallback, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    printf("release threshold set: %s\n", yes_no(attribute(fallback, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == keep_all));
    int follow = -1;
    CHECK(cuMemPoolGetAttribute(fallback, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &follow));
    printf("reuse follows event dependencies: %s\n", yes_no(follow == 1));

    // vector_add on three stream-ordered allocations.
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    const int n = 1 << 18;
    const size_t bytes = n * sizeof(float);
    std::vector<float> x(n), y(n), sum(n);
    for (int i = 0; i < n; i++) {
        x[i] = (float)(i % 1021) * 0.5f;
        y[i] = (float)(i % 7) - 3.0f;
    }
    CUdeviceptr dx, dy, dsum;
    CHECK(cuMemAllocAsync(&dx, bytes, s));
    CHECK(cuMemAllocAsync(&dy, bytes, s));
    CHECK(cuMemAllocAsync(&dsum, bytes, s));
    printf("in use while allocated: at least the three: %s\n",
           yes_no(attribute(fallback, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) >= 3 * bytes));
    CUmodule mod;
    CUfunction add;
    CHECK(cuModuleLoadData(&mod, vector_add_fatbin));
    CHECK(cuModuleGetFunction(&add, mod, "vector_add"));
    CHECK(cuMemcpyHtoDAsync(dx, x.data(), bytes, s));
    CHECK(cuMemcpyHtoDAsync(dy, y.data(), bytes, s));
    CHECK(cuMemsetD32Async(dsum, 0x7fc00000, n, s));
    int count = n;
    void *params[] = {&dx, &dy, &dsum, &count};
    CHECK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, params, nullptr));
    CHECK(cuMemcpyDtoHAsync(sum.data(), dsum, bytes, s));
    CHECK(cuMemFreeAsync(dx, s));
    CHECK(cuMemFreeAsync(dy, s));
    CHECK(cuMemFreeAsync(dsum, s));
    CHECK(cuStreamSynchronize(s));
    for (int i = 0; i < n; i++) EXPECT(sum[i] == x[i] + y[i], "sum[%d] = %g, want %g", i, sum[i], x[i] + y[i]);
    printf("vector_add over %d floats in stream-ordered memory: ok checksum=%016llx\n", n,
           (unsigned long long)checksum(sum.data(), bytes));

    // Freed, but kept for reuse under the threshold; a trim gives it back.
    printf("after the frees nothing is in use: %s\n", yes_no(attribute(fallback, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0));
    printf("the pool keeps what was freed: %s\n",
           yes_no(attribute(fallback, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 3 * bytes));
    printf("its high watermark saw all three: %s\n",
           yes_no(attribute(fallback, CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= 3 * bytes));
    CHECK(cuMemPoolTrimTo(fallback, 0));
    printf("after a trim it keeps nothing: %s\n", yes_no(attribute(fallback, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0));

    // A pool of the program's own, made the device's current pool.
    CUmemPoolProps props = {};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = (int)dev;
    CUmemoryPool mine;
    CHECK(cuMemPoolCreate(&mine, &props));
    CUmemAccess_flags flags;
    CHECK(cuMemPoolGetAccess(&flags, mine, &props.location));
    printf("its own device may read and write it: %s\n", yes_no(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CHECK(cuDeviceSetMemPool(dev, mine));
    CHECK(cuDeviceGetMemPool(&current, dev));
    printf("made the current pool: %s\n", yes_no(current == mine));

    CUdeviceptr a, b;
    CHECK(cuMemAllocAsync(&a, 1 << 20, s));
    CHECK(cuMemAllocFromPoolAsync(&b, 1 << 20, mine, s));
    printf("both allocations come from it: %s\n", yes_no(attribute(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) >= 2 << 20));
    CHECK(cuMemsetD8Async(a, 0x5a, 1 << 20, s));
    CHECK(cuMemcpyDtoDAsync(b, a, 1 << 20, s));
    std::vector<unsigned char> back(1 << 20);
    CHECK(cuMemcpyDtoHAsync(back.data(), b, back.size(), s));
    CHECK(cuStreamSynchronize(s));
    bool set = true;
    for (unsigned char v : back) set = set && v == 0x5a;
    printf("a memset and a copy between them: %s\n", yes_no(set));
    CHECK(cuMemFreeAsync(a, s));
    // cuMemFree takes a stream-ordered allocation too, once its work is done.
    CHECK(cuMemFree(b));
    CHECK(cuStreamSynchronize(s));
    cuuint64_t zero = 0;
    CHECK(cuMemPoolSetAttribute(mine, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
    printf("its high watermark reset to what is in use: %s\n",
           yes_no(attribute(mine, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == attribute(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)));

    CHECK(cuMemPoolDestroy(mine));
    CHECK(cuDeviceGetMemPool(&current, dev));
    printf("destroyed, the default pool is current again: %s\n", yes_no(current == fallback));

    CHECK(cuStreamDestroy(s));
    CHECK(cuModuleUnload(mod));
    printf("done\n");
    return 0;
}
