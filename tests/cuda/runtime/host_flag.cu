// host_flag: a kernel that holds its stream until the host sets a flag in
// mapped pinned memory, as XLA's GPU timer does to queue the work it times
// behind it. The host queues work after the waiting kernel, sees that none
// of it ran, sets the flag, and waits: the work runs, and the kernel did not
// give up waiting (it would write TIMED_OUT into the flag after 5 s). Then a
// host function queued behind the waiting kernel: cudaLaunchHostFunc returns
// at once, and the function runs when the stream gets to it.
#include "check.h"

enum { HOLD = 0, RELEASE = 1, TIMED_OUT = 2 };

__global__ void waitForHost(volatile int *flag, long long timeout_cycles) {
    long long start = clock64();
    while (*flag != RELEASE) {
        if (clock64() - start > timeout_cycles) {
            *flag = TIMED_OUT;
            return;
        }
    }
}

static void CUDART_CB markRan(void *ran) { *(volatile int *)ran = 1; }

__global__ void fill(int *out, int n, int value) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value + i;
}

static const int N = 1 << 20;
static const int THREADS = 256;

int main() {
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    long long timeout = 5000LL * clock_khz; // 5 s of cycles

    // The kernel gets the host pointer itself, as XLA's does: under unified
    // addressing pinned memory has one address for host and device.
    int *flag, *dev;
    CHECK(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocPortable));
    CHECK(cudaMalloc(&dev, N * sizeof(int)));
    int *host = (int *)malloc(N * sizeof(int));
    EXPECT(host != nullptr, "malloc");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));

    for (int round = 0; round < 5; round++) {
        *flag = HOLD;
        waitForHost<<<1, 1, 0, s>>>(flag, timeout);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(start, s));
        fill<<<(N + THREADS - 1) / THREADS, THREADS, 0, s>>>(dev, N, round * 1000);
        CHECK_LAUNCH();
        CHECK(cudaEventRecord(stop, s));
        cudaError_t held = cudaEventQuery(stop);
        EXPECT(held == cudaErrorNotReady, "round %d: the work ran before the flag was set (%s)", round,
               cudaGetErrorName(held));
        *flag = RELEASE;
        CHECK(cudaEventSynchronize(stop));
        EXPECT(*flag == RELEASE, "round %d: the kernel never saw the flag (flag %d)", round, *flag);
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        EXPECT(ms >= 0, "round %d: elapsed %f ms", round, ms);
        CHECK(cudaMemcpy(host, dev, N * sizeof(int), cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++) EXPECT(host[i] == round * 1000 + i, "round %d: host[%d] = %d", round, i, host[i]);
        printf("round %d: held until the flag, then %d elements ok\n", round, N);
    }

    static volatile int ran = 0;
    *flag = HOLD;
    waitForHost<<<1, 1, 0, s>>>(flag, timeout);
    CHECK_LAUNCH();
    CHECK(cudaLaunchHostFunc(s, markRan, (void *)&ran));
    EXPECT(ran == 0, "the host function ran before the stream got to it");
    *flag = RELEASE;
    CHECK(cudaStreamSynchronize(s));
    EXPECT(ran == 1, "the host function did not run");
    EXPECT(*flag == RELEASE, "the kernel never saw the flag (flag %d)", *flag);
    printf("host function: ran when the stream got to it\n");

    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(dev));
    CHECK(cudaFreeHost(flag));
    free(host);
    printf("done\n");
    return 0;
}
