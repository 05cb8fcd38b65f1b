// pointers: what cuPointerGetAttributes answers about device memory, pinned
// memory (small, as flags and counters are), managed memory and memory CUDA
// does not know (malloc), as frameworks ask before every copy: each
// attribute written at the driver's width (a boolean is 4 bytes, so a
// buffer filled with 0x55 shows what was written), one that does not apply
// to the memory written as zero, an unknown pointer's host address as
// itself and its device as -2; and the deprecated P2P tokens refused.
// Then what only the driver knows of device memory: the pool an allocation
// came from, the mapping that holds it (printed as whether it holds the
// allocation, and for virtual memory as offsets in granules, which do not
// depend on the driver) and hardware decompression (a boolean the hardware
// decides), asked together and one by one.
#include "common.h"

// The attributes asked, with how each is printed: a pointer compared to
// the memory's (= same, 0 null, ! other), anything else as the raw 8 bytes.
static const CUpointer_attribute ASKED[] = {
    CU_POINTER_ATTRIBUTE_CONTEXT,     CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_HOST_POINTER,
    CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, CU_POINTER_ATTRIBUTE_IS_MANAGED,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
    CU_POINTER_ATTRIBUTE_MAPPED,      CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
    CU_POINTER_ATTRIBUTE_ACCESS_FLAGS,
};
static const int N = sizeof ASKED / sizeof ASKED[0];

static bool is_pointer(CUpointer_attribute a) {
    return a == CU_POINTER_ATTRIBUTE_CONTEXT || a == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ||
           a == CU_POINTER_ATTRIBUTE_HOST_POINTER;
}

static void show(const char *what, CUdeviceptr p, CUcontext ctx) {
    unsigned long long v[N];
    void *data[N];
    for (int i = 0; i < N; i++) v[i] = 0x5555555555555555ull, data[i] = &v[i];
    CHECK(cuPointerGetAttributes(N, (CUpointer_attribute *)ASKED, data, p));
    printf("%s:", what);
    for (int i = 0; i < N; i++) {
        if (!is_pointer(ASKED[i])) {
            printf(" %llx", v[i]);
            continue;
        }
        unsigned long long same = ASKED[i] == CU_POINTER_ATTRIBUTE_CONTEXT ? (unsigned long long)ctx : p;
        printf(" %s", v[i] == same ? "=" : v[i] == 0 ? "0" : "!");
    }
    printf("\n");
}

static const CUpointer_attribute MAPPING[] = {
    CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
    CU_POINTER_ATTRIBUTE_MAPPING_SIZE, CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE,
};

// Attributes MAPPING of p, asked together; each asked alone must agree.
static void mapping_of(CUdeviceptr p, unsigned long long v[4]) {
    void *data[4];
    for (int i = 0; i < 4; i++) v[i] = 0x5555555555555555ull, data[i] = &v[i];
    CHECK(cuPointerGetAttributes(4, (CUpointer_attribute *)MAPPING, data, p));
    for (int i = 0; i < 4; i++) {
        unsigned long long one = 0x5555555555555555ull;
        CHECK(cuPointerGetAttribute(&one, MAPPING[i], p));
        if (one != v[i]) printf("attribute %d alone: %llx, together: %llx\n", MAPPING[i], one, v[i]);
    }
}

static void show_mapping(const char *what, CUdeviceptr p, size_t size, CUmemoryPool pool) {
    unsigned long long v[4];
    mapping_of(p, v);
    bool holds = v[1] <= p && p + size <= v[1] + v[2];
    bool boolean = (v[3] >> 32) == 0x55555555u && (unsigned)v[3] <= 1;
    printf("%s: pool %s, mapping %s, decompress %s\n", what,
           v[0] == 0 ? "none" : v[0] == (unsigned long long)pool ? "the one it came from" : "!", holds ? "holds it" : "!",
           boolean ? "a boolean" : "!");
}

// A reserved range of 4 granules, the first two mapped from one allocation
// and the third from another: each mapping as the driver made it.
static void virtual_mappings(CUdevice dev) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t g;
    CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle two, one;
    CHECK(cuMemCreate(&two, 2 * g, &prop, 0));
    CHECK(cuMemCreate(&one, g, &prop, 0));
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
    CHECK(cuMemMap(va, 2 * g, 0, two, 0));
    CHECK(cuMemMap(va + 2 * g, g, 0, one, 0));
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(va, 3 * g, &access, 1));
    for (int at = 0; at < 3; at++) {
        unsigned long long v[4];
        mapping_of(va + at * g, v);
        printf("virtual, granule %d: pool %llx, mapping from granule %lld, %lld granules\n", at, v[0],
               (long long)(v[1] - va) / (long long)g, (long long)(v[2] / g));
    }
    CHECK(cuMemUnmap(va, 3 * g));
    CHECK(cuMemAddressFree(va, 4 * g));
    CHECK(cuMemRelease(two));
    CHECK(cuMemRelease(one));
}

int main() {
    CUcontext ctx;
    init_primary(&ctx);
    CUdeviceptr dev, managed;
    void *pinned;
    CHECK(cuMemAlloc(&dev, 4096));
    CHECK(cuMemAllocHost(&pinned, 4000));
    CHECK(cuMemAllocManaged(&managed, 4096, CU_MEM_ATTACH_GLOBAL));
    void *plain = malloc(4096);
    printf("context type device host sync managed ordinal ipc mapped handles access\n");
    show("device", dev, ctx);
    show("pinned", (CUdeviceptr)pinned, ctx);
    show("managed", managed, ctx);
    show("malloc", (CUdeviceptr)plain, ctx);
    CUpointer_attribute tokens = CU_POINTER_ATTRIBUTE_P2P_TOKENS;
    unsigned long long t[4];
    void *data = t;
    printf("P2P tokens: %s\n", err_name(cuPointerGetAttributes(1, &tokens, &data, dev)));

    CUdevice device;
    CHECK(cuCtxGetDevice(&device));
    CUmemoryPool default_pool, mine;
    CHECK(cuDeviceGetDefaultMemPool(&default_pool, device));
    CUmemPoolProps props = {};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    CHECK(cuMemPoolCreate(&mine, &props));
    CUdeviceptr from_default, from_mine;
    CHECK(cuMemAllocAsync(&from_default, 1 << 20, 0));
    CHECK(cuMemAllocFromPoolAsync(&from_mine, 1 << 20, mine, 0));
    CHECK(cuStreamSynchronize(0));
    show_mapping("device", dev + 100, 1, NULL);
    show_mapping("default pool", from_default, 1 << 20, default_pool);
    show_mapping("own pool", from_mine, 1 << 20, mine);
    show_mapping("pinned", (CUdeviceptr)pinned, 4000, NULL);
    show_mapping("managed", managed, 4096, NULL);
    unsigned long long v[4];
    void *out[4];
    for (int i = 0; i < 4; i++) v[i] = 0x5555555555555555ull, out[i] = &v[i];
    CHECK(cuPointerGetAttributes(4, (CUpointer_attribute *)MAPPING, out, (CUdeviceptr)plain));
    printf("malloc: %llx %llx %llx %llx\n", v[0], v[1], v[2], v[3]);
    virtual_mappings(device);
    CHECK(cuMemFreeAsync(from_default, 0));
    CHECK(cuMemFreeAsync(from_mine, 0));
    CHECK(cuStreamSynchronize(0));
    CHECK(cuMemPoolDestroy(mine));
    free(plain);
    CHECK(cuMemFree(managed));
    CHECK(cuMemFreeHost(pinned));
    CHECK(cuMemFree(dev));
    printf("done\n");
    return 0;
}
