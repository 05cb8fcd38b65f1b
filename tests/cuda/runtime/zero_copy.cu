// zero_copy: mapped page-locked host memory, as in the CUDA samples'
// simpleZeroCopy. cudaSetDeviceFlags(cudaDeviceMapHost), then
// cudaHostAlloc(cudaHostAllocMapped) and cudaHostRegister(cudaHostRegisterMapped)
// of malloc'd memory, each with cudaHostGetDevicePointer: a kernel reads and
// writes host memory through the device pointers, and the host reads the
// results after cudaDeviceSynchronize, with no copy; then small pinned
// buffers through their host pointers, as unified addressing allows.
#include "check.h"

#include <cstdlib>

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

// What a host function between two kernels saw of the first's output
// (out[5]) before it wrote the second's input (in[5] = 1000).
struct HostSeen {
    const int *out;
    int *in;
    int saw;
};

static void CUDART_CB seeAndWrite(void *p) {
    HostSeen *s = (HostSeen *)p;
    s->saw = s->out[5];
    s->in[5] = 1000;
}

static const int N = 1 << 16;
static const int THREADS = 256;

// Checks out[i] == in[i] * scale + offset for i < n; prints a line with the sum.
static void check(const char *what, const int *in, const int *out, int scale, int offset, int n = N) {
    long long sum = 0;
    for (int i = 0; i < n; i++) {
        EXPECT(out[i] == in[i] * scale + offset, "%s: out[%d] = %d", what, i, out[i]);
        sum += out[i];
    }
    printf("%s: %d elements ok, sum=%lld\n", what, n, sum);
}

int main() {
    // Before anything creates the context.
    CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("canMapHostMemory: %d\n", p.canMapHostMemory);
    unsigned flags = 0; // stays 0 if nothing is written
    CHECK(cudaGetDeviceFlags(&flags));
    printf("cudaDeviceMapHost set: %s\n", yes_no(flags & cudaDeviceMapHost));

    // cudaHostAlloc'd, mapped: the kernel reads `in` and writes `out` in
    // host memory.
    size_t bytes = N * sizeof(int);
    int *in, *out, *din, *dout;
    CHECK(cudaHostAlloc(&in, bytes, cudaHostAllocMapped));
    CHECK(cudaHostAlloc(&out, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    for (int i = 0; i < N; i++) {
        in[i] = i % 777 - 300;
        out[i] = 0;
    }
    CHECK(cudaHostGetDevicePointer(&din, in, 0));
    CHECK(cudaHostGetDevicePointer(&dout, out, 0));
    scaleAdd<<<(N + THREADS - 1) / THREADS, THREADS>>>(dout, din, 3, -1, N);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    check("cudaHostAllocMapped", in, out, 3, -1);

    // malloc'd, registered mapped: written by the kernel from device memory.
    int *plain = (int *)malloc(bytes);
    EXPECT(plain != nullptr, "malloc");
    for (int i = 0; i < N; i++) plain[i] = -1;
    CHECK(cudaHostRegister(plain, bytes, cudaHostRegisterMapped));
    int *dplain, *dev;
    CHECK(cudaHostGetDevicePointer(&dplain, plain, 0));
    CHECK(cudaMalloc(&dev, bytes));
    CHECK(cudaMemcpy(dev, in, bytes, cudaMemcpyHostToDevice));
    scaleAdd<<<(N + THREADS - 1) / THREADS, THREADS>>>(dplain, dev, -2, 5, N);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    check("cudaHostRegisterMapped", in, plain, -2, 5);
    CHECK(cudaHostUnregister(plain));
    free(plain);

    // Small pinned buffers handed to a kernel as their host pointers, as
    // unified addressing allows with no cudaHostGetDevicePointer (flags and
    // counters are used so): allocated, used and freed three times, so that
    // later rounds may get the memory of earlier ones; in the last round the
    // host writes the input again after a first kernel.
    const int SMALL = 1000;
    for (int round = 0; round < 3; round++) {
        int *sin, *sout;
        CHECK(cudaMallocHost(&sin, SMALL * sizeof(int)));
        CHECK(cudaMallocHost(&sout, SMALL * sizeof(int)));
        if (round == 0) {
            cudaPointerAttributes a;
            CHECK(cudaPointerGetAttributes(&a, sin));
            printf("small: host memory: %s, its device pointer is its host pointer: %s\n",
                   yes_no(a.type == cudaMemoryTypeHost), yes_no(a.devicePointer == sin && a.hostPointer == sin));
        }
        for (int i = 0; i < SMALL; i++) sin[i] = i * (round + 1) - 500;
        scaleAdd<<<(SMALL + THREADS - 1) / THREADS, THREADS>>>(sout, sin, 7, round, SMALL);
        CHECK_LAUNCH();
        if (round == 1) {
            // A host function between two kernels, with no wait before it,
            // sees what the first wrote, and the second sees what it wrote.
            HostSeen seen = {sout, sin, 0};
            CHECK(cudaLaunchHostFunc(0, seeAndWrite, &seen));
            scaleAdd<<<(SMALL + THREADS - 1) / THREADS, THREADS>>>(sout, sin, 7, round, SMALL);
            CHECK_LAUNCH();
            CHECK(cudaDeviceSynchronize());
            printf("host function between kernels: saw the first's output: %s\n",
                   yes_no(seen.saw == (5 * 2 - 500) * 7 + 1));
        }
        CHECK(cudaDeviceSynchronize());
        if (round == 2) {
            for (int i = 0; i < SMALL; i += 2) sin[i] = -i;
            scaleAdd<<<(SMALL + THREADS - 1) / THREADS, THREADS>>>(sout, sin, 7, round, SMALL);
            CHECK_LAUNCH();
            CHECK(cudaDeviceSynchronize());
        }
        printf("round %d: ", round);
        check("small, host pointer", sin, sout, 7, round, SMALL);
        CHECK(cudaFreeHost(sin));
        CHECK(cudaFreeHost(sout));
    }

    CHECK(cudaFree(dev));
    CHECK(cudaFreeHost(in));
    CHECK(cudaFreeHost(out));
    printf("done\n");
    return 0;
}
