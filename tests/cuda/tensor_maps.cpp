// tensor_maps: TMA descriptors encoded as Hopper programs and compilers
// (Triton, XLA, CUTLASS) encode them: a tiled 2D map of floats over a
// device buffer, its address replaced; an im2col map of a 4D image; and
// what the driver documents as invalid refused: a global stride not a
// multiple of 16, a rank over 5, a misaligned address, a box too wide;
// the same map encoded again.
#include "common.h"

static const char *status(CUresult rc) { return err_name(rc); }

int main() {
    CUcontext ctx;
    init_primary(&ctx);
    const cuuint64_t rows = 512, cols = 1024;
    CUdeviceptr buf, other;
    CHECK(cuMemAlloc(&buf, rows * cols * sizeof(float)));
    CHECK(cuMemAlloc(&other, rows * cols * sizeof(float)));

    CUtensorMap map;
    cuuint64_t dims[2] = {cols, rows};
    cuuint64_t strides[1] = {cols * sizeof(float)};
    cuuint32_t box[2] = {32, 32};
    cuuint32_t elem[2] = {1, 1};
    auto tiled = [&](CUdeviceptr at, cuuint32_t rank) {
        return cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, (void *)at, dims, strides, box,
                                      elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    };
    printf("a tiled 2D map: %s\n", status(tiled(buf, 2)));
    // Encoded again (gpuplex keeps encodings): the same bytes for the same
    // parameters, others for another address.
    CUtensorMap first = map, second;
    CHECK(tiled(other, 2));
    second = map;
    CHECK(tiled(buf, 2));
    bool same = memcmp(&map, &first, sizeof map) == 0;
    bool differs = memcmp(&second, &first, sizeof map) != 0;
    printf("encoded again: the same bytes %s; for another buffer other bytes %s\n", same ? "yes" : "no",
           differs ? "yes" : "no");
    printf("its address replaced: %s\n", status(cuTensorMapReplaceAddress(&map, (void *)other)));
    printf("replaced by a misaligned one: %s\n", status(cuTensorMapReplaceAddress(&map, (void *)(other + 8))));

    strides[0] = cols * sizeof(float) + 4;
    printf("a stride not a multiple of 16: %s\n", status(tiled(buf, 2)));
    strides[0] = cols * sizeof(float);
    printf("a misaligned address: %s\n", status(tiled(buf + 8, 2)));
    box[0] = 512;
    printf("a box over 256 wide: %s\n", status(tiled(buf, 2)));
    box[0] = 32;
    cuuint64_t many[6] = {4, 4, 4, 4, 4, 4};
    cuuint64_t many_strides[5] = {16, 64, 256, 1024, 4096};
    cuuint32_t many_box[6] = {4, 4, 4, 4, 4, 4}, many_elem[6] = {1, 1, 1, 1, 1, 1};
    CUresult rc = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 6, (void *)buf, many, many_strides,
                                         many_box, many_elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    printf("rank 6: %s\n", status(rc));

    // An NHWC image of 16 channels, 32x32 pixels, 2 images; 64 pixels of
    // all channels per copy, from a 3x3 window's corners.
    cuuint64_t image[4] = {16, 32, 32, 2};
    cuuint64_t image_strides[3] = {16 * 4, 16 * 4 * 32, 16 * 4 * 32 * 32};
    int lower[2] = {-1, -1}, upper[2] = {-1, -1};
    cuuint32_t image_elem[4] = {1, 1, 1, 1};
    rc = cuTensorMapEncodeIm2col(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, (void *)buf, image, image_strides, lower,
                                 upper, 16, 64, image_elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    printf("an im2col 4D map: %s\n", status(rc));

    CHECK(cuMemFree(buf));
    CHECK(cuMemFree(other));
    printf("done\n");
    return 0;
}
