// Each block stages `words` ints of its segment in dynamic shared memory and
// writes them back reversed: out[b*words + j] = in[b*words + words-1-j].
// Reference: kernels.rs `shared_reverse`.
extern "C" __global__ void shared_reverse(const int *in, int *out, int words) {
    extern __shared__ int stage[];
    const int *src = in + (size_t)blockIdx.x * words;
    int *dst = out + (size_t)blockIdx.x * words;
    for (int j = threadIdx.x; j < words; j += blockDim.x) stage[j] = src[j];
    __syncthreads();
    for (int j = threadIdx.x; j < words; j += blockDim.x) dst[j] = stage[words - 1 - j];
}
