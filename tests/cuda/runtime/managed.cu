// managed: a __managed__ variable, written by the host, then by a kernel,
// then read by the host after cudaDeviceSynchronize. gpuplex does not serve
// __managed__ variables yet, so the kernels of this program's module are
// refused: the program is in the GPU suite (native against gpuplex) but not
// in expected/, and CI checks it fails cleanly. managed_alloc.cu has
// cudaMallocManaged.
#include "check.h"

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

__managed__ int managedTotal[4];

int main() {
    for (int i = 0; i < 4; i++) managedTotal[i] = 10 * i;
    scaleAdd<<<1, 32>>>(managedTotal, managedTotal, 2, 1, 4);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("__managed__: %d %d %d %d\n", managedTotal[0], managedTotal[1], managedTotal[2], managedTotal[3]);

    printf("done\n");
    return 0;
}
