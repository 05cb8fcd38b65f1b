// async_events: events as the runtime exposes them. cudaEventCreate,
// cudaEventCreateWithFlags(cudaEventDisableTiming), cudaEventRecord on
// streams, cudaStreamWaitEvent joining two streams, cudaEventSynchronize
// then cudaEventQuery, cudaEventElapsedTime (and its error on an event
// without timing), cudaEventDestroy.
#include "check.h"

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

static const int N = 1 << 18;
static const int THREADS = 256;

int main() {
    size_t bytes = N * sizeof(int);
    int *host;
    CHECK(cudaMallocHost(&host, bytes));
    for (int i = 0; i < N; i++) host[i] = i % 4099 - 2000;
    int *dx, *dy, *dz;
    CHECK(cudaMalloc(&dx, bytes));
    CHECK(cudaMalloc(&dy, bytes));
    CHECK(cudaMalloc(&dz, bytes));

    cudaEvent_t start, stop, produced, never;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&never, cudaEventDisableTiming));
    cudaStream_t producer, consumer;
    CHECK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
    int blocks = (N + THREADS - 1) / THREADS;

    // The producer copies x in and makes y = 3x + 1; the consumer waits for
    // that through an event, makes z = -2y + 5 and copies z out. Timing
    // runs from the producer's start to the consumer's end.
    CHECK(cudaEventRecord(start, producer));
    CHECK(cudaMemcpyAsync(dx, host, bytes, cudaMemcpyHostToDevice, producer));
    scaleAdd<<<blocks, THREADS, 0, producer>>>(dy, dx, 3, 1, N);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(produced, producer));
    CHECK(cudaStreamWaitEvent(consumer, produced, 0));
    scaleAdd<<<blocks, THREADS, 0, consumer>>>(dz, dy, -2, 5, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(host, dz, bytes, cudaMemcpyDeviceToHost, consumer));
    CHECK(cudaEventRecord(stop, consumer));

    CHECK(cudaEventSynchronize(stop));
    printf("cudaEventQuery(stop) after cudaEventSynchronize: %s\n", cudaGetErrorName(cudaEventQuery(stop)));
    CHECK(cudaEventSynchronize(produced));
    printf("cudaEventQuery(produced) after cudaEventSynchronize: %s\n",
           cudaGetErrorName(cudaEventQuery(produced)));
    long long sum = 0;
    for (int i = 0; i < N; i++) {
        int x = i % 4099 - 2000;
        int want = -2 * (3 * x + 1) + 5;
        EXPECT(host[i] == want, "z[%d] = %d, want %d", i, host[i], want);
        sum += host[i];
    }
    printf("joined streams: %d elements ok, sum=%lld\n", N, sum);

    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    printf("cudaEventElapsedTime(start, stop) >= 0: %s\n", yes_no(ms >= 0.0f));
    printf("cudaEventElapsedTime with a cudaEventDisableTiming event: %s\n",
           cudaGetErrorName(cudaEventElapsedTime(&ms, start, produced)));
    // A failed call is also the thread's last error, until it is read.
    printf("then cudaGetLastError: %s\n", cudaGetErrorName(cudaGetLastError()));
    printf("cudaEventQuery on a never-recorded event: %s\n", cudaGetErrorName(cudaEventQuery(never)));

    // An event recorded on the legacy default stream, after work there.
    cudaEvent_t legacy;
    CHECK(cudaEventCreate(&legacy));
    scaleAdd<<<blocks, THREADS>>>(dx, dz, 1, -5, N);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(legacy, 0));
    CHECK(cudaEventSynchronize(legacy));
    printf("cudaEventQuery(legacy) after cudaEventSynchronize: %s\n", cudaGetErrorName(cudaEventQuery(legacy)));
    CHECK(cudaMemcpy(host, dx, bytes, cudaMemcpyDeviceToHost));
    EXPECT(host[12345] == -2 * (3 * (12345 % 4099 - 2000) + 1), "x'[12345] = %d", host[12345]);
    printf("legacy stream result ok\n");

    // Re-recording an event moves it; elapsed time between the two records.
    CHECK(cudaEventRecord(start, consumer));
    scaleAdd<<<blocks, THREADS, 0, consumer>>>(dy, dx, 1, 0, N);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(stop, consumer));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    printf("re-recorded: elapsed >= 0: %s\n", yes_no(ms >= 0.0f));

    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaEventDestroy(produced));
    CHECK(cudaEventDestroy(never));
    CHECK(cudaEventDestroy(legacy));
    CHECK(cudaStreamDestroy(producer));
    CHECK(cudaStreamDestroy(consumer));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(dz));
    CHECK(cudaFreeHost(host));
    printf("done\n");
    return 0;
}
