// memsets: cuMemsetD8/D16/D32, their Async forms, and the 2D forms on a
// pitched allocation and on pinned host memory. A host mirror gets every memset too; after each one the
// whole allocation is read back and compared with it, so bytes a memset must
// not touch are checked as well.
#include "common.h"

#include <vector>

static const size_t LINEAR = (1u << 20) + 11;
static const size_t WIDTH = 1000, HEIGHT = 37; // bytes per row, rows

// The memset as the driver must perform it, applied to the mirror.
static void mirror_set(unsigned char *m, size_t pitch, unsigned value, unsigned elem,
                       size_t width, size_t height) {
    for (size_t r = 0; r < height; r++)
        for (size_t i = 0; i < width; i++)
            memcpy(m + r * pitch + i * elem, &value, elem);
}

static void check_linear(CUdeviceptr d, const std::vector<unsigned char> &want, const char *what) {
    std::vector<unsigned char> got(want.size());
    CHECK(cuMemcpyDtoH(got.data(), d, got.size()));
    EXPECT(got == want, "%s: content differs", what);
    printf("%s ok checksum=%016llx\n", what, (unsigned long long)checksum(got.data(), got.size()));
}

// Compares all pitch * HEIGHT bytes; the checksum covers the WIDTH bytes of
// each row only, since the pitch is the device's choice.
static void check_pitched(CUdeviceptr d, size_t pitch, const std::vector<unsigned char> &want,
                          const char *what) {
    std::vector<unsigned char> got(want.size()), rows(WIDTH * HEIGHT);
    CHECK(cuMemcpyDtoH(got.data(), d, got.size()));
    EXPECT(got == want, "%s: content differs", what);
    for (size_t r = 0; r < HEIGHT; r++) memcpy(&rows[r * WIDTH], &got[r * pitch], WIDTH);
    printf("%s ok checksum=%016llx\n", what, (unsigned long long)checksum(rows.data(), rows.size()));
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    CUstream s;
    // Blocking, so that it is ordered after the synchronous memsets, which
    // may return before they finish.
    CHECK(cuStreamCreate(&s, CU_STREAM_DEFAULT));

    // Linear memory, at offsets that keep each element size aligned.
    std::vector<unsigned char> want(LINEAR);
    fill_pattern(want.data(), LINEAR, 1);
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, LINEAR));
    CHECK(cuMemcpyHtoD(d, want.data(), LINEAR));
    check_linear(d, want, "initial pattern");

    CHECK(cuMemsetD8(d + 1, 0xA5, LINEAR - 2));
    mirror_set(&want[1], 0, 0xA5, 1, LINEAR - 2, 1);
    check_linear(d, want, "cuMemsetD8");
    CHECK(cuMemsetD16(d + 2, 0xBEEF, (LINEAR - 4) / 2));
    mirror_set(&want[2], 0, 0xBEEF, 2, (LINEAR - 4) / 2, 1);
    check_linear(d, want, "cuMemsetD16");
    CHECK(cuMemsetD32(d + 4, 0xDEADBEEF, (LINEAR - 8) / 4));
    mirror_set(&want[4], 0, 0xDEADBEEF, 4, (LINEAR - 8) / 4, 1);
    check_linear(d, want, "cuMemsetD32");

    CHECK(cuMemsetD8Async(d, 0x11, 3, s));
    CHECK(cuStreamSynchronize(s));
    mirror_set(&want[0], 0, 0x11, 1, 3, 1);
    check_linear(d, want, "cuMemsetD8Async stream");
    CHECK(cuMemsetD16Async(d + 6, 0x1234, 1000, nullptr));
    CHECK(cuStreamSynchronize(nullptr));
    mirror_set(&want[6], 0, 0x1234, 2, 1000, 1);
    check_linear(d, want, "cuMemsetD16Async null-stream");
    CHECK(cuMemsetD32Async(d + 8, 0xCAFEF00D, 12345, s));
    CHECK(cuStreamSynchronize(s));
    mirror_set(&want[8], 0, 0xCAFEF00D, 4, 12345, 1);
    check_linear(d, want, "cuMemsetD32Async stream");
    CHECK(cuMemFree(d));

    // Pitched memory: each row starts as its own pattern, so the compared
    // bytes do not depend on the pitch.
    size_t pitch;
    CHECK(cuMemAllocPitch(&d, &pitch, WIDTH, HEIGHT, 4));
    printf("pitch >= width: %s\n", yes_no(pitch >= WIDTH));
    want.assign(pitch * HEIGHT, 0);
    for (size_t r = 0; r < HEIGHT; r++) fill_pattern(&want[r * pitch], pitch, 100 + r);
    CHECK(cuMemcpyHtoD(d, want.data(), want.size()));
    check_pitched(d, pitch, want, "initial rows");

    CHECK(cuMemsetD2D8(d + 1, pitch, 0x5A, WIDTH - 3, HEIGHT));
    mirror_set(&want[1], pitch, 0x5A, 1, WIDTH - 3, HEIGHT);
    check_pitched(d, pitch, want, "cuMemsetD2D8");
    CHECK(cuMemsetD2D16(d + 2, pitch, 0x1357, 400, 20));
    mirror_set(&want[2], pitch, 0x1357, 2, 400, 20);
    check_pitched(d, pitch, want, "cuMemsetD2D16");
    CHECK(cuMemsetD2D32(d + 3 * pitch + 8, pitch, 0x89ABCDEF, 200, 30));
    mirror_set(&want[3 * pitch + 8], pitch, 0x89ABCDEF, 4, 200, 30);
    check_pitched(d, pitch, want, "cuMemsetD2D32");

    CHECK(cuMemsetD2D8Async(d + 5 * pitch, pitch, 0x77, WIDTH, 2, s));
    CHECK(cuStreamSynchronize(s));
    mirror_set(&want[5 * pitch], pitch, 0x77, 1, WIDTH, 2);
    check_pitched(d, pitch, want, "cuMemsetD2D8Async stream");
    CHECK(cuMemsetD2D16Async(d + 10 * pitch + 100, pitch, 0xFFFF, 7, 27, nullptr));
    CHECK(cuStreamSynchronize(nullptr));
    mirror_set(&want[10 * pitch + 100], pitch, 0xFFFF, 2, 7, 27);
    check_pitched(d, pitch, want, "cuMemsetD2D16Async null-stream");
    CHECK(cuMemsetD2D32Async(d, pitch, 0, WIDTH / 4, HEIGHT, s));
    CHECK(cuStreamSynchronize(s));
    mirror_set(&want[0], pitch, 0, 4, WIDTH / 4, HEIGHT);
    check_pitched(d, pitch, want, "cuMemsetD2D32Async stream");

    CHECK(cuMemFree(d));

    // Pinned host memory, which the device reaches too: memsets land in
    // their stream's order, after a copy into the same memory queued before.
    const size_t HOST = 3 * 4096 + 100;
    unsigned char *h;
    CHECK(cuMemHostAlloc((void **)&h, HOST, 0));
    want.assign(HOST, 0);
    fill_pattern(want.data(), HOST, 7);
    CHECK(cuMemAlloc(&d, HOST));
    CHECK(cuMemcpyHtoD(d, want.data(), HOST));
    memset(h, 0, HOST);
    CHECK(cuMemcpyDtoHAsync(h, d, HOST, s));
    CHECK(cuMemsetD32Async((CUdeviceptr)h + 8, 0x01020304, 2, s));
    CHECK(cuMemsetD8Async((CUdeviceptr)h + 4097, 0xEE, 999, s));
    CHECK(cuMemsetD2D16Async((CUdeviceptr)h + 2 * 4096, 64, 0xABCD, 10, 5, s));
    CHECK(cuStreamSynchronize(s));
    mirror_set(&want[8], 0, 0x01020304, 4, 2, 1);
    mirror_set(&want[4097], 0, 0xEE, 1, 999, 1);
    mirror_set(&want[2 * 4096], 64, 0xABCD, 2, 10, 5);
    EXPECT(memcmp(h, want.data(), HOST) == 0, "pinned host memsets: content differs");
    printf("pinned host memsets ok checksum=%016llx\n", (unsigned long long)checksum(h, HOST));
    CHECK(cuMemFreeHost(h));
    CHECK(cuMemFree(d));
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("done\n");
    return 0;
}
