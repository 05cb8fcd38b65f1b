// runtime_api: the rest of the everyday runtime API. Devices and their
// properties (device-independent facts only), versions, cudaMemGetInfo,
// streams, symbols (cudaMemcpyToSymbol / cudaMemcpyFromSymbol /
// cudaGetSymbolAddress on __device__ and __constant__ arrays), the error
// state after a bad launch (cudaPeekAtLastError, cudaGetLastError,
// cudaGetErrorString), and cudaDeviceReset followed by more work.
#include "check.h"

#include <cstring>

__device__ int devTable[16];
__constant__ float constCoeffs[8];
__device__ int devCounter = 42;

// out[i] = devTable[i % 16] * constCoeffs[i % 8] for i < n; then thread i < 16
// doubles devTable[i]. table and coeffs are the symbols' addresses: out[n] is
// 1 if they match. Reference: kernels.rs `use_symbols`, through those
// addresses.
__global__ void useSymbols(const int *table, const float *coeffs, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = devTable[i % 16] * constCoeffs[i % 8];
    if (i == 0) out[n] = (table == devTable && coeffs == constCoeffs) ? 1.0f : 0.0f;
    __syncthreads();
    if (i < 16) devTable[i] *= 2;
}

static const int N = 1000;

// Sets the symbols, runs useSymbols on `stream` and checks it; returns the
// sum of the output.
static double symbols_round(cudaStream_t stream, int base) {
    int table[16];
    float coeffs[8];
    for (int i = 0; i < 16; i++) table[i] = base + i;
    for (int i = 0; i < 8; i++) coeffs[i] = 0.5f * (float)(i - 3);
    CHECK(cudaMemcpyToSymbol(devTable, table, sizeof table));
    CHECK(cudaMemcpyToSymbol(constCoeffs, coeffs, 4 * sizeof(float)));
    CHECK(cudaMemcpyToSymbol(constCoeffs, coeffs + 4, 4 * sizeof(float), 4 * sizeof(float)));
    int *table_addr;
    float *coeffs_addr, *out;
    CHECK(cudaGetSymbolAddress((void **)&table_addr, devTable));
    CHECK(cudaGetSymbolAddress((void **)&coeffs_addr, constCoeffs));
    CHECK(cudaMalloc(&out, (N + 1) * sizeof(float)));
    useSymbols<<<1, 1024, 0, stream>>>(table_addr, coeffs_addr, out, N);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(stream));
    float host[N + 1];
    CHECK(cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < N; i++) {
        EXPECT(host[i] == (float)table[i % 16] * coeffs[i % 8], "out[%d] = %g", i, host[i]);
        sum += host[i];
    }
    EXPECT(host[N] == 1.0f, "symbol addresses differ from the symbols");
    int doubled[16];
    CHECK(cudaMemcpyFromSymbol(doubled, devTable, sizeof doubled));
    for (int i = 0; i < 16; i++) EXPECT(doubled[i] == 2 * table[i], "devTable[%d] = %d", i, doubled[i]);
    float back[2];
    CHECK(cudaMemcpyFromSymbol(back, constCoeffs, sizeof back, 6 * sizeof(float)));
    EXPECT(back[0] == coeffs[6] && back[1] == coeffs[7], "constCoeffs[6..8] = %g %g", back[0], back[1]);
    CHECK(cudaFree(out));
    return sum;
}

int main() {
    int count = 0, device = -1;
    CHECK(cudaGetDeviceCount(&count));
    printf("cudaGetDeviceCount >= 1: %s\n", yes_no(count >= 1));
    CHECK(cudaSetDevice(0));
    CHECK(cudaGetDevice(&device));
    printf("cudaGetDevice: %d\n", device);

    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("warpSize: %d\n", p.warpSize);
    printf("major >= 7: %s\n", yes_no(p.major >= 7));
    printf("maxThreadsPerBlock: %d\n", p.maxThreadsPerBlock);
    printf("maxThreadsDim: %d %d %d\n", p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2]);
    printf("maxGridSize: %d %d %d\n", p.maxGridSize[0], p.maxGridSize[1], p.maxGridSize[2]);
    printf("sharedMemPerBlock: %zu\n", p.sharedMemPerBlock);
    printf("multiProcessorCount > 0: %s\n", yes_no(p.multiProcessorCount > 0));
    printf("totalGlobalMem > 0: %s\n", yes_no(p.totalGlobalMem > 0));
    printf("name is set: %s\n", yes_no(strlen(p.name) > 0));
    int attr = 0;
    CHECK(cudaDeviceGetAttribute(&attr, cudaDevAttrWarpSize, 0));
    printf("cudaDevAttrWarpSize: %d\n", attr);

    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    printf("cudaDriverGetVersion >= 13000: %s\n", yes_no(driver >= 13000));
    printf("cudaRuntimeGetVersion: %d\n", runtime);

    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    printf("cudaMemGetInfo: free <= total: %s, total > 0: %s\n", yes_no(free_b <= total_b), yes_no(total_b > 0));

    int counter = 0;
    CHECK(cudaMemcpyFromSymbol(&counter, devCounter, sizeof counter));
    printf("devCounter initially: %d\n", counter);
    counter = 7;
    CHECK(cudaMemcpyToSymbol(devCounter, &counter, sizeof counter));

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    printf("symbols on a created stream: sum=%.1f\n", symbols_round(stream, 10));
    CHECK(cudaStreamDestroy(stream));
    printf("symbols on the default stream: sum=%.1f\n", symbols_round(0, -20));
    CHECK(cudaDeviceSynchronize());

    // A launch with more threads per block than any device allows fails at
    // once; the error is not sticky, and cudaGetLastError clears it.
    float *out;
    CHECK(cudaMalloc(&out, (N + 1) * sizeof(float)));
    useSymbols<<<1, 2048>>>(nullptr, nullptr, out, N);
    cudaError_t peek = cudaPeekAtLastError();
    printf("bad launch: cudaPeekAtLastError: %s\n", cudaGetErrorName(peek));
    printf("bad launch: cudaGetLastError: %s\n", cudaGetErrorName(cudaGetLastError()));
    printf("then cudaGetLastError: %s\n", cudaGetErrorName(cudaGetLastError()));
    printf("cudaGetErrorString: %s\n", cudaGetErrorString(peek));
    printf("cudaDeviceSynchronize after it: %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    CHECK(cudaFree(out));

    // A peer copy within the one device, synchronous and on a stream.
    float *peer_src, *peer_dst;
    float peer_in[4] = {1.5f, 2.5f, 3.5f, 4.5f}, peer_out[4] = {};
    CHECK(cudaMalloc(&peer_src, sizeof peer_in));
    CHECK(cudaMalloc(&peer_dst, sizeof peer_in));
    CHECK(cudaMemcpy(peer_src, peer_in, sizeof peer_in, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyPeer(peer_dst, 0, peer_src, 0, 2 * sizeof(float)));
    CHECK(cudaMemcpyPeerAsync(peer_dst + 2, 0, peer_src + 2, 0, 2 * sizeof(float), 0));
    CHECK(cudaMemcpy(peer_out, peer_dst, sizeof peer_out, cudaMemcpyDeviceToHost));
    printf("cudaMemcpyPeer, then Async: %.1f %.1f %.1f %.1f\n", peer_out[0], peer_out[1], peer_out[2], peer_out[3]);
    CHECK(cudaFree(peer_src));
    CHECK(cudaFree(peer_dst));

    void *huge = nullptr;
    printf("cudaMalloc(1 PiB): %s\n", cudaGetErrorName(cudaMalloc(&huge, (size_t)1 << 50)));
    printf("then cudaGetLastError: %s\n", cudaGetErrorName(cudaGetLastError()));
    CHECK(cudaFree(nullptr));

    // Reset, then the device works again and globals are back to their
    // initial values.
    CHECK(cudaDeviceReset());
    CHECK(cudaMemcpyFromSymbol(&counter, devCounter, sizeof counter));
    printf("devCounter after cudaDeviceReset: %d\n", counter);
    CHECK(cudaGetDevice(&device));
    printf("cudaGetDevice after cudaDeviceReset: %d\n", device);
    printf("symbols after cudaDeviceReset: sum=%.1f\n", symbols_round(0, 3));
    CHECK(cudaDeviceSynchronize());
    printf("done\n");
    return 0;
}
