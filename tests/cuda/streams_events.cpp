// streams_events: streams of each kind and priority, work on each, events
// joining them into one stream, queries where their answer is determined,
// timing events and their errors.
#include "common.h"

EMBED(streams_events_fatbin, "streams_events.fatbin");

static const unsigned THREADS = 4;      // per spin launch
static const unsigned ITERS = 2000000;  // a few milliseconds on a GPU

// What `spin` stores for thread i.
static unsigned spin_value(unsigned seed, unsigned i) {
    unsigned x = seed + i;
    for (unsigned k = 0; k < ITERS; k++) x = x * 1664525u + 1013904223u;
    return x;
}

static void launch_spin(CUfunction spin, CUdeviceptr out, unsigned seed, CUstream s) {
    unsigned iters = ITERS;
    void *params[] = {&out, &seed, &iters};
    CHECK(cuLaunchKernel(spin, 1, 1, 1, THREADS, 1, 1, 0, s, params, nullptr));
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    CUmodule mod;
    CUfunction spin;
    CHECK(cuModuleLoadData(&mod, streams_events_fatbin));
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));

    int least, greatest;
    CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
    printf("priority range: least >= greatest: %s\n", yes_no(least >= greatest));

    // Streams: flags, and priorities as given or clamped into the range.
    const int NS = 5;
    const char *names[NS] = {"default", "non-blocking", "high", "low", "clamped"};
    CUstream s[NS];
    CHECK(cuStreamCreate(&s[0], CU_STREAM_DEFAULT));
    CHECK(cuStreamCreate(&s[1], CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreateWithPriority(&s[2], CU_STREAM_NON_BLOCKING, greatest));
    CHECK(cuStreamCreateWithPriority(&s[3], CU_STREAM_DEFAULT, least));
    CHECK(cuStreamCreateWithPriority(&s[4], CU_STREAM_DEFAULT, greatest - 100));
    const int want_priority[NS] = {least, least, greatest, least, greatest};
    for (int i = 0; i < NS; i++) {
        unsigned flags;
        int priority;
        CHECK(cuStreamGetFlags(s[i], &flags));
        CHECK(cuStreamGetPriority(s[i], &priority));
        printf("stream %s: flags=%u priority as expected: %s\n", names[i], flags,
               yes_no(priority == want_priority[i]));
    }

    // A spin on every stream, each followed by an event; a join stream waits
    // for all the events, then copies every result.
    CUdeviceptr out, joined;
    size_t bytes = NS * THREADS * sizeof(unsigned);
    CHECK(cuMemAlloc(&out, bytes));
    CHECK(cuMemAlloc(&joined, bytes));
    CHECK(cuMemsetD8(joined, 0, bytes));
    CHECK(cuCtxSynchronize()); // the join stream does not wait for the legacy stream
    CUevent ev[NS], done;
    CUstream join;
    CHECK(cuStreamCreate(&join, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < NS; i++) {
        CHECK(cuEventCreate(&ev[i], CU_EVENT_DEFAULT));
        launch_spin(spin, out + i * THREADS * sizeof(unsigned), 1000 * i, s[i]);
        CHECK(cuEventRecord(ev[i], s[i]));
        CHECK(cuStreamWaitEvent(join, ev[i], 0));
    }
    CHECK(cuEventCreate(&done, CU_EVENT_BLOCKING_SYNC));
    CHECK(cuMemcpyDtoDAsync(joined, out, bytes, join));
    CHECK(cuEventRecord(done, join));
    CHECK(cuEventSynchronize(done));
    printf("cuEventQuery after cuEventSynchronize: %s\n", err_name(cuEventQuery(done)));
    unsigned got[NS * THREADS];
    CHECK(cuMemcpyDtoH(got, joined, bytes));
    for (int i = 0; i < NS; i++) {
        for (unsigned t = 0; t < THREADS; t++)
            EXPECT(got[i * THREADS + t] == spin_value(1000 * i, t), "stream %d thread %u", i, t);
        printf("stream %s results: %08x %08x %08x %08x\n", names[i], got[i * THREADS],
               got[i * THREADS + 1], got[i * THREADS + 2], got[i * THREADS + 3]);
    }
    for (int i = 0; i < NS; i++) {
        CHECK(cuStreamSynchronize(s[i]));
        printf("cuStreamQuery %s after synchronize: %s\n", names[i], err_name(cuStreamQuery(s[i])));
    }

    // The NULL stream waits for an event too.
    CHECK(cuEventRecord(ev[0], s[2]));
    CHECK(cuStreamWaitEvent(nullptr, ev[0], 0));
    launch_spin(spin, out, 7, nullptr);
    CHECK(cuStreamSynchronize(nullptr));
    CHECK(cuMemcpyDtoH(got, out, THREADS * sizeof(unsigned)));
    EXPECT(got[0] == spin_value(7, 0), "null stream spin");
    printf("null stream result: %08x\n", got[0]);

    // Timing: elapsed time is only checked for sign.
    CUevent start, stop, untimed, never;
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&never, CU_EVENT_DEFAULT));
    CHECK(cuEventRecord(start, s[2]));
    CHECK(cuEventRecord(untimed, s[2]));
    launch_spin(spin, out, 11, s[2]);
    CHECK(cuEventRecord(stop, s[2]));
    CHECK(cuEventSynchronize(stop));
    float ms = -1;
    CHECK(cuEventElapsedTime(&ms, start, stop));
    printf("elapsed >= 0: %s\n", yes_no(ms >= 0));
    printf("elapsed with a DISABLE_TIMING event: %s\n", err_name(cuEventElapsedTime(&ms, untimed, stop)));
    printf("cuEventQuery on a never-recorded event: %s\n", err_name(cuEventQuery(never)));
    printf("cuEventSynchronize on a never-recorded event: %s\n", err_name(cuEventSynchronize(never)));

    // Stream memory operations: writes, waits they meet, and a wait on one
    // stream for a write another stream makes after a kernel, which orders
    // a copy of the kernel's result after the kernel.
    CUdeviceptr flag;
    CHECK(cuMemAlloc(&flag, 16));
    CHECK(cuMemsetD8(flag, 0, 16));
    CHECK(cuStreamWriteValue32(s[1], flag, 7, 0));
    CHECK(cuStreamWaitValue32(s[1], flag, 7, CU_STREAM_WAIT_VALUE_EQ));
    CHECK(cuStreamWriteValue64(s[1], flag + 8, 0x123456789abcULL, 0));
    CHECK(cuStreamWaitValue64(s[1], flag + 8, 0x100, CU_STREAM_WAIT_VALUE_GEQ));
    CHECK(cuStreamWaitValue32(s[1], flag, 1, CU_STREAM_WAIT_VALUE_AND));
    CHECK(cuStreamSynchronize(s[1]));
    unsigned long long words[2];
    CHECK(cuMemcpyDtoH(words, flag, sizeof words));
    printf("stream writes: %llu %#llx\n", words[0], words[1]);
    CHECK(cuMemsetD32(out, 0, THREADS));
    launch_spin(spin, out, 21, s[2]);
    CHECK(cuStreamWriteValue32(s[2], flag, 8, 0));
    CHECK(cuStreamWaitValue32(s[3], flag, 8, CU_STREAM_WAIT_VALUE_EQ));
    unsigned first = 0;
    CHECK(cuMemcpyDtoHAsync(&first, out, sizeof first, s[3]));
    CHECK(cuStreamSynchronize(s[3]));
    printf("a wait orders another stream after the write: %s\n", yes_no(first == spin_value(21, 0)));
    CUstreamBatchMemOpParams ops[2] = {};
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[0].writeValue.address = flag;
    ops[0].writeValue.value = 9;
    ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[1].waitValue.address = flag;
    ops[1].waitValue.value = 9;
    ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    CHECK(cuStreamBatchMemOp(s[1], 2, ops, 0));
    CHECK(cuStreamSynchronize(s[1]));
    unsigned batched = 0;
    CHECK(cuMemcpyDtoH(&batched, flag, sizeof batched));
    printf("a batch of a write and a wait: %u\n", batched);
    CHECK(cuMemFree(flag));

    // Attributes copied from one stream to another.
    CUstreamAttrValue policy = {};
    policy.syncPolicy = CU_SYNC_POLICY_YIELD;
    CHECK(cuStreamSetAttribute(s[1], CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &policy));
    CHECK(cuStreamCopyAttributes(s[3], s[1]));
    CUstreamAttrValue copied = {};
    CHECK(cuStreamGetAttribute(s[3], CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &copied));
    printf("a stream's attributes copied to another: %s\n", yes_no(copied.syncPolicy == CU_SYNC_POLICY_YIELD));

    // Nothing captures here: every stream says so, and a thread's capture
    // mode is exchanged as given.
    CUstreamCaptureStatus capturing;
    CHECK(cuStreamIsCapturing(s[1], &capturing));
    printf("cuStreamIsCapturing non-blocking: %d\n", (int)capturing);
    CHECK(cuStreamIsCapturing(nullptr, &capturing));
    printf("cuStreamIsCapturing null stream: %d\n", (int)capturing);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    printf("capture mode was %d\n", (int)mode);
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    printf("capture mode was %d\n", (int)mode);

    CUevent others[] = {start, stop, untimed, never, done};
    for (CUevent e : others) CHECK(cuEventDestroy(e));
    for (int i = 0; i < NS; i++) {
        CHECK(cuEventDestroy(ev[i]));
        CHECK(cuStreamDestroy(s[i]));
    }
    CHECK(cuStreamDestroy(join));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemFree(out));
    CHECK(cuMemFree(joined));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
