// Fixture source for the emulated backend's image parser tests.
struct Triple {
    double a, b, c; // 24 bytes, 8-byte aligned
};

__device__ int table[4] = {1, 2, 3, 4};
__device__ float buf[16];
__device__ unsigned long long answer = 0x1122334455667788ULL;
__constant__ int coeffs[8] = {10, 20, 30, 40, 50, 60, 70, 80};

extern "C" __global__ void mixed(char c, short s, int i, double d, Triple t, float *out)
{
    out[threadIdx.x] = c + s + i + d + t.a + t.b + t.c + table[threadIdx.x & 3] + coeffs[threadIdx.x & 7];
    buf[threadIdx.x & 15] = d;
}

template <typename T>
__global__ void scale(T *data, T factor, unsigned n)
{
    unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) data[k] *= factor;
}
template __global__ void scale<float>(float *, float, unsigned);

extern "C" __global__ void __launch_bounds__(256) reduce(const float *in, float *out)
{
    __shared__ float tile[256];
    tile[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
    __syncthreads();
    for (unsigned s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) tile[threadIdx.x] += tile[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = tile[0];
}
