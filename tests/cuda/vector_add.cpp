// vector_add: a module from an embedded fatbin, and the same kernel launched
// three ways: kernelParams, the `extra` packed buffer, and cuLaunchKernelEx.
#include "common.h"

#include <cstddef>
#include <vector>

EMBED(vector_add_fatbin, "vector_add.fatbin");

static const int N = 1000003;
static const unsigned BLOCK = 256;

// Reads c back, checks c[i] == a[i] + b[i] for i < n and 0 beyond, prints a line.
static void check_result(const char *how, CUdeviceptr dc, const std::vector<float> &a,
                         const std::vector<float> &b, int n) {
    std::vector<float> c(N);
    CHECK(cuMemcpyDtoH(c.data(), dc, N * sizeof(float)));
    for (int i = 0; i < N; i++) {
        float want = i < n ? a[i] + b[i] : 0.0f;
        EXPECT(c[i] == want, "%s: c[%d] = %g, want %g", how, i, c[i], want);
    }
    printf("%s: n=%d ok checksum=%016llx\n", how, n,
           (unsigned long long)checksum(c.data(), N * sizeof(float)));
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);

    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, vector_add_fatbin));
    CHECK(cuModuleGetFunction(&fn, mod, "vector_add"));

    std::vector<float> a(N), b(N);
    for (int i = 0; i < N; i++) {
        a[i] = (float)(i % 1000) * 0.5f;
        b[i] = (float)(i / 1000) - 3.25f;
    }
    size_t bytes = N * sizeof(float);
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc(&da, bytes));
    CHECK(cuMemAlloc(&db, bytes));
    CHECK(cuMemAlloc(&dc, bytes));
    CHECK(cuMemcpyHtoD(da, a.data(), bytes));
    CHECK(cuMemcpyHtoD(db, b.data(), bytes));
    unsigned grid = (N + BLOCK - 1) / BLOCK;

    // 1. kernelParams: an array of pointers to each argument.
    int n = N;
    CHECK(cuMemsetD8(dc, 0, bytes));
    void *params[] = {&da, &db, &dc, &n};
    CHECK(cuLaunchKernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, nullptr, params, nullptr));
    CHECK(cuCtxSynchronize());
    check_result("kernelParams", dc, a, b, n);

    // 2. extra: the arguments packed as the kernel lays them out, with a
    // smaller n so that a wrongly packed n shows.
    struct {
        CUdeviceptr a, b, c;
        int n;
    } packed = {da, db, dc, N - 5};
    size_t packed_size = offsetof(decltype(packed), n) + sizeof(int);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &packed_size, CU_LAUNCH_PARAM_END};
    CHECK(cuMemsetD8(dc, 0, bytes));
    CHECK(cuLaunchKernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, nullptr, nullptr, extra));
    CHECK(cuCtxSynchronize());
    check_result("extra", dc, a, b, packed.n);

    // 3. cuLaunchKernelEx on a created stream, with a priority attribute.
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attr.value.priority = 0;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid, cfg.gridDimY = 1, cfg.gridDimZ = 1;
    cfg.blockDimX = BLOCK, cfg.blockDimY = 1, cfg.blockDimZ = 1;
    cfg.hStream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    n = N - 1000;
    CHECK(cuMemsetD8Async(dc, 0, bytes, stream));
    CHECK(cuLaunchKernelEx(&cfg, fn, params, nullptr));
    CHECK(cuStreamSynchronize(stream));
    check_result("cuLaunchKernelEx", dc, a, b, n);

    CHECK(cuStreamDestroy(stream));
    CHECK(cuMemFree(da));
    CHECK(cuMemFree(db));
    CHECK(cuMemFree(dc));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
