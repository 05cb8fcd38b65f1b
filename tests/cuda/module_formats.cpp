// module_formats: one kernel loaded from every image format the driver takes
// (fatbin, cubin, PTX, with and without JIT options, and from a file), and
// run from each.
#include "common.h"

#include <unistd.h>

#include <vector>

EMBED(fatbin, "vector_add.fatbin");
EMBED(cubin_sm75, "vector_add.sm_75.cubin");
EMBED(cubin_sm90, "vector_add.sm_90.cubin");
EMBED(ptx, "vector_add.ptx");

static const int N = 4099;

// Runs vector_add from `mod` and checks it; returns after unloading `mod`.
static void run_and_unload(const char *format, CUmodule mod) {
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, "vector_add"));
    std::vector<float> a(N), b(N), c(N);
    for (int i = 0; i < N; i++) a[i] = (float)i, b[i] = (float)(2 * i) + 0.5f;
    size_t bytes = N * sizeof(float);
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc(&da, bytes));
    CHECK(cuMemAlloc(&db, bytes));
    CHECK(cuMemAlloc(&dc, bytes));
    CHECK(cuMemcpyHtoD(da, a.data(), bytes));
    CHECK(cuMemcpyHtoD(db, b.data(), bytes));
    int n = N;
    void *params[] = {&da, &db, &dc, &n};
    CHECK(cuLaunchKernel(fn, (N + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
    CHECK(cuMemcpyDtoH(c.data(), dc, bytes));
    for (int i = 0; i < N; i++) EXPECT(c[i] == a[i] + b[i], "%s: c[%d] = %g", format, i, c[i]);
    printf("%s: ok checksum=%016llx\n", format, (unsigned long long)checksum(c.data(), bytes));
    CHECK(cuMemFree(da));
    CHECK(cuMemFree(db));
    CHECK(cuMemFree(dc));
    CHECK(cuModuleUnload(mod));
}

// Writes an image to a temporary file and loads it with cuModuleLoad.
static void load_from_file(const char *format, const unsigned char *image, size_t size) {
    char path[] = "/tmp/gpuplex-module-XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0, "mkstemp");
    EXPECT(write(fd, image, size) == (ssize_t)size, "write %s", path);
    close(fd);
    CUmodule mod;
    CUresult rc = cuModuleLoad(&mod, path);
    unlink(path);
    CHECK(rc);
    run_and_unload(format, mod);
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    CUmodule mod;

    CHECK(cuModuleLoadData(&mod, fatbin));
    run_and_unload("fatbin cuModuleLoadData", mod);
    CHECK(cuModuleLoadFatBinary(&mod, fatbin));
    run_and_unload("fatbin cuModuleLoadFatBinary", mod);

    // SASS runs only on its own architecture: pick the cubin the device reports.
    int major, minor;
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    const unsigned char *cubin, *cubin_end;
    if (major == 9 && minor == 0) {
        cubin = cubin_sm90, cubin_end = cubin_sm90_end;
    } else if (major == 7 && minor == 5) {
        cubin = cubin_sm75, cubin_end = cubin_sm75_end;
    } else {
        fprintf(stderr, "no cubin built for sm_%d%d (only sm_75, sm_90)\n", major, minor);
        return 1;
    }
    CHECK(cuModuleLoadData(&mod, cubin));
    run_and_unload("cubin cuModuleLoadData", mod);

    CHECK(cuModuleLoadData(&mod, ptx));
    run_and_unload("ptx cuModuleLoadData", mod);
    CHECK(cuModuleLoadDataEx(&mod, ptx, 0, nullptr, nullptr));
    run_and_unload("ptx cuModuleLoadDataEx no options", mod);

    // JIT options: the logs are the device's business; only their use is checked.
    char info[4096] = {0}, error[4096] = {0};
    CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                           CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                           CU_JIT_LOG_VERBOSE, CU_JIT_OPTIMIZATION_LEVEL};
    void *values[] = {info, (void *)(uintptr_t)sizeof info, error, (void *)(uintptr_t)sizeof error,
                      (void *)(uintptr_t)1, (void *)(uintptr_t)3};
    CHECK(cuModuleLoadDataEx(&mod, ptx, 6, opts, values));
    printf("error log empty: %s\n", yes_no(error[0] == 0));
    run_and_unload("ptx cuModuleLoadDataEx with JIT options", mod);

    // Linking: the PTX through the JIT linker, from memory and from a
    // file, the image it makes loaded; input that is not PTX refused with
    // a log saying why.
    char link_error[4096] = {0};
    CUjit_option link_opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                                CU_JIT_OPTIMIZATION_LEVEL};
    void *link_values[] = {link_error, (void *)(uintptr_t)sizeof link_error, (void *)(uintptr_t)3};
    CUlinkState link;
    CHECK(cuLinkCreate(3, link_opts, link_values, &link));
    CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)ptx, ptx_end - ptx, "vector_add.ptx", 0, nullptr, nullptr));
    void *linked;
    size_t linked_size = 0;
    CHECK(cuLinkComplete(link, &linked, &linked_size));
    printf("linked: an image: %s\n", yes_no(linked != nullptr && linked_size > 0));
    CHECK(cuModuleLoadData(&mod, linked));
    CHECK(cuLinkDestroy(link));
    run_and_unload("ptx cuLinkAddData", mod);

    char ptx_path[] = "/tmp/gpuplex-link-XXXXXX";
    int fd = mkstemp(ptx_path);
    EXPECT(fd >= 0 && write(fd, ptx, ptx_end - ptx) == (ssize_t)(ptx_end - ptx), "write %s", ptx_path);
    close(fd);
    CHECK(cuLinkCreate(0, nullptr, nullptr, &link));
    CUresult rc = cuLinkAddFile(link, CU_JIT_INPUT_PTX, ptx_path, 0, nullptr, nullptr);
    unlink(ptx_path);
    CHECK(rc);
    CHECK(cuLinkComplete(link, &linked, &linked_size));
    CHECK(cuModuleLoadData(&mod, linked));
    CHECK(cuLinkDestroy(link));
    run_and_unload("ptx cuLinkAddFile", mod);

    static const char not_ptx[] = "this is not PTX";
    link_values[1] = (void *)(uintptr_t)sizeof link_error;  // the last link wrote back how much it filled
    CHECK(cuLinkCreate(3, link_opts, link_values, &link));
    rc = cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)not_ptx, sizeof not_ptx, "bad", 0, nullptr, nullptr);
    if (rc == CUDA_SUCCESS) rc = cuLinkComplete(link, &linked, &linked_size);
    printf("link of bad PTX: %s, error log says why: %s\n", err_name(rc), yes_no(link_error[0] != 0));
    CHECK(cuLinkDestroy(link));

    load_from_file("fatbin cuModuleLoad", fatbin, fatbin_end - fatbin);
    load_from_file("cubin cuModuleLoad", cubin, cubin_end - cubin);
    load_from_file("ptx cuModuleLoad", ptx, ptx_end - ptx);

    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
