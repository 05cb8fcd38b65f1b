// streams_overlap: as the CUDA samples' simpleStreams and asyncAPI, work
// split over several streams so that copies and kernels may overlap:
// cudaMemcpyAsync from and to page-locked memory (cudaMallocHost, and
// cudaHostAlloc with cudaHostAllocDefault and cudaHostAllocPortable),
// kernels on each stream, cudaStreamSynchronize, cudaStreamQuery after it,
// cudaFreeHost.
#include "check.h"

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

static const int STREAMS = 4;
static const int CHUNK = 1 << 16; // elements per stream
static const int N = STREAMS * CHUNK;
static const int THREADS = 256;

// Checks out[] against in[] for the scales and offsets of each stream's
// chunk; prints one line per stream with the chunk's sum.
static void check(const char *round, const int *in, const int *out, const int *scale, const int *offset) {
    for (int s = 0; s < STREAMS; s++) {
        long long sum = 0;
        for (int i = s * CHUNK; i < (s + 1) * CHUNK; i++) {
            int want = in[i] * scale[s] + offset[s];
            EXPECT(out[i] == want, "%s: out[%d] = %d, want %d", round, i, out[i], want);
            sum += out[i];
        }
        printf("%s: stream %d: %d elements ok, sum=%lld\n", round, s, CHUNK, sum);
    }
}

int main() {
    int *in, *out, *out2;
    size_t bytes = N * sizeof(int);
    CHECK(cudaMallocHost(&in, bytes));
    CHECK(cudaHostAlloc(&out, bytes, cudaHostAllocDefault));
    CHECK(cudaHostAlloc(&out2, bytes, cudaHostAllocPortable));
    for (int i = 0; i < N; i++) {
        in[i] = (i * 7) % 1001 - 500;
        out[i] = out2[i] = -1;
    }
    int *din, *dout;
    CHECK(cudaMalloc(&din, bytes));
    CHECK(cudaMalloc(&dout, bytes));
    cudaStream_t streams[STREAMS];
    for (int s = 0; s < STREAMS; s++) CHECK(cudaStreamCreate(&streams[s]));
    int blocks = (CHUNK + THREADS - 1) / THREADS;

    // Round 1, depth first: each stream copies in, computes and copies out
    // its own chunk, into cudaHostAllocDefault memory.
    int scale[STREAMS], offset[STREAMS];
    for (int s = 0; s < STREAMS; s++) {
        scale[s] = s + 2;
        offset[s] = 1000 * s;
        size_t at = (size_t)s * CHUNK;
        CHECK(cudaMemcpyAsync(din + at, in + at, CHUNK * sizeof(int), cudaMemcpyHostToDevice, streams[s]));
        scaleAdd<<<blocks, THREADS, 0, streams[s]>>>(dout + at, din + at, scale[s], offset[s], CHUNK);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(out + at, dout + at, CHUNK * sizeof(int), cudaMemcpyDeviceToHost, streams[s]));
    }
    for (int s = 0; s < STREAMS; s++) {
        CHECK(cudaStreamSynchronize(streams[s]));
        printf("cudaStreamQuery(stream %d) after cudaStreamSynchronize: %s\n", s,
               cudaGetErrorName(cudaStreamQuery(streams[s])));
    }
    check("depth-first", in, out, scale, offset);

    // Round 2, breadth first: all copies in, then all kernels, then all
    // copies out, into cudaHostAllocPortable memory; one device-wide wait.
    for (int s = 0; s < STREAMS; s++) {
        scale[s] = -3 * s - 1;
        offset[s] = 7 - s;
        size_t at = (size_t)s * CHUNK;
        CHECK(cudaMemcpyAsync(din + at, in + at, CHUNK * sizeof(int), cudaMemcpyHostToDevice, streams[s]));
    }
    for (int s = 0; s < STREAMS; s++) {
        size_t at = (size_t)s * CHUNK;
        scaleAdd<<<blocks, THREADS, 0, streams[s]>>>(dout + at, din + at, scale[s], offset[s], CHUNK);
        CHECK_LAUNCH();
    }
    for (int s = 0; s < STREAMS; s++) {
        size_t at = (size_t)s * CHUNK;
        CHECK(cudaMemcpyAsync(out2 + at, dout + at, CHUNK * sizeof(int), cudaMemcpyDeviceToHost, streams[s]));
    }
    CHECK(cudaDeviceSynchronize());
    for (int s = 0; s < STREAMS; s++)
        printf("cudaStreamQuery(stream %d) after cudaDeviceSynchronize: %s\n", s,
               cudaGetErrorName(cudaStreamQuery(streams[s])));
    check("breadth-first", in, out2, scale, offset);

    for (int s = 0; s < STREAMS; s++) CHECK(cudaStreamDestroy(streams[s]));
    CHECK(cudaFree(din));
    CHECK(cudaFree(dout));
    CHECK(cudaFreeHost(in));
    CHECK(cudaFreeHost(out));
    CHECK(cudaFreeHost(out2));
    printf("done\n");
    return 0;
}
