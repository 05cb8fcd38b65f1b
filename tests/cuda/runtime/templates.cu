// templates: kernels are C++ templates, so their symbols are mangled names
// the runtime registers and looks up: axpy<T> for int, float and double, and
// a transform<T, F> kernel taking a templated functor struct by value.
#include "check.h"

#include <vector>

// y[i] = a * x[i] + y[i] for i < n. Reference: kernels.rs `axpy_i32`,
// `axpy_f32`, `axpy_f64`.
template <typename T>
__global__ void axpy(T a, const T *x, T *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// A functor with state, passed to the kernel by value.
template <typename T>
struct Affine {
    T mul, add;
    __host__ __device__ T operator()(T v) const { return v * mul + add; }
};

// data[i] = f(data[i]) for every i < n, in a grid-stride loop.
// Reference: kernels.rs `transform_affine_i32`, `transform_affine_f64`.
template <typename T, typename F>
__global__ void transform(T *data, int n, F f) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) data[i] = f(data[i]);
}

static const int N = 10000;
static const int THREADS = 128;

// Runs axpy<T> on x[i] = i % 100 - 50 (scaled by `unit`) and y[i] = i / 100,
// checks it against the CPU and prints the sum.
template <typename T>
static void run_axpy(const char *type, T a, T unit) {
    std::vector<T> x(N), y(N), want(N);
    for (int i = 0; i < N; i++) {
        x[i] = (T)(i % 100 - 50) * unit;
        y[i] = (T)(i / 100);
        want[i] = a * x[i] + y[i];
    }
    T *dx, *dy;
    CHECK(cudaMalloc(&dx, N * sizeof(T)));
    CHECK(cudaMalloc(&dy, N * sizeof(T)));
    CHECK(cudaMemcpy(dx, x.data(), N * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, y.data(), N * sizeof(T), cudaMemcpyHostToDevice));
    axpy<T><<<(N + THREADS - 1) / THREADS, THREADS>>>(a, dx, dy, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(y.data(), dy, N * sizeof(T), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < N; i++) {
        EXPECT(y[i] == want[i], "axpy<%s>: y[%d] = %g, want %g", type, i, (double)y[i], (double)want[i]);
        sum += (double)y[i];
    }
    printf("axpy<%s>: %d ok, y[1]=%g y[%d]=%g sum=%.3f\n", type, N, (double)y[1], N - 1, (double)y[N - 1], sum);
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
}

// Runs transform<T, Affine<T>> twice over data[i] = i % 37, on a grid smaller
// than n so that the stride loop matters.
template <typename T>
static void run_transform(const char *type, Affine<T> f, Affine<T> g) {
    std::vector<T> data(N);
    for (int i = 0; i < N; i++) data[i] = (T)(i % 37);
    T *d;
    CHECK(cudaMalloc(&d, N * sizeof(T)));
    CHECK(cudaMemcpy(d, data.data(), N * sizeof(T), cudaMemcpyHostToDevice));
    transform<<<8, THREADS>>>(d, N, f);
    CHECK_LAUNCH();
    transform<<<3, 64>>>(d, N - 1, g);
    CHECK_LAUNCH();
    std::vector<T> got(N);
    CHECK(cudaMemcpy(got.data(), d, N * sizeof(T), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < N; i++) {
        T want = i < N - 1 ? g(f(data[i])) : f(data[i]);
        EXPECT(got[i] == want, "transform<%s>: [%d] = %g, want %g", type, i, (double)got[i], (double)want);
        sum += (double)got[i];
    }
    printf("transform<%s, Affine<%s>>: %d ok, [%d]=%g sum=%.3f\n", type, type, N, N - 1, (double)got[N - 1], sum);
    CHECK(cudaFree(d));
}

int main() {
    run_axpy<int>("int", 3, 1);
    run_axpy<float>("float", -2.5f, 0.5f);
    run_axpy<double>("double", 0.75, 0.125);
    run_transform<int>("int", Affine<int>{2, -7}, Affine<int>{-3, 1});
    run_transform<double>("double", Affine<double>{0.5, 0.25}, Affine<double>{4.0, -1.0});
    printf("done\n");
    return 0;
}
