// callbacks: host functions in stream order. cudaLaunchHostFunc and
// cudaStreamAddCallback run on a runtime thread once the work queued
// before them on their stream is complete: each one here checks that a
// result copied device-to-host into page-locked memory just before it has
// landed, and appends to a log; the log's order is the stream order.
#include "check.h"

#include <mutex>
#include <string>
#include <vector>

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

static const int N = 1 << 16;
static const int THREADS = 256;

static std::mutex log_mutex;
static std::vector<std::string> log_lines;

static void append(const std::string &line) {
    std::lock_guard<std::mutex> lock(log_mutex);
    log_lines.push_back(line);
}

// What a host function is to check: host[i] == i * scale + offset.
struct Stage {
    const char *name;
    const int *host;
    int scale, offset;
};

static std::string verify(const Stage *s) {
    int good = 0;
    for (int i = 0; i < N; i++) good += s->host[i] == i * s->scale + s->offset;
    return std::string(s->name) + ": " + std::to_string(good) + " of " + std::to_string(N) + " results in place";
}

// cudaLaunchHostFunc's signature.
static void CUDART_CB host_func(void *arg) { append("host func " + verify((const Stage *)arg)); }

// cudaStreamAddCallback's: also given the stream's status.
static void CUDART_CB stream_callback(cudaStream_t, cudaError_t status, void *arg) {
    append("stream callback (status " + std::string(cudaGetErrorName(status)) + ") " + verify((const Stage *)arg));
}

static void CUDART_CB mark(void *arg) { append((const char *)arg); }

int main() {
    size_t bytes = N * sizeof(int);
    int *iota, *first, *second;
    CHECK(cudaMallocHost(&iota, bytes));
    CHECK(cudaMallocHost(&first, bytes));
    CHECK(cudaHostAlloc(&second, bytes, cudaHostAllocDefault));
    for (int i = 0; i < N; i++) {
        iota[i] = i;
        first[i] = second[i] = -1;
    }
    int *din, *dout;
    CHECK(cudaMalloc(&din, bytes));
    CHECK(cudaMalloc(&dout, bytes));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    int blocks = (N + THREADS - 1) / THREADS;

    Stage one = {"stage 1", first, 5, -3};
    Stage two = {"stage 2", second, -4, 11};
    static const char begin[] = "host func: queued first";
    static const char end[] = "host func: queued last";

    CHECK(cudaLaunchHostFunc(stream, mark, (void *)begin));
    CHECK(cudaMemcpyAsync(din, iota, bytes, cudaMemcpyHostToDevice, stream));
    scaleAdd<<<blocks, THREADS, 0, stream>>>(dout, din, one.scale, one.offset, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(first, dout, bytes, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaLaunchHostFunc(stream, host_func, &one));
    scaleAdd<<<blocks, THREADS, 0, stream>>>(dout, din, two.scale, two.offset, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(second, dout, bytes, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamAddCallback(stream, stream_callback, &two, 0));
    CHECK(cudaLaunchHostFunc(stream, mark, (void *)end));
    CHECK(cudaStreamSynchronize(stream));

    // A host function on the legacy default stream, after a kernel there.
    static const char legacy[] = "host func: legacy stream";
    scaleAdd<<<blocks, THREADS>>>(dout, din, 1, 0, N);
    CHECK_LAUNCH();
    CHECK(cudaLaunchHostFunc(0, mark, (void *)legacy));
    CHECK(cudaDeviceSynchronize());

    std::lock_guard<std::mutex> lock(log_mutex);
    for (size_t i = 0; i < log_lines.size(); i++) printf("log %zu: %s\n", i, log_lines[i].c_str());

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
    CHECK(cudaFreeHost(iota));
    CHECK(cudaFreeHost(first));
    CHECK(cudaFreeHost(second));
    printf("done\n");
    return 0;
}
