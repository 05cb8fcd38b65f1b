// multithreaded: one process, four host threads sharing the device's
// primary context, each with its own stream and buffers, copying and
// launching at the same time; main joins them and checks every result.
// One thread also calls cudaSetDevice(0) and cudaGetDevice.
#include "check.h"

#include <thread>
#include <vector>

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

static const int THREADS = 4;
static const int ROUNDS = 8;
static const int N = 1 << 17;
static const int BLOCK = 256;

struct Result {
    int device = -1;    // from cudaGetDevice, thread 0 only
    int wrong = -1;     // elements that differ from the CPU
    long long sum = 0;  // of the last round's output
};

// Thread t: ROUNDS rounds of copy in, two kernels, copy out, on its own
// stream; round r computes (x * (t + 2) + r) * -1 + t.
static void worker(int t, Result *res) {
    if (t == 0) {
        CHECK(cudaSetDevice(0));
        CHECK(cudaGetDevice(&res->device));
    }
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    size_t bytes = N * sizeof(int);
    int *host, *dx, *dy;
    CHECK(cudaMallocHost(&host, bytes));
    CHECK(cudaMalloc(&dx, bytes));
    CHECK(cudaMalloc(&dy, bytes));
    res->wrong = 0;
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < N; i++) host[i] = (i + 1000 * t + r) % 2003 - 1000;
        CHECK(cudaMemcpyAsync(dx, host, bytes, cudaMemcpyHostToDevice, stream));
        scaleAdd<<<(N + BLOCK - 1) / BLOCK, BLOCK, 0, stream>>>(dy, dx, t + 2, r, N);
        CHECK_LAUNCH();
        scaleAdd<<<(N + BLOCK - 1) / BLOCK, BLOCK, 0, stream>>>(dx, dy, -1, t, N);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(host, dx, bytes, cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        res->sum = 0;
        for (int i = 0; i < N; i++) {
            int x = (i + 1000 * t + r) % 2003 - 1000;
            res->wrong += host[i] != -(x * (t + 2) + r) + t;
            res->sum += host[i];
        }
    }
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFreeHost(host));
}

int main() {
    // Initialize in the main thread first, as most programs do.
    CHECK(cudaFree(0));
    std::vector<Result> results(THREADS);
    std::vector<std::thread> threads;
    for (int t = 0; t < THREADS; t++) threads.emplace_back(worker, t, &results[t]);
    for (auto &th : threads) th.join();
    for (int t = 0; t < THREADS; t++) {
        EXPECT(results[t].wrong == 0, "thread %d: %d wrong", t, results[t].wrong);
        printf("thread %d: %d rounds of %d elements ok, last sum=%lld\n", t, ROUNDS, N, results[t].sum);
    }
    printf("thread 0: cudaGetDevice after cudaSetDevice(0): %d\n", results[0].device);
    int device = -1;
    CHECK(cudaGetDevice(&device));
    printf("main: cudaGetDevice: %d\n", device);
    CHECK(cudaDeviceSynchronize());
    printf("done\n");
    return 0;
}
