// pointers: what cuPointerGetAttributes answers about device memory, pinned
// memory (small, as flags and counters are), managed memory and memory CUDA
// does not know (malloc), as frameworks ask before every copy: each
// attribute written at the driver's width (a boolean is 4 bytes, so a
// buffer filled with 0x55 shows what was written), one that does not apply
// to the memory written as zero, an unknown pointer's host address as
// itself and its device as -2; and the deprecated P2P tokens refused.
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
    free(plain);
    CHECK(cuMemFree(managed));
    CHECK(cuMemFreeHost(pinned));
    CHECK(cuMemFree(dev));
    printf("done\n");
    return 0;
}
