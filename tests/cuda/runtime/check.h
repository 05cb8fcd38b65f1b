// Helpers shared by the runtime-API test programs: checked calls and checked
// results. Included as "check.h", so `nvcc NAME.cu` builds any program here.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// Stops the program at the first failed runtime call, naming it.
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            fflush(stdout);                                                     \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__,       \
                    #call, cudaGetErrorName(err_));                             \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

// Checks a <<<>>> launch: its configuration, then (on the device) its run.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

#include "../expect.h"
