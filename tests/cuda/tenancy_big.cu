// A module whose globals take 1.5 GiB of device memory when loaded.
__device__ char big_global[1536ull << 20];

extern "C" __global__ void touch_big(unsigned long long i) { big_global[i] = 1; }
