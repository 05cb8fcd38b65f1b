// vector_add: the classic first CUDA program. cudaMalloc, cudaMemcpy both
// ways, cudaMemset, a <<<>>> launch checked with cudaGetLastError,
// cudaDeviceSynchronize, cudaFree.
#include "check.h"

#include <cstring>
#include <vector>

// c[i] = a[i] + b[i] for i < n. Reference: kernels.rs `vector_add`.
__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

static const int N = 50000;
static const int THREADS = 256;

// Copies c back and checks c[i] == a[i] + b[i] for i < n and the memset
// pattern `fill` beyond; prints a line with a sum over all of c.
static void check_result(const char *how, const float *dc, const std::vector<float> &a,
                         const std::vector<float> &b, int n, float fill) {
    std::vector<float> c(N);
    CHECK(cudaMemcpy(c.data(), dc, N * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < N; i++) {
        float want = i < n ? a[i] + b[i] : fill;
        EXPECT(c[i] == want, "%s: c[%d] = %g, want %g", how, i, c[i], want);
        sum += c[i];
    }
    printf("%s: n=%d ok, c[0]=%g c[%d]=%g sum=%.2f\n", how, n, c[0], N - 1, c[N - 1], sum);
}

int main() {
    // Values whose sums are exact in float.
    std::vector<float> a(N), b(N);
    for (int i = 0; i < N; i++) {
        a[i] = (float)(i % 1000) * 0.25f;
        b[i] = (float)(i / 1000) - 7.5f;
    }
    size_t bytes = N * sizeof(float);
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes));
    CHECK(cudaMalloc(&db, bytes));
    CHECK(cudaMalloc(&dc, bytes));
    CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));

    // The whole vector, on a zeroed result.
    int blocks = (N + THREADS - 1) / THREADS;
    printf("launch: %d blocks of %d threads\n", blocks, THREADS);
    CHECK(cudaMemset(dc, 0, bytes));
    vectorAdd<<<blocks, THREADS>>>(da, db, dc, N);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    check_result("full", dc, a, b, N, 0.0f);

    // A shorter n over a result filled with bytes 0x40: the tail keeps them.
    int n = N - 77;
    float fill;
    memset(&fill, 0x40, sizeof fill);
    CHECK(cudaMemset(dc, 0x40, bytes));
    vectorAdd<<<blocks, THREADS>>>(da, db, dc, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    check_result("short", dc, a, b, n, fill);

    // Device to device, then the sum of the copy with itself.
    CHECK(cudaMemcpy(da, dc, bytes, cudaMemcpyDeviceToDevice));
    vectorAdd<<<blocks, THREADS>>>(da, da, db, N);
    CHECK_LAUNCH();
    std::vector<float> twice(N);
    CHECK(cudaMemcpy(twice.data(), db, bytes, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < N; i++) sum += twice[i];
    printf("doubled: twice[0]=%g twice[%d]=%g sum=%.2f\n", twice[0], N - 1, twice[N - 1], sum);

    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    printf("done\n");
    return 0;
}
