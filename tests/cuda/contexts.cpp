// contexts: the primary context's state machine, created contexts, the
// per-thread context stack, a second thread with its own context, and
// context queries and limits.
#include "common.h"

#include <pthread.h>

static CUdevice dev;
static unsigned long long main_ids[2];

static void primary_state(const char *when) {
    unsigned flags;
    int active;
    CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    printf("primary %s: flags=%#x active=%d\n", when, flags, active);
}

// Allocates, fills and reads back a little memory in the current context.
static void use_memory(const char *who) {
    CUdeviceptr d;
    unsigned v[16];
    CHECK(cuMemAlloc(&d, sizeof v));
    CHECK(cuMemsetD32(d, 0x01020304, 16));
    CHECK(cuMemcpyDtoH(v, d, sizeof v));
    CHECK(cuMemFree(d));
    for (unsigned x : v) EXPECT(x == 0x01020304, "%s: memory content", who);
    printf("%s: memory ok\n", who);
}

static void *second_thread(void *) {
    CUcontext cur, own;
    CHECK(cuCtxGetCurrent(&cur));
    printf("thread: starts with no context: %s\n", yes_no(cur == nullptr));
    CHECK(cuCtxCreate(&own, nullptr, 0, dev));
    CHECK(cuCtxGetCurrent(&cur));
    printf("thread: own context current: %s\n", yes_no(cur == own));
    CUdevice d;
    CHECK(cuCtxGetDevice(&d));
    printf("thread: device %d\n", d);
    use_memory("thread");
    unsigned long long id;
    CHECK(cuCtxGetId(own, &id));
    printf("thread: id differs from main thread's: %s\n", yes_no(id != main_ids[0] && id != main_ids[1]));
    CHECK(cuCtxDestroy(own));
    CHECK(cuCtxGetCurrent(&cur));
    printf("thread: no context after destroy: %s\n", yes_no(cur == nullptr));
    return nullptr;
}

int main() {
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));

    primary_state("before retain");
    CHECK(cuDevicePrimaryCtxSetFlags(dev, CU_CTX_SCHED_BLOCKING_SYNC));
    primary_state("after SetFlags");
    CUcontext primary, cur;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    primary_state("after retain");
    CHECK(cuCtxGetCurrent(&cur));
    printf("retain leaves no context current: %s\n", yes_no(cur == nullptr));
    CHECK(cuCtxSetCurrent(primary));

    unsigned flags, api;
    CHECK(cuCtxGetFlags(&flags));
    printf("primary cuCtxGetFlags: %#x\n", flags);
    CHECK(cuCtxGetApiVersion(primary, &api));
    printf("primary cuCtxGetApiVersion: %u\n", api);
    CUdevice d;
    CHECK(cuCtxGetDevice(&d));
    printf("cuCtxGetDevice: %d\n", d);
    use_memory("primary");

    // Limits: the stack size is the same default on every device.
    size_t limit;
    CHECK(cuCtxGetLimit(&limit, CU_LIMIT_STACK_SIZE));
    printf("stack size: %zu\n", limit);
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096));
    CHECK(cuCtxGetLimit(&limit, CU_LIMIT_STACK_SIZE));
    printf("stack size after set: %zu\n", limit);

    // A created context is pushed on top of the primary one.
    CUcontext created, popped;
    CHECK(cuCtxCreate(&created, nullptr, CU_CTX_SCHED_SPIN, dev));
    CHECK(cuCtxGetCurrent(&cur));
    printf("created context current: %s\n", yes_no(cur == created));
    CHECK(cuCtxGetFlags(&flags));
    printf("created cuCtxGetFlags: %#x\n", flags);
    CHECK(cuCtxGetApiVersion(created, &api));
    printf("created cuCtxGetApiVersion: %u\n", api);
    use_memory("created");
    CHECK(cuCtxGetId(primary, &main_ids[0]));
    CHECK(cuCtxGetId(created, &main_ids[1]));
    printf("context ids differ: %s\n", yes_no(main_ids[0] != main_ids[1]));

    CHECK(cuCtxPushCurrent(primary));
    CHECK(cuCtxGetCurrent(&cur));
    printf("push makes primary current: %s\n", yes_no(cur == primary));
    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuCtxGetCurrent(&cur));
    printf("pop returns primary: %s, created current again: %s\n", yes_no(popped == primary),
           yes_no(cur == created));
    CHECK(cuCtxSynchronize());

    pthread_t t;
    EXPECT(pthread_create(&t, nullptr, second_thread, nullptr) == 0, "pthread_create");
    EXPECT(pthread_join(t, nullptr) == 0, "pthread_join");
    CHECK(cuCtxGetCurrent(&cur));
    printf("main thread context unchanged: %s\n", yes_no(cur == created));

    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuCtxGetCurrent(&cur));
    printf("pop returns created: %s, primary current again: %s\n", yes_no(popped == created),
           yes_no(cur == primary));
    CHECK(cuCtxDestroy(created));
    CHECK(cuCtxGetCurrent(&cur));
    printf("destroying a non-current context keeps primary current: %s\n", yes_no(cur == primary));

    // Context-wide events, the persisting L2 lines given back, a stream's context, peers.
    CUevent all_work;
    CHECK(cuEventCreate(&all_work, 0));
    CHECK(cuCtxRecordEvent(primary, all_work));
    CHECK(cuCtxWaitEvent(primary, all_work));
    CHECK(cuEventSynchronize(all_work));
    CHECK(cuEventDestroy(all_work));
    CHECK(cuCtxResetPersistingL2Cache());
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    CUcontext of_stream = nullptr;
    CUgreenCtx green = (CUgreenCtx)1;
    CHECK(cuStreamGetCtx_v2(s, &of_stream, &green));
    printf("context-wide event recorded and waited for; a stream's context: %s, green context: %s\n",
           yes_no(of_stream == primary), green == nullptr ? "none" : "some");
    CHECK(cuStreamDestroy(s));
    int p2p = -1;
    printf("peer access to its own device's context: %s; a device's P2P attribute with itself: %s\n",
           err_name(cuCtxEnablePeerAccess(primary, 0)),
           err_name(cuDeviceGetP2PAttribute(&p2p, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, dev, dev)));

    CHECK(cuDevicePrimaryCtxRelease(dev));
    primary_state("after release");
    CHECK(cuCtxSetCurrent(nullptr));
    CHECK(cuDevicePrimaryCtxReset(dev));
    primary_state("after reset");
    printf("done\n");
    return 0;
}
