// matrix_mul: a tiled matrix multiply through __shared__ memory, as in the
// CUDA samples' matrixMul: C (128x64) = A (128x96) * B (96x64), with
// integer-valued inputs so that every result is exact, checked against the
// CPU.
#include "check.h"

#include <vector>

#define TILE 16

// C = A * B for row-major A (hA x wA) and B (wA x wB), launched with
// TILE x TILE blocks over a (wB / TILE, hA / TILE) grid; wA, wB and hA are
// multiples of TILE. Reference: kernels.rs `matrix_mul`.
__global__ void matrixMul(float *C, const float *A, const float *B, int wA, int wB) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float sum = 0.0f;
    for (int t = 0; t < wA / TILE; t++) {
        As[ty][tx] = A[row * wA + t * TILE + tx];
        Bs[ty][tx] = B[(t * TILE + ty) * wB + col];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; k++) sum += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    C[row * wB + col] = sum;
}

static const int HA = 128, WA = 96, WB = 64;

int main() {
    std::vector<float> a(HA * WA), b(WA * WB), c(HA * WB), want(HA * WB);
    for (int i = 0; i < HA; i++)
        for (int k = 0; k < WA; k++) a[i * WA + k] = (float)((i * 3 + k * 7) % 11 - 5);
    for (int k = 0; k < WA; k++)
        for (int j = 0; j < WB; j++) b[k * WB + j] = (float)((k * 5 + j * 2) % 9 - 4);
    for (int i = 0; i < HA; i++)
        for (int j = 0; j < WB; j++) {
            int s = 0;
            for (int k = 0; k < WA; k++) s += (int)a[i * WA + k] * (int)b[k * WB + j];
            want[i * WB + j] = (float)s;
        }

    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, a.size() * sizeof(float)));
    CHECK(cudaMalloc(&db, b.size() * sizeof(float)));
    CHECK(cudaMalloc(&dc, c.size() * sizeof(float)));
    CHECK(cudaMemcpy(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dc, 0xff, c.size() * sizeof(float))); // NaNs: every element must be written

    dim3 threads(TILE, TILE);
    dim3 grid(WB / TILE, HA / TILE);
    printf("C(%dx%d) = A(%dx%d) * B(%dx%d), grid %ux%u of %ux%u threads\n", HA, WB, HA, WA, WA, WB,
           grid.x, grid.y, threads.x, threads.y);
    matrixMul<<<grid, threads>>>(dc, da, db, WA, WB);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost));

    int wrong = 0;
    double sum = 0, trace = 0;
    for (int i = 0; i < HA * WB; i++) {
        if (c[i] != want[i]) {
            if (wrong < 5) fprintf(stderr, "C[%d][%d] = %g, want %g\n", i / WB, i % WB, c[i], want[i]);
            wrong++;
        }
        sum += c[i];
    }
    for (int i = 0; i < WB; i++) trace += c[i * WB + i];
    EXPECT(wrong == 0, "%d of %d elements differ from the CPU", wrong, HA * WB);
    printf("matches the CPU: %d elements\n", HA * WB);
    printf("C[0][0]=%g C[0][63]=%g C[127][0]=%g C[127][63]=%g\n", c[0], c[WB - 1], c[(HA - 1) * WB],
           c[HA * WB - 1]);
    printf("sum=%.0f trace=%.0f\n", sum, trace);

    // The same product again on the result of a device-to-device copy of A.
    float *da2;
    CHECK(cudaMalloc(&da2, a.size() * sizeof(float)));
    CHECK(cudaMemcpy(da2, da, a.size() * sizeof(float), cudaMemcpyDeviceToDevice));
    CHECK(cudaMemset(dc, 0, c.size() * sizeof(float)));
    matrixMul<<<grid, threads>>>(dc, da2, db, WA, WB);
    CHECK_LAUNCH();
    std::vector<float> again(HA * WB);
    CHECK(cudaMemcpy(again.data(), dc, again.size() * sizeof(float), cudaMemcpyDeviceToHost));
    printf("second run identical: %s\n", yes_no(again == c));

    CHECK(cudaFree(da));
    CHECK(cudaFree(da2));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    printf("done\n");
    return 0;
}
