// A kernel that takes measurable time: each thread steps a 32-bit LCG
// `iters` times from `seed + thread index` and stores the result.
// Reference: kernels.rs `spin`.
extern "C" __global__ void spin(unsigned int *out, unsigned int seed, unsigned int iters) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int x = seed + i;
    for (unsigned int k = 0; k < iters; k++) x = x * 1664525u + 1013904223u;
    out[i] = x;
}
