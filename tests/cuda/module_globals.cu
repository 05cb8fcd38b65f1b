// Module-scope variables: initialised, uninitialised and constant.
__device__ int counter = 42;
__device__ int uninit[4];
__constant__ int table[8] = {1, 2, 3, 5, 8, 13, 21, 34};

// One thread reads and updates the globals through their symbols. The host
// also passes their addresses: out[0] gets a bit per address that matches the
// symbol (7 when all do), which lets the reference kernel (kernels.rs
// `update_globals`) reach the same memory through the pointers.
// Then out[1 + i] = table[i] * counter, counter += 1, uninit[i] = counter * (i + 1).
extern "C" __global__ void update_globals(int *counter_p, const int *table_p, int *uninit_p, int *out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    out[0] = (counter_p == &counter) | (table_p == table) << 1 | (uninit_p == uninit) << 2;
    for (int i = 0; i < 8; i++) out[1 + i] = table[i] * counter;
    counter += 1;
    for (int i = 0; i < 4; i++) uninit[i] = counter * (i + 1);
}

// Never launched: present so that cuModuleGetFunctionCount counts two.
extern "C" __global__ void reset_globals() { counter = 0; }
