// managed_kernels: kernels that reach __managed__ variables by name, not
// through a pointer parameter: the driver places the variables and the
// kernels' code refers to them where it put them. Counters bumped with
// atomics from many blocks, an array scaled in place, a host write read by
// the next kernel, and the host reading a result a kernel left, each after
// the synchronization that orders it. The emulated device runs only its
// reference kernels, so in CI this program fails cleanly at its first
// launch (RUNTIME_UNSUPPORTED); the GPU suite runs it natively and through
// gpuplex.
#include "check.h"

__managed__ int counter = 0;
__managed__ float weights[256];
__managed__ unsigned long long checksum;

__global__ void bump(int by) { atomicAdd(&counter, by); }

__global__ void scale(float factor) { weights[threadIdx.x] *= factor; }

__global__ void sum_weights() {
    if (threadIdx.x == 0) {
        unsigned long long s = 0;
        for (int i = 0; i < 256; i++) s += (unsigned long long)weights[i];
        checksum = s;
    }
}

int main() {
    bump<<<4, 64>>>(1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("256 atomic bumps: %d\n", counter);

    counter = 1000;
    bump<<<1, 1>>>(5);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("host wrote 1000, a kernel added 5: %d\n", counter);

    for (int i = 0; i < 256; i++) weights[i] = (float)(4 * i);
    scale<<<1, 256>>>(0.5f);
    CHECK_LAUNCH();
    sum_weights<<<1, 32>>>();
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("weights halved, summed on the device: %llu (want %d)\n", checksum, 2 * 255 * 256 / 2);

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int round = 0; round < 100; round++) bump<<<1, 32, 0, s>>>(1);
    CHECK_LAUNCH();
    cudaEvent_t done;
    CHECK(cudaEventCreate(&done));
    CHECK(cudaEventRecord(done, s));
    CHECK(cudaEventSynchronize(done));
    printf("100 launches on a stream, after its event: %d\n", counter);
    CHECK(cudaEventDestroy(done));
    CHECK(cudaStreamDestroy(s));

    printf("done\n");
    return 0;
}
