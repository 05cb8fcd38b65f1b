// Checks shared by the driver-API and runtime-API test programs.
#pragma once

#include <cstdio>
#include <cstdlib>

// Stops the program when a result is not what it must be.
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fflush(stdout);                                                     \
            fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static inline const char *yes_no(bool b) { return b ? "yes" : "no"; }
