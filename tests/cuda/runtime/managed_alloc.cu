// managed_alloc: unified memory from cudaMallocManaged, as most programs use
// it: written by the host, read and written by kernels, read by the host
// after a synchronize; hints (prefetch, advice, stream attachment) taken;
// the pointer's attributes; copies and a memset between managed and device
// memory. (managed.cu adds a __managed__ variable, which gpuplex does not
// serve yet.)
#include "check.h"

#include <cstring>

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

static const int N = 1 << 16;
static const int THREADS = 256;
static const int BLOCKS = (N + THREADS - 1) / THREADS;

int main() {
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    int *a, *b;
    CHECK(cudaMallocManaged(&a, N * sizeof(int)));
    CHECK(cudaMallocManaged(&b, N * sizeof(int), cudaMemAttachGlobal));
    for (int i = 0; i < N; i++) a[i] = i % 500 - 250;
    scaleAdd<<<BLOCKS, THREADS>>>(b, a, 4, 3, N);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    long long sum = 0;
    for (int i = 0; i < N; i++) {
        EXPECT(b[i] == a[i] * 4 + 3, "b[%d] = %d", i, b[i]);
        sum += b[i];
    }
    printf("host writes, a kernel reads and writes, the host reads: %d elements ok, sum=%lld\n", N, sum);

    // Kernels one after another on the same memory, the host in between.
    for (int round = 0; round < 3; round++) {
        scaleAdd<<<BLOCKS, THREADS>>>(a, b, 1, round, N);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        a[round] = -round;
        scaleAdd<<<BLOCKS, THREADS>>>(b, a, 2, 0, N);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
    }
    sum = 0;
    for (int i = 0; i < N; i++) sum += b[i];
    printf("three rounds of kernels and host writes: sum=%lld, b[1]=%d\n", sum, b[1]);

    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamAttachMemAsync(s, a, 0, cudaMemAttachSingle));
    cudaMemLocation here = {cudaMemLocationTypeDevice, dev};
    CHECK(cudaMemAdvise(a, N * sizeof(int), cudaMemAdviseSetPreferredLocation, here));
    CHECK(cudaMemPrefetchAsync(a, N * sizeof(int), here, 0, s));
    scaleAdd<<<BLOCKS, THREADS, 0, s>>>(a, a, 1, 1, N);
    CHECK_LAUNCH();
    cudaMemLocation host = {cudaMemLocationTypeHost, 0};
    CHECK(cudaMemPrefetchAsync(a, N * sizeof(int), host, 0, s));
    CHECK(cudaStreamSynchronize(s));
    printf("after hints and a kernel on a stream: a[0]=%d a[%d]=%d\n", a[0], N - 1, a[N - 1]);

    // The hints, read back as the range's attributes.
    CHECK(cudaMemAdvise(a, N * sizeof(int), cudaMemAdviseSetAccessedBy, here));
    int preferred = -9, last = -9, read_mostly = -9, accessed[2] = {-9, -9};
    size_t bytes = N * sizeof(int);
    CHECK(cudaMemRangeGetAttribute(&preferred, 4, cudaMemRangeAttributePreferredLocation, a, bytes));
    CHECK(cudaMemRangeGetAttribute(&last, 4, cudaMemRangeAttributeLastPrefetchLocation, a, bytes));
    CHECK(cudaMemRangeGetAttribute(&read_mostly, 4, cudaMemRangeAttributeReadMostly, a, bytes));
    CHECK(cudaMemRangeGetAttribute(accessed, sizeof accessed, cudaMemRangeAttributeAccessedBy, a, bytes));
    printf("range attributes: preferred the device: %s, last prefetched to the host: %s, read-mostly %d, "
           "accessed by the device alone: %s\n",
           yes_no(preferred == dev), yes_no(last == cudaCpuDeviceId), read_mostly,
           yes_no(accessed[0] == dev && accessed[1] == cudaInvalidDeviceId));
    CHECK(cudaMemAdvise(a, bytes / 2, cudaMemAdviseSetReadMostly, here));
    int halves[2] = {-9, -9}, kind = -9;
    void *values[] = {&halves[0], &kind};
    size_t sizes[] = {4, 4};
    cudaMemRangeAttribute which[] = {cudaMemRangeAttributeReadMostly, cudaMemRangeAttributePreferredLocationType};
    CHECK(cudaMemRangeGetAttributes(values, sizes, which, 2, a, bytes / 2));
    CHECK(cudaMemRangeGetAttribute(&halves[1], 4, cudaMemRangeAttributeReadMostly, a, bytes));
    printf("read-mostly: the half advised %d, the whole %d; preferred location a device: %s\n", halves[0], halves[1],
           yes_no(kind == cudaMemLocationTypeDevice));

    cudaPointerAttributes attrs;
    CHECK(cudaPointerGetAttributes(&attrs, a + 10));
    printf("attributes: managed: %s, host and device pointers the pointer itself: %s\n",
           yes_no(attrs.type == cudaMemoryTypeManaged),
           yes_no(attrs.devicePointer == a + 10 && attrs.hostPointer == a + 10));

    int *d;
    CHECK(cudaMalloc(&d, N * sizeof(int)));
    CHECK(cudaMemcpy(d, a, N * sizeof(int), cudaMemcpyDefault));
    CHECK(cudaMemset(b, 0, N * sizeof(int)));
    CHECK(cudaMemcpy(b, d, N * sizeof(int), cudaMemcpyDefault));
    CHECK(cudaDeviceSynchronize());
    printf("managed to device and back through copies, a memset between: same: %s\n",
           yes_no(memcmp(a, b, N * sizeof(int)) == 0));

    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    printf("done\n");
    return 0;
}
