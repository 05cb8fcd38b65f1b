// managed: __managed__ variables, read and written by the host and by
// kernels at the synchronization points where CUDA promises each side the
// other's writes: small ones sharing a page, a large one over several pages,
// a stream of their own, copies and memsets naming them, and a host write to
// one variable while a kernel writes another. managed_alloc.cu has
// cudaMallocManaged.
#include "check.h"

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

__managed__ int managedTotal[4];
__managed__ int scalar = 7;
const int BIG = 5000;
__managed__ int big[BIG];

int main() {
    printf("first value: %d\n", scalar);
    for (int i = 0; i < 4; i++) managedTotal[i] = 10 * i;
    scaleAdd<<<1, 32>>>(managedTotal, managedTotal, 2, 1, 4);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("__managed__: %d %d %d %d\n", managedTotal[0], managedTotal[1], managedTotal[2], managedTotal[3]);

    // The host's write after a kernel reaches the next kernel.
    managedTotal[0] = 100;
    scaleAdd<<<1, 32>>>(managedTotal, managedTotal, 1, 1, 1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("host write, then a kernel: %d\n", managedTotal[0]);

    // A variable over several pages, on a stream of its own.
    for (int i = 0; i < BIG; i++) big[i] = i;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    scaleAdd<<<(BIG + 255) / 256, 256, 0, s>>>(big, big, 3, 0, BIG);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    long long sum = 0;
    bool right = true;
    for (int i = 0; i < BIG; i++) {
        sum += big[i];
        right = right && big[i] == 3 * i;
    }
    printf("large variable: every element right: %s, sum %lld\n", right ? "yes" : "no", sum);

    // The program writes one variable while a kernel writes another on the
    // same page: both writes stay.
    scaleAdd<<<1, 32, 0, s>>>(managedTotal, managedTotal, 1, 1, 4);
    CHECK_LAUNCH();
    scalar = 8;
    CHECK(cudaStreamSynchronize(s));
    printf("both writes: scalar %d, total %d %d %d %d\n", scalar, managedTotal[0], managedTotal[1], managedTotal[2],
           managedTotal[3]);

    // Copies and memsets naming the variables.
    int *d;
    CHECK(cudaMalloc(&d, sizeof managedTotal));
    CHECK(cudaMemcpy(d, managedTotal, sizeof managedTotal, cudaMemcpyHostToDevice));
    int nine = 9, back = 0;
    CHECK(cudaMemcpyToSymbol(scalar, &nine, sizeof nine));
    printf("cudaMemcpyToSymbol: the host reads %d\n", scalar);
    CHECK(cudaMemcpyFromSymbol(&back, scalar, sizeof back));
    printf("cudaMemcpyFromSymbol: %d\n", back);
    CHECK(cudaMemset(managedTotal, 0, sizeof managedTotal));
    printf("after cudaMemset: %d %d %d %d\n", managedTotal[0], managedTotal[1], managedTotal[2], managedTotal[3]);
    CHECK(cudaMemcpy(managedTotal, d, sizeof managedTotal, cudaMemcpyDeviceToHost));
    scaleAdd<<<1, 32>>>(big, managedTotal, 1, 0, 4);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("copied back, then into the large variable by a kernel: %d %d %d %d\n", big[0], big[1], big[2], big[3]);
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));

    printf("done\n");
    return 0;
}
