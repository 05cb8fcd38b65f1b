// occupancy: the occupancy calculator and function attributes.
// cudaOccupancyMaxActiveBlocksPerMultiprocessor,
// cudaOccupancyMaxPotentialBlockSize, cudaFuncGetAttributes (printing only
// what is fixed at compile time, and relations for the rest), and
// cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) to
// launch with more than the default 48 KiB of dynamic shared memory.
#include "check.h"

#include <vector>

#define BLOCK 256

// out[b] = sum of in[b * BLOCK + t] over t < BLOCK with index < n, a tree
// reduction in static shared memory; launched with BLOCK threads.
// Reference: kernels.rs `block_sum`.
__global__ void __launch_bounds__(BLOCK) blockSum(const int *in, int *out, int n) {
    __shared__ int partial[BLOCK];
    int i = blockIdx.x * BLOCK + threadIdx.x;
    partial[threadIdx.x] = i < n ? in[i] : 0;
    __syncthreads();
    for (int step = BLOCK / 2; step > 0; step /= 2) {
        if (threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

// Each block stages `words` ints of its segment in dynamic shared memory and
// writes them back reversed: out[b*words + j] = in[b*words + words-1-j].
// Reference: kernels.rs `shared_reverse`.
__global__ void sharedReverse(const int *in, int *out, int words) {
    extern __shared__ int stage[];
    const int *src = in + (size_t)blockIdx.x * words;
    int *dst = out + (size_t)blockIdx.x * words;
    for (int j = threadIdx.x; j < words; j += blockDim.x) stage[j] = src[j];
    __syncthreads();
    for (int j = threadIdx.x; j < words; j += blockDim.x) dst[j] = stage[words - 1 - j];
}

int main() {
    int active = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&active, blockSum, BLOCK, 0));
    printf("blockSum: active blocks per SM at %d threads > 0: %s\n", BLOCK, yes_no(active > 0));
    int min_grid = 0, block = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, blockSum, 0, 0));
    printf("blockSum: potential block size in (0, %d], a multiple of 32: %s; min grid > 0: %s\n", BLOCK,
           yes_no(block > 0 && block <= BLOCK && block % 32 == 0), yes_no(min_grid > 0));

    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, blockSum));
    printf("blockSum: sharedSizeBytes=%zu maxThreadsPerBlock=%d numRegs > 0: %s localSizeBytes=%zu\n",
           fa.sharedSizeBytes, fa.maxThreadsPerBlock, yes_no(fa.numRegs > 0), fa.localSizeBytes);

    // blockSum over N values: one partial sum per block.
    const int N = 100000, BLOCKS = (N + BLOCK - 1) / BLOCK;
    std::vector<int> in(N);
    long long want = 0;
    for (int i = 0; i < N; i++) want += (in[i] = (i * 31) % 1000 - 499);
    int *din, *dpart;
    CHECK(cudaMalloc(&din, N * sizeof(int)));
    CHECK(cudaMalloc(&dpart, BLOCKS * sizeof(int)));
    CHECK(cudaMemcpy(din, in.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    blockSum<<<BLOCKS, BLOCK>>>(din, dpart, N);
    CHECK_LAUNCH();
    std::vector<int> part(BLOCKS);
    CHECK(cudaMemcpy(part.data(), dpart, BLOCKS * sizeof(int), cudaMemcpyDeviceToHost));
    long long sum = 0;
    for (int b = 0; b < BLOCKS; b++) sum += part[b];
    EXPECT(sum == want, "sum %lld, want %lld", sum, want);
    printf("blockSum: %d blocks, total %lld\n", BLOCKS, sum);

    // Dynamic shared memory beyond the default limit needs the attribute.
    const int SMEM = 64 * 1024, WORDS = SMEM / (int)sizeof(int), SEGMENTS = 4;
    CHECK(cudaFuncGetAttributes(&fa, sharedReverse));
    printf("sharedReverse: sharedSizeBytes=%zu maxDynamicSharedSizeBytes=%d\n", fa.sharedSizeBytes,
           fa.maxDynamicSharedSizeBytes);
    int occupancy_before = -1;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy_before, sharedReverse, 256, 16 * 1024));
    printf("sharedReverse: active blocks per SM with 16 KiB > 0: %s\n", yes_no(occupancy_before > 0));

    std::vector<int> seg(SEGMENTS * WORDS);
    for (int i = 0; i < SEGMENTS * WORDS; i++) seg[i] = i * 3 + 1;
    int *dseg, *drev;
    CHECK(cudaMalloc(&dseg, seg.size() * sizeof(int)));
    CHECK(cudaMalloc(&drev, seg.size() * sizeof(int)));
    CHECK(cudaMemcpy(dseg, seg.data(), seg.size() * sizeof(int), cudaMemcpyHostToDevice));
    // Refused (which error differs between the runtime's checks and the
    // driver's, so only the failure is printed); not a sticky error.
    sharedReverse<<<SEGMENTS, 256, SMEM>>>(dseg, drev, WORDS);
    cudaError_t too_much = cudaGetLastError();
    printf("launch with %d bytes before cudaFuncSetAttribute fails: %s\n", SMEM, yes_no(too_much != cudaSuccess));
    if (too_much != cudaSuccess) fprintf(stderr, "(the launch failed with %s)\n", cudaGetErrorName(too_much));

    CHECK(cudaFuncSetAttribute(sharedReverse, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CHECK(cudaFuncGetAttributes(&fa, sharedReverse));
    printf("sharedReverse: maxDynamicSharedSizeBytes=%d after cudaFuncSetAttribute\n", fa.maxDynamicSharedSizeBytes);
    CHECK(cudaMemset(drev, 0, seg.size() * sizeof(int)));
    sharedReverse<<<SEGMENTS, 256, SMEM>>>(dseg, drev, WORDS);
    CHECK_LAUNCH();
    std::vector<int> rev(seg.size());
    CHECK(cudaMemcpy(rev.data(), drev, rev.size() * sizeof(int), cudaMemcpyDeviceToHost));
    for (int s = 0; s < SEGMENTS; s++)
        for (int j = 0; j < WORDS; j++) {
            int want_v = seg[s * WORDS + WORDS - 1 - j];
            EXPECT(rev[s * WORDS + j] == want_v, "rev[%d] = %d, want %d", s * WORDS + j, rev[s * WORDS + j], want_v);
        }
    printf("sharedReverse: %d segments of %d words reversed through %d bytes of shared memory\n", SEGMENTS, WORDS,
           SMEM);

    CHECK(cudaFree(din));
    CHECK(cudaFree(dpart));
    CHECK(cudaFree(dseg));
    CHECK(cudaFree(drev));
    printf("done\n");
    return 0;
}
