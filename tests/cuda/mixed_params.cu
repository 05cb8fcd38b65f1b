// One parameter of each kind; every value received goes back to the host as
// a 64-bit slot of `out` (layout in mixed_params.cpp, reference in kernels.rs
// `mixed_params`).
struct Pod {
    int a;
    double b;
    char c[5];
};

extern "C" __global__ void mixed_params(char c, short s, int i, double d, Pod p, float *f,
                                        int *ip, unsigned long long u, unsigned long long *out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned long long packed = 0;
    for (int k = 0; k < 5; k++) packed |= (unsigned long long)(unsigned char)p.c[k] << (8 * k);
    out[0] = (long long)c;
    out[1] = (long long)s;
    out[2] = (long long)i;
    out[3] = __double_as_longlong(d);
    out[4] = (long long)p.a;
    out[5] = __double_as_longlong(p.b);
    out[6] = packed;
    out[7] = (unsigned long long)f;
    out[8] = (unsigned long long)ip;
    out[9] = u;
    out[10] = __float_as_uint(f[0]);
    out[11] = (long long)ip[0];
}
