// queries: the questions programs ask over and over (a context's device, a
// primary context's state, a function's attributes and occupancy, a stream's
// capture status) answer
// the same every time, and a change is seen at once: a raised or lowered
// dynamic shared memory limit, a released and retained primary context.
// Launches past the default shared memory, once the limit is raised, work;
// one past the limit is refused at the launch itself.
#include "common.h"

// The deprecated shared memory bank size functions, as old programs call them.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <vector>

EMBED(queries_fatbin, "queries.fatbin");

static const int ROUNDS = 1000;
static const int SEGMENTS = 4, SMEM = 64 * 1024, WORDS = SMEM / (int)sizeof(int), BLOCK = 256;

static int attribute(CUfunction fn, CUfunction_attribute a) {
    int v = -1;
    CHECK(cuFuncGetAttribute(&v, a, fn));
    return v;
}

// Launches shared_reverse over the segments with `smem` bytes of dynamic
// shared memory; returns the launch's own status.
static CUresult reverse(CUfunction fn, CUdeviceptr in, CUdeviceptr out, int smem) {
    int words = WORDS;
    void *params[] = {&in, &out, &words};
    return cuLaunchKernel(fn, SEGMENTS, 1, 1, BLOCK, 1, 1, smem, nullptr, params, nullptr);
}

// Whether a launch was refused; its error goes to stderr, since which one
// the driver picks is not this program's business.
static const char *refused(CUresult rc) {
    if (rc != CUDA_SUCCESS) fprintf(stderr, "(the launch failed with %s)\n", err_name(rc));
    return yes_no(rc != CUDA_SUCCESS);
}

static void check_reversed(CUdeviceptr out, const std::vector<int> &seg, const char *how) {
    std::vector<int> rev(seg.size());
    CHECK(cuMemcpyDtoH(rev.data(), out, rev.size() * sizeof(int)));
    for (int s = 0; s < SEGMENTS; s++)
        for (int j = 0; j < WORDS; j++)
            EXPECT(rev[s * WORDS + j] == seg[s * WORDS + WORDS - 1 - j], "%s: rev[%d] = %d", how, s * WORDS + j,
                   rev[s * WORDS + j]);
    printf("%s: %d segments of %d words reversed\n", how, SEGMENTS, WORDS);
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);

    // The context's device, and the primary context's state, many times.
    bool same = true;
    for (int i = 0; i < ROUNDS; i++) {
        CUdevice d = -1;
        CHECK(cuCtxGetDevice(&d));
        unsigned flags = 99;
        int active = -1;
        CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
        same = same && d == dev && active == 1;
    }
    printf("context device and primary state asked %d times: same each time: %s\n", ROUNDS, yes_no(same));

    // A second retain and a release leave it active; a context of our own
    // is on the same device.
    CUcontext again;
    CHECK(cuDevicePrimaryCtxRetain(&again, dev));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    unsigned flags = 0;
    int active = 0;
    CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    printf("after retain and release: active %d\n", active);
    CUcontext own;
    CHECK(cuCtxCreate(&own, nullptr, 0, dev));
    CUdevice own_dev = -1;
    CHECK(cuCtxGetDevice(&own_dev));
    printf("a created context is on the same device: %s\n", yes_no(own_dev == dev));
    CHECK(cuCtxDestroy(own));
    CHECK(cuCtxSetCurrent(ctx));

    size_t linear_width = 0;
    CHECK(cuDeviceGetTexture1DLinearMaxWidth(&linear_width, CU_AD_FORMAT_FLOAT, 4, dev));
    printf("a 1D linear texture of float4 may be wide: %s\n", yes_no(linear_width >= (1u << 20)));

    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, queries_fatbin));
    CHECK(cuModuleGetFunction(&fn, mod, "shared_reverse"));
    const char *name = nullptr, *again_name = nullptr;
    CHECK(cuFuncGetName(&name, fn));
    CHECK(cuFuncGetName(&again_name, fn));
    printf("the function's name: %s, the same string asked again: %s\n", name, yes_no(again_name == name));
    int threads = attribute(fn, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    int dynamic = attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
    int blocks = -1;
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, BLOCK, 16 * 1024));
    same = true;
    for (int i = 0; i < ROUNDS; i++) {
        CUfunction again_fn;
        CHECK(cuModuleGetFunction(&again_fn, mod, "shared_reverse"));
        int b = -1;
        CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&b, fn, BLOCK, 16 * 1024));
        same = same && again_fn == fn && attribute(fn, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) == threads &&
               attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) == dynamic && b == blocks;
    }
    printf("function, attributes and occupancy asked %d times: same each time: %s\n", ROUNDS, yes_no(same));
    printf("max dynamic shared memory: %d\n", dynamic);

    std::vector<int> seg(SEGMENTS * WORDS);
    for (size_t i = 0; i < seg.size(); i++) seg[i] = (int)i * 7 - 3;
    size_t bytes = seg.size() * sizeof(int);
    CUdeviceptr in, out;
    CHECK(cuMemAlloc(&in, bytes));
    CHECK(cuMemAlloc(&out, bytes));
    CHECK(cuMemcpyHtoD(in, seg.data(), bytes));

    printf("%d bytes before raising the limit refused: %s\n", SMEM, refused(reverse(fn, in, out, SMEM)));
    CHECK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM));
    printf("max dynamic shared memory after raising it: %d\n",
           attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES));
    // As some libraries do: the same limit set again before every launch.
    for (int i = 0; i < 100; i++) {
        CHECK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM));
        CHECK(reverse(fn, in, out, SMEM));
    }
    CHECK(cuCtxSynchronize());
    check_reversed(out, seg, "100 launches with the limit raised");
    // The deprecated bank size, which old programs set before their launches.
    CHECK(cuFuncSetSharedMemConfig(fn, CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE));
    CHECK(cuMemsetD8(out, 0, bytes));
    CHECK(reverse(fn, in, out, SMEM));
    CHECK(cuCtxSynchronize());
    check_reversed(out, seg, "a launch after setting the function's bank size");
    printf("%d bytes, past the raised limit, refused: %s\n", SMEM + 4, refused(reverse(fn, in, out, SMEM + 4)));

    CHECK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM / 2));
    printf("max dynamic shared memory after lowering it: %d\n",
           attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES));
    printf("%d bytes after lowering the limit refused: %s\n", SMEM, refused(reverse(fn, in, out, SMEM)));

    // Whether a stream captures, asked as frameworks do before allocating:
    // none, each time; active while a capture runs, and none again after.
    CUstream st;
    CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    same = true;
    for (int i = 0; i < ROUNDS; i++) {
        CHECK(cuStreamIsCapturing(st, &cs));
        same = same && cs == CU_STREAM_CAPTURE_STATUS_NONE;
    }
    printf("a stream's capture status asked %d times: none each time: %s\n", ROUNDS, yes_no(same));
    CHECK(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CHECK(cuStreamIsCapturing(st, &cs));
    printf("while capturing: active %s\n", yes_no(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE));
    CUgraph g;
    CHECK(cuStreamEndCapture(st, &g));
    CHECK(cuStreamIsCapturing(st, &cs));
    printf("after the capture: none %s\n", yes_no(cs == CU_STREAM_CAPTURE_STATUS_NONE));
    CHECK(cuGraphDestroy(g));
    CHECK(cuStreamDestroy(st));

    CHECK(cuMemFree(in));
    CHECK(cuMemFree(out));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    printf("after the last release: active %d\n", active);
    printf("done\n");
    return 0;
}
