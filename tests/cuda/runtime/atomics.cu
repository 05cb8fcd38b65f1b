// atomics: results that stay deterministic although the threads race:
// a 256-bin histogram (shared-memory atomics, then global ones), integer
// and float atomicAdd on values whose sums are exact in any order,
// atomicMax, and a counter built on atomicCAS that hands out tickets.
#include "check.h"

#include <vector>

// bins[v] += number of i < n with data[i] == v, over a grid-stride loop;
// each block counts in shared memory first. Reference: kernels.rs `histogram256`.
__global__ void histogram256(const unsigned char *data, int n, unsigned int *bins) {
    __shared__ unsigned int local[256];
    for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        atomicAdd(&local[data[i]], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        if (local[b]) atomicAdd(&bins[b], local[b]);
}

// For each i < n (one thread each): *sum += x[i], *fsum += x[i] * 0.5f,
// *max = max(*max, x[i]). Reference: kernels.rs `sum_and_max`.
__global__ void sumAndMax(const int *x, int n, int *sum, float *fsum, int *max) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        atomicAdd(sum, x[i]);
        atomicAdd(fsum, (float)x[i] * 0.5f);
        atomicMax(max, x[i]);
    }
}

// Each thread i < n takes the next ticket from *counter with an atomicCAS
// loop and counts it in taken[ticket]. Reference: kernels.rs `cas_tickets`.
__global__ void casTickets(unsigned int *counter, unsigned int *taken, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int old = *counter, seen;
    while ((seen = atomicCAS(counter, old, old + 1)) != old) old = seen;
    atomicAdd(&taken[old], 1u);
}

static const int N = 1 << 20;
static const int THREADS = 256;

int main() {
    // Histogram of a byte pattern with a known count per bin.
    std::vector<unsigned char> data(N);
    std::vector<unsigned> want(256, 0);
    for (int i = 0; i < N; i++) {
        data[i] = (unsigned char)((i * 37 + i / 1000) & 0xff);
        want[data[i]]++;
    }
    unsigned char *ddata;
    unsigned *dbins;
    CHECK(cudaMalloc(&ddata, N));
    CHECK(cudaMalloc(&dbins, 256 * sizeof(unsigned)));
    CHECK(cudaMemcpy(ddata, data.data(), N, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dbins, 0, 256 * sizeof(unsigned)));
    histogram256<<<64, THREADS>>>(ddata, N, dbins);
    CHECK_LAUNCH();
    std::vector<unsigned> bins(256);
    CHECK(cudaMemcpy(bins.data(), dbins, 256 * sizeof(unsigned), cudaMemcpyDeviceToHost));
    unsigned long long total = 0;
    for (int b = 0; b < 256; b++) {
        EXPECT(bins[b] == want[b], "bin %d = %u, want %u", b, bins[b], want[b]);
        total += bins[b];
    }
    printf("histogram: %llu values, bin[0]=%u bin[1]=%u bin[255]=%u\n", total, bins[0], bins[1], bins[255]);

    // Sums and a maximum. The float sum adds halves of integers below 2^20:
    // every partial sum is exact in float, so the order does not matter.
    const int M = 100000;
    std::vector<int> x(M);
    long long want_sum = 0;
    int want_max = -1000000;
    for (int i = 0; i < M; i++) {
        x[i] = (i * 7919) % 201 - 100;
        want_sum += x[i];
        if (x[i] > want_max) want_max = x[i];
    }
    int *dx, *dsum, *dmax;
    float *dfsum;
    CHECK(cudaMalloc(&dx, M * sizeof(int)));
    CHECK(cudaMalloc(&dsum, sizeof(int)));
    CHECK(cudaMalloc(&dfsum, sizeof(float)));
    CHECK(cudaMalloc(&dmax, sizeof(int)));
    CHECK(cudaMemcpy(dx, x.data(), M * sizeof(int), cudaMemcpyHostToDevice));
    int zero = 0, low = -1000000;
    float fzero = 0.0f;
    CHECK(cudaMemcpy(dsum, &zero, sizeof zero, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dfsum, &fzero, sizeof fzero, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dmax, &low, sizeof low, cudaMemcpyHostToDevice));
    sumAndMax<<<(M + THREADS - 1) / THREADS, THREADS>>>(dx, M, dsum, dfsum, dmax);
    CHECK_LAUNCH();
    int sum, max;
    float fsum;
    CHECK(cudaMemcpy(&sum, dsum, sizeof sum, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&fsum, dfsum, sizeof fsum, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&max, dmax, sizeof max, cudaMemcpyDeviceToHost));
    EXPECT(sum == want_sum && max == want_max && (double)fsum == 0.5 * (double)want_sum,
           "sum %d max %d fsum %g", sum, max, fsum);
    printf("atomicAdd int: %d, atomicAdd float: %.1f, atomicMax: %d\n", sum, fsum, max);

    // Tickets: starting at 1000, each of T threads takes one; every ticket
    // 1000 .. 1000+T-1 is taken exactly once.
    const int T = 5000;
    unsigned *dcounter, *dtaken;
    CHECK(cudaMalloc(&dcounter, sizeof(unsigned)));
    CHECK(cudaMalloc(&dtaken, (1000 + T + 16) * sizeof(unsigned)));
    unsigned start = 1000;
    CHECK(cudaMemcpy(dcounter, &start, sizeof start, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dtaken, 0, (1000 + T + 16) * sizeof(unsigned)));
    casTickets<<<(T + 127) / 128, 128>>>(dcounter, dtaken, T);
    CHECK_LAUNCH();
    unsigned counter;
    std::vector<unsigned> taken(1000 + T + 16);
    CHECK(cudaMemcpy(&counter, dcounter, sizeof counter, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(taken.data(), dtaken, taken.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    int once = 0, other = 0;
    for (size_t t = 0; t < taken.size(); t++) {
        bool issued = t >= 1000 && t < 1000 + (size_t)T;
        if (issued && taken[t] == 1) once++;
        else if (taken[t] != 0 || issued) other++;
    }
    EXPECT(counter == 1000u + T && once == T && other == 0, "counter %u once %d other %d", counter, once, other);
    printf("atomicCAS tickets: counter=%u, %d tickets taken once each\n", counter, once);

    CHECK(cudaFree(ddata));
    CHECK(cudaFree(dbins));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dsum));
    CHECK(cudaFree(dfsum));
    CHECK(cudaFree(dmax));
    CHECK(cudaFree(dcounter));
    CHECK(cudaFree(dtaken));
    printf("done\n");
    return 0;
}
