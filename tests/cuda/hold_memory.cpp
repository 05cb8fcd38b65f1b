// hold_memory MiB: allocates and touches MiB of device memory, prints
// "holding", then sleeps until killed. Used to check that a killed client's
// memory comes back.
#include "common.h"

#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: hold_memory MIB\n");
        return 2;
    }
    size_t bytes = strtoull(argv[1], nullptr, 10) << 20;
    CUcontext ctx;
    init_primary(&ctx);
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, bytes));
    CHECK(cuMemsetD8(d, 0x5A, bytes));
    CHECK(cuCtxSynchronize());
    printf("holding %s MiB\n", argv[1]);
    fflush(stdout);
    for (;;) pause();
}
