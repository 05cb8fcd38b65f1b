// stream_ordered: cudaMallocAsync and cudaFreeAsync as an iterative solver
// uses them, scratch memory allocated and freed each step in stream order,
// with the default pool kept from releasing memory between steps; memory
// allocated on one stream, used on another after an event and freed there;
// a pool of the program's own with cudaMallocFromPoolAsync; what the pools
// keep and a trim giving it back. Values stay well inside an int.
#include "check.h"

#include <cstdint>
#include <vector>

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

static const int N = 1 << 16;
static const int THREADS = 256;
static const int BLOCKS = (N + THREADS - 1) / THREADS;
static const size_t BYTES = N * sizeof(int);

static unsigned long long reserved(cudaMemPool_t pool) {
    uint64_t value = 0;
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &value));
    return value;
}

int main() {
    int dev = 0, supported = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev));
    printf("memory pools supported: %s\n", yes_no(supported == 1));

    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep_all = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<int> host(N);
    for (int i = 0; i < N; i++) host[i] = i % 1000 - 500;
    int *state;
    CHECK(cudaMallocAsync((void **)&state, BYTES, s));
    CHECK(cudaMemcpyAsync(state, host.data(), BYTES, cudaMemcpyHostToDevice, s));
    // Each step: scratch = state * 2 + step; state = scratch - 1; scratch freed.
    for (int step = 0; step < 20; step++) {
        int *scratch;
        CHECK(cudaMallocAsync((void **)&scratch, BYTES, s));
        scaleAdd<<<BLOCKS, THREADS, 0, s>>>(scratch, state, 2, step, N);
        CHECK_LAUNCH();
        scaleAdd<<<BLOCKS, THREADS, 0, s>>>(state, scratch, 1, -1, N);
        CHECK_LAUNCH();
        CHECK(cudaFreeAsync(scratch, s));
    }
    std::vector<int> out(N);
    CHECK(cudaMemcpyAsync(out.data(), state, BYTES, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    long long sum = 0;
    for (int i = 0; i < N; i++) {
        long long want = host[i];
        for (int step = 0; step < 20; step++) want = want * 2 + step - 1;
        EXPECT(out[i] == (int)want, "state[%d] = %d, want %d", i, out[i], (int)want);
        sum += out[i];
    }
    printf("20 steps with scratch allocated and freed in stream order: sum=%lld\n", sum);
    printf("the default pool keeps the scratch memory: %s\n", yes_no(reserved(pool) >= 2 * BYTES));

    // Allocated on one stream, used on another once an event says so, freed there.
    cudaStream_t t;
    cudaEvent_t ready;
    CHECK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    int *shared;
    CHECK(cudaMallocAsync((void **)&shared, BYTES, s));
    scaleAdd<<<BLOCKS, THREADS, 0, s>>>(shared, state, 2, 0, N);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(ready, s));
    CHECK(cudaStreamWaitEvent(t, ready, 0));
    scaleAdd<<<BLOCKS, THREADS, 0, t>>>(state, shared, 1, 7, N);
    CHECK_LAUNCH();
    CHECK(cudaFreeAsync(shared, t));
    CHECK(cudaMemcpyAsync(out.data(), state, BYTES, cudaMemcpyDeviceToHost, t));
    CHECK(cudaStreamSynchronize(t));
    sum = 0;
    for (int i = 0; i < N; i++) sum += out[i];
    printf("allocated on one stream, freed on another after an event: sum=%lld\n", sum);

    // A pool of the program's own.
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t mine;
    CHECK(cudaMemPoolCreate(&mine, &props));
    int *p;
    CHECK(cudaMallocFromPoolAsync((void **)&p, BYTES, mine, s));
    CHECK(cudaMemsetAsync(p, 0, BYTES, s));
    scaleAdd<<<BLOCKS, THREADS, 0, s>>>(p, p, 5, 11, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(out.data(), p, BYTES, cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(p, s));
    CHECK(cudaStreamSynchronize(s));
    bool all = true;
    for (int i = 0; i < N; i++) all = all && out[i] == 11;
    printf("from a pool of its own, zeroed then scaled: all 11: %s\n", yes_no(all));
    CHECK(cudaMemPoolDestroy(mine));

    CHECK(cudaFreeAsync(state, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemPoolTrimTo(pool, 0));
    printf("the default pool trimmed: keeps nothing: %s\n", yes_no(reserved(pool) == 0));
    CHECK(cudaEventDestroy(ready));
    CHECK(cudaStreamDestroy(t));
    CHECK(cudaStreamDestroy(s));
    printf("done\n");
    return 0;
}
