// unregistered: launches a kernel that has no reference implementation on
// the emulated device. Natively it runs; on the emulated device the launch
// fails with CUDA_ERROR_NOT_SUPPORTED, and the front-end warns on stderr,
// naming the kernel. Checked in CI only (crates/cli/tests/cli.rs).
#include "common.h"

EMBED(unregistered_fatbin, "unregistered.fatbin");

int main() {
    CUcontext ctx;
    init_primary(&ctx);
    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, unregistered_fatbin));
    CHECK(cuModuleGetFunction(&fn, mod, "not_a_test_kernel"));
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, 32 * sizeof(int)));
    void *params[] = {&out};
    CUresult launched = cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr);
    CUresult synced = cuCtxSynchronize();
    printf("launch: %s, then synchronize: %s\n", err_name(launched), err_name(synced));
    return 0;
}
