// expected_errors: calls that fail natively in a defined, safe way, each
// printed with its error name and string. Handles passed are either valid or
// NULL: a garbage handle may crash the real driver.
#include "common.h"

#include <sys/wait.h>
#include <unistd.h>

EMBED(vector_add_fatbin, "vector_add.fatbin");

// Prints a call's status as the driver names and describes it.
#define SHOW(call) show(#call, (call))
static void show(const char *call, CUresult rc) {
    const char *text = nullptr;
    if (cuGetErrorString(rc, &text) != CUDA_SUCCESS || text == nullptr) text = "?";
    printf("%s -> %d %s (%s)\n", call, (int)rc, err_name(rc), text);
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0); // keep every line if the driver crashes
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUdeviceptr d = 0;
    int count = 0, value = 0;

    // Before cuInit.
    SHOW(cuDeviceGetCount(&count));
    SHOW(cuDeviceGet(&dev, 0));
    SHOW(cuCtxGetCurrent(&ctx));
    SHOW(cuMemAlloc(&d, 16));
    int version;
    SHOW(cuDriverGetVersion(&version));

    // Status queries themselves.
    const char *s;
    SHOW(cuGetErrorName((CUresult)12345, &s));
    SHOW(cuGetErrorString((CUresult)12345, &s));

    CHECK(cuInit(0));
    SHOW(cuInit(1));
    SHOW(cuDeviceGet(&dev, 99));
    SHOW(cuDeviceGet(&dev, -1));
    SHOW(cuDeviceGetCount(nullptr));
    CHECK(cuDeviceGet(&dev, 0));
    SHOW(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 99));
    SHOW(cuDeviceGetAttribute(&value, (CUdevice_attribute)9999, dev));
    SHOW(cuDeviceGetAttribute(nullptr, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev));

    // No current context yet.
    SHOW(cuMemAlloc(&d, 16));
    SHOW(cuCtxSynchronize());
    SHOW(cuCtxPopCurrent(&ctx));

    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    // NULL out-pointers and sizes.
    SHOW(cuMemAlloc(nullptr, 16));
    SHOW(cuMemAlloc(&d, 0));
    SHOW(cuCtxGetCurrent(nullptr));
    SHOW(cuMemGetInfo(nullptr, nullptr));
    SHOW(cuStreamCreate(nullptr, 0));
    SHOW(cuEventCreate(nullptr, 0));

    // Ranges outside an allocation.
    CUdeviceptr buf;
    CHECK(cuMemAlloc(&buf, 4096));
    static unsigned char host[8192];
    SHOW(cuMemcpyHtoD(buf + 4000, host, 200));
    SHOW(cuMemcpyHtoD(buf, host, 8192));
    SHOW(cuMemcpyDtoH(host, buf + 4096, 1));
    SHOW(cuMemcpyHtoDAsync(buf + 4095, host, 2, nullptr));
    SHOW(cuMemcpyDtoD(buf, buf + 100, 4096));
    SHOW(cuMemsetD8(buf + 4000, 0, 200));
    SHOW(cuMemsetD32(buf, 0, 1025));
    SHOW(cuMemsetD32Async(buf + 8, 0, 1023, nullptr));
    CHECK(cuCtxSynchronize());

    // Frees of what was never allocated, and a double free.
    SHOW(cuMemFree(0));
    SHOW(cuMemFree(buf + 16));
    CHECK(cuMemFree(buf));
    SHOW(cuMemFree(buf));
    SHOW(cuMemFreeHost(nullptr));

    // Modules and functions.
    CUmodule mod;
    CUfunction fn;
    static const unsigned char garbage[64] = {0x13, 0x37, 0xde, 0xad, 0xbe, 0xef, 0x00};
    SHOW(cuModuleLoadData(&mod, garbage));
    SHOW(cuModuleLoadData(&mod, "this is not a CUDA image"));
    SHOW(cuModuleLoad(&mod, "/nonexistent/gpuplex/module.cubin"));
    CHECK(cuModuleLoadData(&mod, vector_add_fatbin));
    SHOW(cuModuleGetFunction(&fn, mod, "no_such_kernel"));
    SHOW(cuModuleGetFunction(&fn, nullptr, "vector_add"));
    SHOW(cuModuleUnload(nullptr));
    SHOW(cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, nullptr));
    CHECK(cuModuleGetFunction(&fn, mod, "vector_add"));

    // Launch configurations the device cannot take; nothing runs.
    CUdeviceptr a;
    CHECK(cuMemAlloc(&a, 2048 * sizeof(float)));
    int n = 0;
    void *params[] = {&a, &a, &a, &n};
    SHOW(cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, nullptr, params, nullptr));
    SHOW(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 128, 0, nullptr, params, nullptr));
    SHOW(cuLaunchKernel(fn, 0, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
    SHOW(cuLaunchKernel(fn, 1, 1, 1, 0, 1, 1, 0, nullptr, params, nullptr));
    SHOW(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 1 << 30, nullptr, params, nullptr));
    SHOW(cuLaunchKernel(nullptr, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
    SHOW(cuCtxSynchronize());
    CHECK(cuMemFree(a));

    // NULL and unrecorded events, NULL streams where a real one is required.
    CUevent e1, e2;
    float ms;
    CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&e2, CU_EVENT_DEFAULT));
    SHOW(cuEventElapsedTime(&ms, e1, e2));
    SHOW(cuEventRecord(nullptr, nullptr));
    SHOW(cuEventQuery(nullptr));
    SHOW(cuEventSynchronize(nullptr));
    SHOW(cuEventDestroy(nullptr));
    SHOW(cuStreamWaitEvent(nullptr, nullptr, 0));
    SHOW(cuStreamDestroy(nullptr));
    SHOW(cuStreamSynchronize(nullptr));
    CHECK(cuEventDestroy(e1));
    CHECK(cuEventDestroy(e2));

    // A child forked after initialization may not use its parent's CUDA
    // state: its calls fail, and the parent's go on working.
    fflush(stdout);
    pid_t child = fork();
    EXPECT(child >= 0, "fork failed");
    if (child == 0) {
        CUdeviceptr c;
        printf("forked child's cuMemAlloc fails: %s\n", yes_no(cuMemAlloc(&c, 16) != CUDA_SUCCESS));
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    EXPECT(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");

    // The context is still healthy after all of the above.
    CHECK(cuMemAlloc(&d, 16));
    CHECK(cuMemFree(d));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
