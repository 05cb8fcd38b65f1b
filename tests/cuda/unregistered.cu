// A kernel with no reference implementation in kernels.rs, on purpose: the
// emulated device must refuse it and say why.
extern "C" __global__ void not_a_test_kernel(int *out) { out[threadIdx.x] = (int)threadIdx.x; }
