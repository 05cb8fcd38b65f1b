// One tenant's load for the GPU-time scheduling measurements: a closed
// loop of launch + synchronize of a kernel whose every block waits a
// given time on the GPU's clock, so that a kernel's length does not
// depend on how many blocks share an SM.
//
//   busy_loop SECONDS BLOCKS MICROSECONDS [START]
//
// Initializes CUDA and warms up, waits until the wall-clock time START
// (seconds since the epoch, as a float; default now) so that several
// tenants started together measure the same window, then loops for
// SECONDS. Prints one line:
//   kernels N per_second R p50_us P p99_us Q
// where the percentiles are of each iteration's launch-to-synchronized
// time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

__global__ void busy(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

static double wall() {
    using namespace std::chrono;
    return duration<double>(system_clock::now().time_since_epoch()).count();
}

#define CHECK(x)                                                                  \
    do {                                                                          \
        cudaError_t e = (x);                                                      \
        if (e != cudaSuccess) {                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));               \
            return 1;                                                             \
        }                                                                         \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s SECONDS BLOCKS MICROSECONDS [START]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    int blocks = atoi(argv[2]);
    unsigned long long ns = strtoull(argv[3], nullptr, 10) * 1000ull;
    double start = argc > 4 ? atof(argv[4]) : 0.0;

    for (int i = 0; i < 3; i++) busy<<<blocks, 32>>>(ns);
    CHECK(cudaDeviceSynchronize());
    while (wall() < start) std::this_thread::sleep_for(std::chrono::microseconds(200));

    std::vector<double> latencies;
    double begin = wall(), end = begin + seconds;
    while (true) {
        double t = wall();
        if (t >= end) break;
        busy<<<blocks, 32>>>(ns);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(0));
        latencies.push_back((wall() - t) * 1e6);
    }
    double took = wall() - begin;
    std::sort(latencies.begin(), latencies.end());
    auto pct = [&](double p) {
        return latencies.empty() ? 0.0 : latencies[std::min(latencies.size() - 1, (size_t)(p * latencies.size()))];
    };
    printf("kernels %zu per_second %.1f p50_us %.1f p99_us %.1f\n", latencies.size(), latencies.size() / took,
           pct(0.50), pct(0.99));
    return 0;
}
