// mixed_params: a kernel with parameters of every size and alignment,
// including a struct by value; the device echoes what it received. Also the
// parameter layout as cuFuncGetParamInfo reports it.
#include "common.h"

EMBED(mixed_params_fatbin, "mixed_params.fatbin");

struct Pod {
    int a;
    double b;
    char c[5];
};

static uint64_t bits(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, mixed_params_fatbin));
    CHECK(cuModuleGetFunction(&fn, mod, "mixed_params"));

    for (size_t i = 0;; i++) {
        size_t offset = 0, size = 0;
        CUresult rc = cuFuncGetParamInfo(fn, i, &offset, &size);
        if (rc == CUDA_ERROR_INVALID_VALUE) {
            printf("param %zu: %s\n", i, err_name(rc));
            break;
        }
        CHECK(rc);
        printf("param %zu: offset=%zu size=%zu\n", i, offset, size);
    }

    float fval = 2.5f;
    int ival = -99;
    CUdeviceptr f, ip, out;
    CHECK(cuMemAlloc(&f, sizeof fval));
    CHECK(cuMemAlloc(&ip, sizeof ival));
    CHECK(cuMemAlloc(&out, 12 * sizeof(uint64_t)));
    CHECK(cuMemcpyHtoD(f, &fval, sizeof fval));
    CHECK(cuMemcpyHtoD(ip, &ival, sizeof ival));
    CHECK(cuMemsetD8(out, 0, 12 * sizeof(uint64_t)));

    char c = -7;
    short s = -1234;
    int i = 123456789;
    double d = 3.25;
    Pod p = {-42, 1.5e300, {'a', 'b', 'c', 'd', 'e'}};
    unsigned long long u = 0xFEDCBA9876543210ull;
    void *params[] = {&c, &s, &i, &d, &p, &f, &ip, &u, &out};
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
    CHECK(cuCtxSynchronize());

    uint64_t o[12];
    CHECK(cuMemcpyDtoH(o, out, sizeof o));
    char pc[6] = {0};
    for (int k = 0; k < 5; k++) pc[k] = (char)(o[6] >> (8 * k));
    float fgot;
    uint32_t fbits = (uint32_t)o[10];
    memcpy(&fgot, &fbits, 4);
    double dgot, pbgot;
    memcpy(&dgot, &o[3], 8);
    memcpy(&pbgot, &o[5], 8);

    printf("char=%lld short=%lld int=%lld\n", (long long)o[0], (long long)o[1], (long long)o[2]);
    printf("double=%.17g (bits %s)\n", dgot, o[3] == bits(d) ? "exact" : "differ");
    printf("struct a=%lld b=%.17g c=\"%s\"\n", (long long)o[4], pbgot, pc);
    printf("float* same pointer: %s, *f=%g\n", yes_no(o[7] == f), fgot);
    printf("int* same pointer: %s, *ip=%lld\n", yes_no(o[8] == ip), (long long)o[11]);
    printf("unsigned long long=%016llx\n", (unsigned long long)o[9]);

    EXPECT((long long)o[0] == c && (long long)o[1] == s && (long long)o[2] == i, "integers");
    EXPECT(o[3] == bits(d) && (long long)o[4] == p.a && o[5] == bits(p.b), "struct and double");
    EXPECT(memcmp(pc, p.c, 5) == 0 && o[7] == f && o[8] == ip, "chars and pointers");
    EXPECT(o[9] == u && fgot == fval && (long long)o[11] == ival, "u64 and pointees");

    CHECK(cuMemFree(f));
    CHECK(cuMemFree(ip));
    CHECK(cuMemFree(out));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
