// module_globals: __device__ and __constant__ variables through
// cuModuleGetGlobal (including its NULL out-pointer forms), copies to and
// from them, a kernel that reads and updates them; then the same through the
// library API (cuLibrary*, cuKernelGetFunction), whose globals are separate.
#include "common.h"

EMBED(module_globals_fatbin, "module_globals.fatbin");

struct Globals {
    CUdeviceptr counter, table, uninit;
};

static void print_ints(const char *what, CUdeviceptr d, int n) {
    int v[8];
    CHECK(cuMemcpyDtoH(v, d, n * sizeof(int)));
    printf("%s:", what);
    for (int i = 0; i < n; i++) printf(" %d", v[i]);
    printf("\n");
}

// Launches update_globals through `fn` and prints what it reported and left.
static void run_update(const char *tag, CUfunction fn, const Globals &g, CUdeviceptr out) {
    CUdeviceptr counter = g.counter, table = g.table, uninit = g.uninit;
    void *params[] = {&counter, &table, &uninit, &out};
    CHECK(cuMemsetD32(out, 0, 9));
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
    CHECK(cuCtxSynchronize());
    int o[9];
    CHECK(cuMemcpyDtoH(o, out, sizeof o));
    printf("%s: addresses match=%d products:", tag, o[0]);
    for (int i = 1; i < 9; i++) printf(" %d", o[i]);
    printf("\n");
    print_ints("  counter", g.counter, 1);
    print_ints("  uninit", g.uninit, 4);
}

static Globals module_globals(CUmodule mod) {
    Globals g;
    size_t bytes;
    CHECK(cuModuleGetGlobal(&g.counter, &bytes, mod, "counter"));
    printf("counter: %zu bytes\n", bytes);
    CHECK(cuModuleGetGlobal(&g.table, &bytes, mod, "table"));
    printf("table: %zu bytes\n", bytes);
    CHECK(cuModuleGetGlobal(&g.uninit, &bytes, mod, "uninit"));
    printf("uninit: %zu bytes\n", bytes);
    return g;
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, 9 * sizeof(int)));

    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, module_globals_fatbin));
    unsigned count;
    CHECK(cuModuleGetFunctionCount(&count, mod));
    printf("cuModuleGetFunctionCount: %u\n", count);
    Globals g = module_globals(mod);

    // The NULL out-pointer forms.
    CUdeviceptr addr = 0;
    size_t bytes = 0;
    CHECK(cuModuleGetGlobal(&addr, nullptr, mod, "counter"));
    printf("address only, same address: %s\n", yes_no(addr == g.counter));
    CHECK(cuModuleGetGlobal(nullptr, &bytes, mod, "table"));
    printf("size only: %zu bytes\n", bytes);
    printf("both NULL: %s\n", err_name(cuModuleGetGlobal(nullptr, nullptr, mod, "counter")));
    printf("missing name: %s\n", err_name(cuModuleGetGlobal(&addr, &bytes, mod, "no_such_global")));

    print_ints("initial counter", g.counter, 1);
    print_ints("initial table", g.table, 8);
    print_ints("initial uninit", g.uninit, 4);

    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, "update_globals"));
    int hundred = 100;
    CHECK(cuMemcpyHtoD(g.counter, &hundred, sizeof hundred));
    run_update("module launch 1", fn, g, out);
    const int table[8] = {-1, -2, -3, -4, 10, 20, 30, 40};
    CHECK(cuMemcpyHtoD(g.table, table, sizeof table));
    run_update("module launch 2", fn, g, out);

    // The library API: a library's globals are its own, initialised again.
    CUlibrary lib;
    CUkernel kernel;
    CHECK(cuLibraryLoadData(&lib, module_globals_fatbin, nullptr, nullptr, 0, nullptr, nullptr, 0));
    CHECK(cuLibraryGetKernelCount(&count, lib));
    printf("cuLibraryGetKernelCount: %u\n", count);
    CHECK(cuLibraryGetKernel(&kernel, lib, "update_globals"));
    Globals lg;
    CHECK(cuLibraryGetGlobal(&lg.counter, &bytes, lib, "counter"));
    printf("library counter: %zu bytes, distinct from the module's: %s\n", bytes,
           yes_no(lg.counter != g.counter));
    CHECK(cuLibraryGetGlobal(&lg.table, &bytes, lib, "table"));
    CHECK(cuLibraryGetGlobal(&lg.uninit, &bytes, lib, "uninit"));
    print_ints("library initial counter", lg.counter, 1);

    CUmodule lib_mod;
    CHECK(cuLibraryGetModule(&lib_mod, lib));
    CHECK(cuModuleGetGlobal(&addr, &bytes, lib_mod, "counter"));
    printf("library module global is the library's: %s\n", yes_no(addr == lg.counter));

    CUfunction kfn;
    CHECK(cuKernelGetFunction(&kfn, kernel));
    run_update("library launch via cuKernelGetFunction", kfn, lg, out);
    // The runtime passes a CUkernel where a CUfunction is expected.
    run_update("library launch via CUkernel", (CUfunction)kernel, lg, out);
    print_ints("module counter unchanged", g.counter, 1);

    CHECK(cuLibraryUnload(lib));
    CHECK(cuModuleUnload(mod));
    CHECK(cuMemFree(out));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
