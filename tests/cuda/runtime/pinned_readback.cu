// pinned_readback: asynchronous device-to-host copies into page-locked
// memory, read back at every point where a program may look: after a
// stream or event synchronization, in a host function after the copy (on
// its stream, and on another stream ordered after it by an event), by a
// copy from that memory back to the device in stream order (1D and 2D), by
// a kernel reading mapped memory through its device pointer after a copy
// into it, many small copies before one synchronization, and a graph's copy
// from it. Last, memory freed while a copy into it was queued, and new
// memory in its place.
#include "check.h"

#include <cstring>

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

static const int N = 4096;  // 16 KiB of ints: more than a small allocation
static const int THREADS = 256;
static const int BLOCKS = (N + THREADS - 1) / THREADS;

// How many of host[i] == i * scale + offset.
static int matching(const int *host, int n, int scale, int offset) {
    int good = 0;
    for (int i = 0; i < n; i++) good += host[i] == i * scale + offset;
    return good;
}

struct Seen {
    const int *host;
    int scale, offset, good;
};

static void CUDART_CB look(void *arg) {
    Seen *s = (Seen *)arg;
    s->good = matching(s->host, N, s->scale, s->offset);
}

int main() {
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    int *seq, *dev, *back;
    CHECK(cudaMalloc(&seq, N * sizeof(int)));
    CHECK(cudaMalloc(&dev, N * sizeof(int)));
    CHECK(cudaMalloc(&back, N * sizeof(int)));
    int *pinned;
    CHECK(cudaMallocHost(&pinned, N * sizeof(int)));
    int *ramp = (int *)malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) ramp[i] = i;
    CHECK(cudaMemcpy(seq, ramp, N * sizeof(int), cudaMemcpyHostToDevice));

    // 1. After the stream's synchronization.
    scaleAdd<<<BLOCKS, THREADS, 0, s1>>>(dev, seq, 2, 1, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, dev, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    printf("stream synchronize: %d of %d\n", matching(pinned, N, 2, 1), N);

    // 2. After an event's.
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    scaleAdd<<<BLOCKS, THREADS, 0, s1>>>(dev, seq, 3, 2, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, dev, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaEventRecord(done, s1));
    CHECK(cudaEventSynchronize(done));
    printf("event synchronize: %d of %d\n", matching(pinned, N, 3, 2), N);

    // 3. In a host function after it on its stream, and in one on another
    // stream that waits for an event recorded after it.
    Seen same = {pinned, 4, 3, -1}, other = {pinned, 4, 3, -1};
    scaleAdd<<<BLOCKS, THREADS, 0, s1>>>(dev, seq, 4, 3, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, dev, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaLaunchHostFunc(s1, look, &same));
    CHECK(cudaEventRecord(done, s1));
    CHECK(cudaStreamWaitEvent(s2, done, 0));
    CHECK(cudaLaunchHostFunc(s2, look, &other));
    CHECK(cudaDeviceSynchronize());
    printf("host function, same stream: %d of %d\n", same.good, N);
    printf("host function, stream after an event: %d of %d\n", other.good, N);

    // 4. Back to the device from the same memory, in stream order: the
    // copy up reads what the copy down wrote.
    scaleAdd<<<BLOCKS, THREADS, 0, s1>>>(dev, seq, 5, 4, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, dev, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaMemcpyAsync(back, pinned, N * sizeof(int), cudaMemcpyHostToDevice, s1));
    int *check = (int *)malloc(N * sizeof(int));
    CHECK(cudaMemcpyAsync(check, back, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    printf("through host memory and back: %d of %d\n", matching(check, N, 5, 4), N);
    // The same as a 2D copy: 64 rows of 64 ints.
    scaleAdd<<<BLOCKS, THREADS, 0, s1>>>(dev, seq, 6, 5, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, dev, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    size_t row = 64 * sizeof(int);
    CHECK(cudaMemcpy2DAsync(back, row, pinned, row, row, 64, cudaMemcpyHostToDevice, s1));
    CHECK(cudaMemcpyAsync(check, back, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    printf("through host memory and back, 2D: %d of %d\n", matching(check, N, 6, 5), N);

    // 5. Many small copies, one synchronization.
    for (int i = 0; i < N; i += 4) {
        CHECK(cudaMemcpyAsync(pinned + i, seq + (N - 4 - i), 4 * sizeof(int), cudaMemcpyDeviceToHost, s2));
    }
    CHECK(cudaStreamSynchronize(s2));
    int reversed_blocks = 0;
    for (int i = 0; i < N; i += 4) reversed_blocks += pinned[i] == N - 4 - i && pinned[i + 3] == N - 1 - i;
    printf("%d small copies: %d in place\n", N / 4, reversed_blocks);

    // 6. Mapped memory, read by a kernel through its device pointer after a
    // copy into it on the same stream.
    int *mapped, *mapped_dev;
    CHECK(cudaHostAlloc(&mapped, 64 * sizeof(int), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer(&mapped_dev, mapped, 0));
    memset(mapped, 0, 64 * sizeof(int));
    CHECK(cudaMemcpyAsync(mapped, seq, 64 * sizeof(int), cudaMemcpyDeviceToHost, s1));
    scaleAdd<<<1, 64, 0, s1>>>(back, mapped_dev, 7, 6, 64);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(check, back, 64 * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    printf("mapped, copied into then read by a kernel: %d of 64; on the host %d of 64\n",
           matching(check, 64, 7, 6), matching(mapped, 64, 1, 0));

    // 7. A graph whose copy reads that memory, launched after a copy into it.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyAsync(back, pinned, N * sizeof(int), cudaMemcpyHostToDevice, s1));
    CHECK(cudaStreamEndCapture(s1, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    scaleAdd<<<BLOCKS, THREADS, 0, s1>>>(dev, seq, 9, 8, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, dev, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaGraphLaunch(exec, s1));
    CHECK(cudaMemcpyAsync(check, back, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamSynchronize(s1));
    printf("a graph's copy from that memory: %d of %d\n", matching(check, N, 9, 8), N);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // 8. Freed with a copy into it queued; new memory of the same size
    // (often the same place) keeps what the program wrote there.
    scaleAdd<<<BLOCKS, THREADS, 0, s1>>>(dev, seq, 8, 7, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(pinned, dev, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaMallocHost(&pinned, N * sizeof(int)));
    memset(pinned, 0x5a, N * sizeof(int));
    CHECK(cudaDeviceSynchronize());
    int kept = 0;
    for (int i = 0; i < N; i++) kept += pinned[i] == 0x5a5a5a5a;
    printf("new memory after a free: %d of %d as written\n", kept, N);

    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFreeHost(mapped));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaFree(seq));
    CHECK(cudaFree(dev));
    CHECK(cudaFree(back));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    free(ramp);
    free(check);
    printf("done\n");
    return 0;
}
