// vmm: virtual memory management as growing allocators use it (PyTorch's
// expandable segments, XLA's device allocator): a reserved range, physical
// allocations mapped into it back to back, access granted; copies, a memset
// and a kernel across the seam of two mappings; copies on a stream inside
// one mapping, as an allocator's pieces; an allocation's properties
// and its handle found again from an address; memory released while mapped
// stays until unmapped; then everything unmapped, released and freed.
// Sizes are in granules, so what it prints is the same on any device.
#include "common.h"

#include <vector>

EMBED(vector_add_fatbin, "vector_add.fatbin");

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);

    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    size_t g = 0, recommended = 0;
    CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK(cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    printf("granularity: a power of two, at most the recommended one: %s\n",
           yes_no(g > 0 && (g & (g - 1)) == 0 && g <= recommended));

    CUdeviceptr base;
    CHECK(cuMemAddressReserve(&base, 4 * g, 0, 0, 0));
    printf("4 granules reserved, aligned to one: %s\n", yes_no(base % g == 0));
    CUmemGenericAllocationHandle a, b;
    CHECK(cuMemCreate(&a, g, &prop, 0));
    CHECK(cuMemCreate(&b, g, &prop, 0));
    CHECK(cuMemMap(base, g, 0, a, 0));
    CHECK(cuMemMap(base + g, g, 0, b, 0));
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(base, 2 * g, &access, 1));
    unsigned long long flags = 0;
    CHECK(cuMemGetAccess(&flags, &prop.location, base + g));
    printf("access of the second mapping: %s\n", flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "read-write" : "other");

    // One copy across both mappings, each way.
    std::vector<unsigned char> host(2 * g), back(2 * g);
    fill_pattern(host.data(), host.size(), 7);
    CHECK(cuMemcpyHtoD(base, host.data(), host.size()));
    CHECK(cuMemcpyDtoH(back.data(), base, back.size()));
    printf("a copy across two mappings comes back the same: %s\n", yes_no(host == back));

    // A memset over the seam.
    CHECK(cuMemsetD32(base + g - 64, 0x01020304, 32));
    unsigned seam[32];
    CHECK(cuMemcpyDtoH(seam, base + g - 64, sizeof seam));
    bool set = true;
    for (unsigned v : seam) set = set && v == 0x01020304;
    printf("a memset across the seam: %s\n", yes_no(set));

    // Inside one mapping, as an allocator hands out its pieces: what the
    // pointer is, and asynchronous copies and a memset on a stream.
    unsigned type = 0;
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + g + 8));
    CUstream st;
    CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    unsigned piece[64], piece_back[128];
    for (unsigned i = 0; i < 64; i++) piece[i] = 3 * i + 1;
    CHECK(cuMemcpyHtoDAsync(base + g + 256, piece, sizeof piece, st));
    CHECK(cuMemsetD32Async(base + g + 256 + sizeof piece, 9, 64, st));
    CHECK(cuMemcpyDtoHAsync(piece_back, base + g + 256, sizeof piece_back, st));
    CHECK(cuStreamSynchronize(st));
    bool piece_ok = memcmp(piece_back, piece, sizeof piece) == 0;
    for (unsigned i = 64; i < 128; i++) piece_ok = piece_ok && piece_back[i] == 9;
    printf("in the second mapping: device memory %s; asynchronous copies and a memset: %s\n",
           yes_no(type == CU_MEMORYTYPE_DEVICE), yes_no(piece_ok));
    CHECK(cuStreamDestroy(st));

    // vector_add with its second operand across the seam.
    CUmodule mod;
    CUfunction add;
    CHECK(cuModuleLoadData(&mod, vector_add_fatbin));
    CHECK(cuModuleGetFunction(&add, mod, "vector_add"));
    int n = (int)(g / 8 / sizeof(float));
    std::vector<float> x(n), y(n), sum(n);
    for (int i = 0; i < n; i++) {
        x[i] = (float)(i % 977) * 0.25f;
        y[i] = (float)(i % 13) - 6.0f;
    }
    CUdeviceptr dx = base, dy = base + g - (size_t)n * sizeof(float) / 2, dsum = base + g + g / 2;
    CHECK(cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
    CHECK(cuMemcpyHtoD(dy, y.data(), n * sizeof(float)));
    void *params[] = {&dx, &dy, &dsum, &n};
    CHECK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
    CHECK(cuMemcpyDtoH(sum.data(), dsum, n * sizeof(float)));
    for (int i = 0; i < n; i++) EXPECT(sum[i] == x[i] + y[i], "sum[%d] = %g, want %g", i, sum[i], x[i] + y[i]);
    printf("vector_add over %d floats, one operand across the seam: ok checksum=%016llx\n", n,
           (unsigned long long)checksum(sum.data(), n * sizeof(float)));

    // What the handle says, and the handle found from an address.
    CUmemAllocationProp got = {};
    CHECK(cuMemGetAllocationPropertiesFromHandle(&got, b));
    printf("properties: pinned on this device: %s\n",
           yes_no(got.type == CU_MEM_ALLOCATION_TYPE_PINNED && got.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
                  got.location.id == (int)dev));
    CUmemGenericAllocationHandle found;
    CHECK(cuMemRetainAllocationHandle(&found, (void *)(base + g + 100)));
    printf("the handle retained from an address in the second mapping is its own: %s\n", yes_no(found == b));
    CHECK(cuMemRelease(found));

    // Released while mapped: still there until unmapped.
    std::vector<unsigned char> before(g);
    CHECK(cuMemcpyDtoH(before.data(), base, g));
    CHECK(cuMemRelease(a));
    CHECK(cuMemcpyDtoH(back.data(), base, g));
    printf("released while mapped, still there: %s\n", yes_no(memcmp(back.data(), before.data(), g) == 0));
    CUdeviceptr occupied = base + g;
    printf("a map over a mapping refused: %s\n", yes_no(cuMemMap(occupied, g, 0, b, 0) != CUDA_SUCCESS));

    CHECK(cuMemUnmap(base, 2 * g));
    CHECK(cuMemRelease(b));
    CHECK(cuMemAddressFree(base, 4 * g));
    CHECK(cuModuleUnload(mod));
    printf("done\n");
    return 0;
}
