// attributes: what samples and libraries set on streams (an access policy
// window, a synchronization policy) read back as set, on a stream of their
// own and on the per-thread default stream; an attribute that holds a
// handle is refused; the profiler's start and stop answer as the driver
// does with no profiler attached; and the deprecated shared memory bank
// size is taken and read back as the hardware's.
#include "common.h"

// The deprecated shared memory bank size functions, as old programs call them.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// cudaProfiler.h declares these; the compiler from PyPI ships without it.
extern "C" CUresult CUDAAPI cuProfilerStart(void);
extern "C" CUresult CUDAAPI cuProfilerStop(void);

int main() {
    CUcontext ctx;
    init_primary(&ctx);
    CHECK(cuProfilerStart());
    CHECK(cuProfilerStop());
    printf("profiler start and stop: ok\n");

    CUdeviceptr buf;
    CHECK(cuMemAlloc(&buf, 1 << 20));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    CUstreamAttrValue window = {};
    window.accessPolicyWindow.base_ptr = (void *)buf;
    window.accessPolicyWindow.num_bytes = 1 << 20;
    window.accessPolicyWindow.hitRatio = 0.5f;
    window.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
    window.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
    CHECK(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &window));
    CUstreamAttrValue got = {};
    CHECK(cuStreamGetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &got));
    const CUaccessPolicyWindow &w = got.accessPolicyWindow;
    printf("access policy window read back as set: %s\n",
           yes_no(w.base_ptr == (void *)buf && w.num_bytes == (1 << 20) && w.hitRatio == 0.5f &&
                  w.hitProp == CU_ACCESS_PROPERTY_PERSISTING && w.missProp == CU_ACCESS_PROPERTY_STREAMING));

    CUstreamAttrValue spin = {};
    spin.syncPolicy = CU_SYNC_POLICY_SPIN;
    CHECK(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &spin));
    got = {};
    CHECK(cuStreamGetAttribute(stream, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &got));
    printf("synchronization policy read back: %s\n", got.syncPolicy == CU_SYNC_POLICY_SPIN ? "spin" : "other");

    CUstreamAttrValue event = {};
    CUresult rc = cuStreamSetAttribute(stream, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, &event);
    printf("an attribute that is no stream's refused: %s\n", yes_no(rc != CUDA_SUCCESS));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuMemFree(buf));
    CUsharedconfig banks;
    CHECK(cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE));
    CHECK(cuCtxGetSharedMemConfig(&banks));
    printf("shared memory banks after asking for eight bytes: %s\n",
           banks == CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE    ? "four bytes"
           : banks == CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE ? "eight bytes"
                                                                : "other");
    CHECK(cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE));
    printf("done\n");
    return 0;
}
