// c[i] = a[i] + b[i] for i < n; used by vector_add, module_formats and
// expected_errors. Reference: kernels.rs `vector_add`.
extern "C" __global__ void vector_add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
