// cufft_1d: cuFFT on top of the runtime. A complex-to-complex plan of
// length 16, forward then inverse (cuFFT does not normalise: divided by 16
// here), and a real-to-complex plan of the same signal's real part. Values
// are printed rounded to 3 decimals. Built only where the toolkit has cuFFT.
#include "../runtime/check.h"

#include <cufft.h>

#include <cmath>

#define CUFFT_CHECK(call)                                                       \
    do {                                                                        \
        cufftResult r_ = (call);                                                \
        if (r_ != CUFFT_SUCCESS) {                                              \
            fflush(stdout);                                                     \
            fprintf(stderr, "%s:%d: %s failed: cufftResult %d\n", __FILE__,     \
                    __LINE__, #call, (int)r_);                                  \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int N = 16;

// Rounded to 3 decimals, without a "-0.000".
static double r3(double v) {
    double r = std::round(v * 1000.0) / 1000.0;
    return r == 0.0 ? 0.0 : r;
}

static void print_complex(const char *what, const cufftComplex *v, int n) {
    printf("%s:", what);
    for (int i = 0; i < n; i++) printf(" (%.3f,%.3f)", r3(v[i].x), r3(v[i].y));
    printf("\n");
}

int main() {
    // x[k] = 1 + 2cos(2 pi k/16) + sin(2 pi 3k/16): spikes at bins 0, 1, 15, 3, 13.
    cufftComplex x[N], y[N], back[N];
    float real[N];
    const double pi = 3.14159265358979323846;
    for (int k = 0; k < N; k++) {
        real[k] = (float)(1.0 + 2.0 * cos(2 * pi * k / N) + sin(2 * pi * 3 * k / N));
        x[k].x = real[k];
        x[k].y = (float)(0.5 * cos(2 * pi * 2 * k / N));
    }
    cufftComplex *dx;
    CHECK(cudaMalloc(&dx, sizeof x));
    CHECK(cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice));

    cufftHandle plan;
    CUFFT_CHECK(cufftPlan1d(&plan, N, CUFFT_C2C, 1));
    CUFFT_CHECK(cufftExecC2C(plan, dx, dx, CUFFT_FORWARD));
    CHECK(cudaMemcpy(y, dx, sizeof y, cudaMemcpyDeviceToHost));
    print_complex("C2C forward", y, N);
    CUFFT_CHECK(cufftExecC2C(plan, dx, dx, CUFFT_INVERSE));
    CHECK(cudaMemcpy(back, dx, sizeof back, cudaMemcpyDeviceToHost));
    double err = 0;
    for (int k = 0; k < N; k++) {
        back[k].x /= N;
        back[k].y /= N;
        err = fmax(err, fmax(fabs(back[k].x - x[k].x), fabs(back[k].y - x[k].y)));
    }
    print_complex("C2C inverse / 16", back, N);
    printf("round trip error < 1e-5: %s\n", yes_no(err < 1e-5));
    CUFFT_CHECK(cufftDestroy(plan));

    float *dreal;
    cufftComplex *dspec, spec[N / 2 + 1];
    CHECK(cudaMalloc(&dreal, sizeof real));
    CHECK(cudaMalloc(&dspec, sizeof spec));
    CHECK(cudaMemcpy(dreal, real, sizeof real, cudaMemcpyHostToDevice));
    CUFFT_CHECK(cufftPlan1d(&plan, N, CUFFT_R2C, 1));
    CUFFT_CHECK(cufftExecR2C(plan, dreal, dspec));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(spec, dspec, sizeof spec, cudaMemcpyDeviceToHost));
    print_complex("R2C", spec, N / 2 + 1);
    CUFFT_CHECK(cufftDestroy(plan));

    CHECK(cudaFree(dx));
    CHECK(cudaFree(dreal));
    CHECK(cudaFree(dspec));
    printf("done\n");
    return 0;
}
