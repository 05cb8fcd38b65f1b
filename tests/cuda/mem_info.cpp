// mem_info: free and total device memory as cuMemGetInfo reports them in the
// primary context of device 0.
#include "common.h"

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    size_t free_bytes, total_bytes;
    CHECK(cuMemGetInfo(&free_bytes, &total_bytes));
    printf("free %zu total %zu\n", free_bytes, total_bytes);
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
