// bandwidth: copy bandwidth from pinned and pageable host memory, both
// ways, and the time a launch takes, as a program sees them. Its figures
// depend on the machine, so it has no expected output: the GPU suite runs it
// natively and in a VM guest in turns and compares the medians. Every copy's
// bytes are checked once, after the timed rounds, so a copy that moved
// nothing cannot report a bandwidth.
//
// Usage: bandwidth [MIB [ROUNDS]]   (default 256 MiB, 5 rounds)
#include "common.h"

#include <algorithm>
#include <chrono>
#include <vector>

EMBED(vector_add_fatbin, "vector_add.fatbin");

static double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Prints the median of `samples` (seconds for `bytes`, or per call when
// `bytes` is 0) with their range.
static void report(const char *what, std::vector<double> samples, size_t bytes) {
    std::sort(samples.begin(), samples.end());
    double median = samples[samples.size() / 2];
    auto value = [&](double s) { return bytes ? bytes / s / 1e9 : s * 1e6; };
    const char *unit = bytes ? "GB/s" : "us";
    // The fastest sample has the least time: for a bandwidth it is the maximum.
    double lo = value(bytes ? samples.back() : samples.front()), hi = value(bytes ? samples.front() : samples.back());
    printf("%-22s %10.2f %s  (median of %zu, %.2f-%.2f)\n", what, value(median), unit, samples.size(), lo, hi);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], nullptr, 10) : 256;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    EXPECT(mib > 0 && rounds > 0, "usage: bandwidth [MIB [ROUNDS]]");
    size_t bytes = mib << 20;

    CUcontext ctx;
    init_primary(&ctx);
    CUdeviceptr dev;
    void *pinned;
    CHECK(cuMemAlloc(&dev, bytes));
    CHECK(cuMemAllocHost(&pinned, bytes));
    std::vector<unsigned char> pageable(bytes), back(bytes);
    fill_pattern(pinned, bytes, 1);
    fill_pattern(pageable.data(), bytes, 2);

    // One untimed copy each way first: the first touch of memory is not
    // what a copy costs.
    CHECK(cuMemcpyHtoD(dev, pinned, bytes));
    CHECK(cuMemcpyDtoH(pinned, dev, bytes));
    CHECK(cuMemcpyHtoD(dev, pageable.data(), bytes));
    CHECK(cuMemcpyDtoH(back.data(), dev, bytes));

    struct Copy {
        const char *what;
        bool to_device;
        void *host;
    } copies[] = {
        {"pinned HtoD", true, pinned},
        {"pinned DtoH", false, pinned},
        {"pageable HtoD", true, pageable.data()},
        {"pageable DtoH", false, back.data()},
    };
    for (const Copy &c : copies) {
        std::vector<double> samples;
        for (int r = 0; r < rounds; r++) {
            double t0 = now_s();
            if (c.to_device)
                CHECK(cuMemcpyHtoD(dev, c.host, bytes));
            else
                CHECK(cuMemcpyDtoH(c.host, dev, bytes));
            samples.push_back(now_s() - t0);
        }
        char what[64];
        snprintf(what, sizeof what, "%s %zu MiB", c.what, mib);
        report(what, samples, bytes);
    }

    // The bytes: the pinned pattern through the device and back.
    fill_pattern(pinned, bytes, 3);
    CHECK(cuMemcpyHtoD(dev, pinned, bytes));
    CHECK(cuMemcpyDtoH(back.data(), dev, bytes));
    EXPECT(memcmp(back.data(), pinned, bytes) == 0, "pinned bytes differ after a round trip");
    CHECK(cuMemcpyHtoD(dev, pageable.data(), bytes));
    CHECK(cuMemcpyDtoH(pinned, dev, bytes));
    EXPECT(memcmp(pageable.data(), pinned, bytes) == 0, "pageable bytes differ after a round trip");
    printf("content ok\n");

    // A small launch, waited for, and a run of them waited for once.
    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, vector_add_fatbin));
    CHECK(cuModuleGetFunction(&fn, mod, "vector_add"));
    CUdeviceptr d = dev;
    int n = 256;
    void *params[] = {&d, &d, &d, &n};
    const int launches = 200;
    std::vector<double> waited, queued;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_s();
        for (int i = 0; i < launches; i++) {
            CHECK(cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
            CHECK(cuCtxSynchronize());
        }
        waited.push_back((now_s() - t0) / launches);
        t0 = now_s();
        for (int i = 0; i < launches; i++) CHECK(cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
        CHECK(cuCtxSynchronize());
        queued.push_back((now_s() - t0) / launches);
    }
    report("launch + sync", waited, 0);
    report("launch (queued)", queued, 0);

    CHECK(cuModuleUnload(mod));
    CHECK(cuMemFreeHost(pinned));
    CHECK(cuMemFree(dev));
    return 0;
}
