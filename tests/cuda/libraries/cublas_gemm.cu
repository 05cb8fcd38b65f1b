// cublas_gemm: cuBLAS on top of the runtime. cublasSgemm and cublasDgemm
// (one with a transposed operand) on small integer-valued column-major
// matrices, so that every result is exact; checked against the CPU, with
// checksums printed. Built only where the toolkit has cuBLAS.
#include "../runtime/check.h"

#include <cublas_v2.h>

#include <vector>

#define CUBLAS_CHECK(call)                                                      \
    do {                                                                        \
        cublasStatus_t st_ = (call);                                            \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                     \
            fflush(stdout);                                                     \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__,       \
                    #call, cublasGetStatusName(st_));                           \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int M = 64, N = 48, K = 32;

// C = alpha * op(A) * B + beta * C for column-major A (M x K, or K x M when
// transposed), B (K x N), C (M x N), on the GPU; checked against the CPU.
template <typename T>
static void gemm(cublasHandle_t handle, const char *name, bool transpose_a) {
    std::vector<T> a(M * K), b(K * N), c(M * N), want(M * N);
    int lda = transpose_a ? K : M;
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            T v = (T)((i + 2 * k) % 7 - 3);
            if (transpose_a) a[k + i * K] = v;
            else a[i + k * M] = v;
        }
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) b[k + j * K] = (T)((3 * k + j) % 5 - 2);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) c[i + j * M] = (T)((i + j) % 3);
    const T alpha = 2, beta = -1;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            T s = 0;
            for (int k = 0; k < K; k++) s += (T)((i + 2 * k) % 7 - 3) * b[k + j * K];
            want[i + j * M] = alpha * s + beta * c[i + j * M];
        }
    T *da, *db, *dc;
    CHECK(cudaMalloc(&da, a.size() * sizeof(T)));
    CHECK(cudaMalloc(&db, b.size() * sizeof(T)));
    CHECK(cudaMalloc(&dc, c.size() * sizeof(T)));
    CUBLAS_CHECK(cublasSetMatrix(transpose_a ? K : M, transpose_a ? M : K, sizeof(T), a.data(), lda, da, lda));
    CUBLAS_CHECK(cublasSetMatrix(K, N, sizeof(T), b.data(), K, db, K));
    CUBLAS_CHECK(cublasSetMatrix(M, N, sizeof(T), c.data(), M, dc, M));
    cublasOperation_t op = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    if constexpr (sizeof(T) == 4)
        CUBLAS_CHECK(cublasSgemm(handle, op, CUBLAS_OP_N, M, N, K, &alpha, da, lda, db, K, &beta, dc, M));
    else
        CUBLAS_CHECK(cublasDgemm(handle, op, CUBLAS_OP_N, M, N, K, &alpha, da, lda, db, K, &beta, dc, M));
    CUBLAS_CHECK(cublasGetMatrix(M, N, sizeof(T), dc, M, c.data(), M));
    double sum = 0, weighted = 0;
    for (int i = 0; i < M * N; i++) {
        EXPECT(c[i] == want[i], "%s: C[%d] = %g, want %g", name, i, (double)c[i], (double)want[i]);
        sum += c[i];
        weighted += c[i] * (double)(i % 17);
    }
    printf("%s%s: %dx%dx%d ok, C[0]=%g C[last]=%g sum=%.0f weighted=%.0f\n", name, transpose_a ? " (A^T)" : "", M,
           N, K, (double)c[0], (double)c[M * N - 1], sum, weighted);
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
}

int main() {
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    gemm<float>(handle, "cublasSgemm", false);
    gemm<double>(handle, "cublasDgemm", false);
    gemm<double>(handle, "cublasDgemm", true);
    CHECK(cudaStreamSynchronize(stream));
    CUBLAS_CHECK(cublasDestroy(handle));
    CHECK(cudaStreamDestroy(stream));
    printf("done\n");
    return 0;
}
