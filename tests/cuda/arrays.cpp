// arrays: 2D and 3D copies and CUDA arrays as image-processing programs use
// them: an image copied into pitched memory and back with padding rows
// left alone; an unaligned sub-rectangle copied inside device memory; 2D,
// 3D, layered and 1D arrays filled from the host, from device memory and
// from each other, and read back; copies from pinned memory on a stream;
// an image larger than one copy chunk; texture objects over an array, over
// pitched and over linear memory, a surface object, their descriptors read
// back; a mipmapped array's levels filled and read back. Every result is
// compared with what the host computes.
#include "common.h"

#include <vector>

static bool same(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

// Copies a width x height block between two host images of the given pitches.
static void host_copy_2d(unsigned char *dst, size_t dst_pitch, const unsigned char *src, size_t src_pitch, size_t width,
                         size_t height) {
    for (size_t y = 0; y < height; y++) memcpy(dst + y * dst_pitch, src + y * src_pitch, width);
}

static CUDA_MEMCPY2D copy_2d(size_t width, size_t height) {
    CUDA_MEMCPY2D c = {};
    c.WidthInBytes = width;
    c.Height = height;
    return c;
}

static void host_end(CUDA_MEMCPY2D &c, bool src, const void *p, size_t pitch) {
    if (src) {
        c.srcMemoryType = CU_MEMORYTYPE_HOST, c.srcHost = p, c.srcPitch = pitch;
    } else {
        c.dstMemoryType = CU_MEMORYTYPE_HOST, c.dstHost = (void *)p, c.dstPitch = pitch;
    }
}

static void device_end(CUDA_MEMCPY2D &c, bool src, CUdeviceptr p, size_t pitch) {
    if (src) {
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE, c.srcDevice = p, c.srcPitch = pitch;
    } else {
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE, c.dstDevice = p, c.dstPitch = pitch;
    }
}

static void array_end(CUDA_MEMCPY2D &c, bool src, CUarray a) {
    if (src) {
        c.srcMemoryType = CU_MEMORYTYPE_ARRAY, c.srcArray = a;
    } else {
        c.dstMemoryType = CU_MEMORYTYPE_ARRAY, c.dstArray = a;
    }
}

static void images(CUdevice) {
    const size_t W = 1000, H = 300, row = W * sizeof(float);
    std::vector<unsigned char> image(row * H), back(4096 * H);
    fill_pattern(image.data(), image.size(), 1);
    CUdeviceptr pitched;
    size_t pitch;
    CHECK(cuMemAllocPitch(&pitched, &pitch, row, H, 4));
    CUDA_MEMCPY2D c = copy_2d(row, H);
    host_end(c, true, image.data(), row);
    device_end(c, false, pitched, pitch);
    CHECK(cuMemcpy2D(&c));
    // Back into rows 4096 bytes apart, whose padding must stay as it was.
    memset(back.data(), 0xee, back.size());
    c = copy_2d(row, H);
    device_end(c, true, pitched, pitch);
    host_end(c, false, back.data(), 4096);
    CHECK(cuMemcpy2D(&c));
    std::vector<unsigned char> want(4096 * H, 0xee);
    host_copy_2d(want.data(), 4096, image.data(), row, row, H);
    printf("image to pitched memory and back into wider rows, padding untouched: %s\n",
           yes_no(same(back.data(), want.data(), want.size())));

    // A sub-rectangle at odd offsets, inside device memory, unaligned.
    CUdeviceptr other;
    CHECK(cuMemAlloc(&other, row * H));
    CHECK(cuMemsetD8(other, 0, row * H));
    c = copy_2d(333, 77);
    device_end(c, true, pitched, pitch);
    c.srcXInBytes = 5, c.srcY = 11;
    device_end(c, false, other, row);
    c.dstXInBytes = 17, c.dstY = 3;
    CHECK(cuMemcpy2DUnaligned(&c));
    std::vector<unsigned char> got(row * H), expect(row * H, 0);
    CHECK(cuMemcpyDtoH(got.data(), other, got.size()));
    host_copy_2d(expect.data() + 3 * row + 17, row, image.data() + 11 * row + 5, row, 333, 77);
    printf("an unaligned sub-rectangle between device images: %s\n", yes_no(same(got.data(), expect.data(), got.size())));

    // A 2D float array: from the host, to pitched memory, back to the host.
    CUDA_ARRAY_DESCRIPTOR ad = {};
    ad.Width = W, ad.Height = H, ad.Format = CU_AD_FORMAT_FLOAT, ad.NumChannels = 1;
    CUarray arr;
    CHECK(cuArrayCreate(&arr, &ad));
    CUDA_ARRAY_DESCRIPTOR ad_back;
    CHECK(cuArrayGetDescriptor(&ad_back, arr));
    printf("2D array descriptor: %zux%zu, format %#x, %u channel(s)\n", ad_back.Width, ad_back.Height,
           (unsigned)ad_back.Format, ad_back.NumChannels);
    c = copy_2d(row, H);
    host_end(c, true, image.data(), row);
    array_end(c, false, arr);
    CHECK(cuMemcpy2D(&c));
    CHECK(cuMemsetD8(pitched, 0, pitch * H));
    c = copy_2d(row, H);
    array_end(c, true, arr);
    device_end(c, false, pitched, pitch);
    CHECK(cuMemcpy2D(&c));
    std::vector<unsigned char> tight(row * H);
    c = copy_2d(row, H);
    device_end(c, true, pitched, pitch);
    host_end(c, false, tight.data(), row);
    CHECK(cuMemcpy2D(&c));
    printf("host to a 2D array, to pitched memory, to the host: %s\n", yes_no(same(tight.data(), image.data(), tight.size())));

    // Texture objects: over the array, over pitched memory, over linear memory.
    CUDA_RESOURCE_DESC rd = {};
    rd.resType = CU_RESOURCE_TYPE_ARRAY;
    rd.res.array.hArray = arr;
    CUDA_TEXTURE_DESC td = {};
    td.addressMode[0] = td.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
    td.filterMode = CU_TR_FILTER_MODE_POINT;
    CUtexObject tex_array, tex_pitched, tex_linear;
    CHECK(cuTexObjectCreate(&tex_array, &rd, &td, nullptr));
    CUDA_RESOURCE_DESC rd_back;
    CHECK(cuTexObjectGetResourceDesc(&rd_back, tex_array));
    printf("texture over the array: its resource is the array: %s\n",
           yes_no(rd_back.resType == CU_RESOURCE_TYPE_ARRAY && rd_back.res.array.hArray == arr));
    CUDA_TEXTURE_DESC td_back;
    CHECK(cuTexObjectGetTextureDesc(&td_back, tex_array));
    printf("its texture descriptor: clamp, point: %s\n",
           yes_no(td_back.addressMode[1] == CU_TR_ADDRESS_MODE_CLAMP && td_back.filterMode == CU_TR_FILTER_MODE_POINT));
    rd = {};
    rd.resType = CU_RESOURCE_TYPE_PITCH2D;
    rd.res.pitch2D.devPtr = pitched, rd.res.pitch2D.format = CU_AD_FORMAT_FLOAT, rd.res.pitch2D.numChannels = 1;
    rd.res.pitch2D.width = W, rd.res.pitch2D.height = H, rd.res.pitch2D.pitchInBytes = pitch;
    CHECK(cuTexObjectCreate(&tex_pitched, &rd, &td, nullptr));
    rd = {};
    rd.resType = CU_RESOURCE_TYPE_LINEAR;
    rd.res.linear.devPtr = other, rd.res.linear.format = CU_AD_FORMAT_UNSIGNED_INT32, rd.res.linear.numChannels = 1;
    rd.res.linear.sizeInBytes = row * H;
    CHECK(cuTexObjectCreate(&tex_linear, &rd, &td, nullptr));
    CHECK(cuTexObjectGetResourceDesc(&rd_back, tex_linear));
    printf("texture over linear memory: its resource comes back: %s\n",
           yes_no(rd_back.resType == CU_RESOURCE_TYPE_LINEAR && rd_back.res.linear.devPtr == other &&
                  rd_back.res.linear.sizeInBytes == row * H));
    CHECK(cuTexObjectDestroy(tex_array));
    CHECK(cuTexObjectDestroy(tex_pitched));
    CHECK(cuTexObjectDestroy(tex_linear));
    CHECK(cuArrayDestroy(arr));
    CHECK(cuMemFree(pitched));
    CHECK(cuMemFree(other));
}

static void volumes(CUdevice) {
    // A 3D array of uchar4: from the host, to 3D pitched memory with a
    // slice taller than the volume, to the host.
    const size_t W = 64, H = 48, D = 20, row = W * 4;
    CUDA_ARRAY3D_DESCRIPTOR ad = {};
    ad.Width = W, ad.Height = H, ad.Depth = D, ad.Format = CU_AD_FORMAT_UNSIGNED_INT8, ad.NumChannels = 4;
    CUarray vol;
    CHECK(cuArray3DCreate(&vol, &ad));
    CUDA_ARRAY3D_DESCRIPTOR ad_back;
    CHECK(cuArray3DGetDescriptor(&ad_back, vol));
    printf("3D array descriptor: %zux%zux%zu, %u channels\n", ad_back.Width, ad_back.Height, ad_back.Depth,
           ad_back.NumChannels);
    std::vector<unsigned char> volume(row * H * D), back(row * H * D);
    fill_pattern(volume.data(), volume.size(), 2);
    CUDA_MEMCPY3D c = {};
    c.srcMemoryType = CU_MEMORYTYPE_HOST, c.srcHost = volume.data(), c.srcPitch = row, c.srcHeight = H;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY, c.dstArray = vol;
    c.WidthInBytes = row, c.Height = H, c.Depth = D;
    CHECK(cuMemcpy3D(&c));
    const size_t pitch = 512, slice = H + 8;
    CUdeviceptr linear;
    CHECK(cuMemAlloc(&linear, pitch * slice * D));
    CHECK(cuMemsetD8(linear, 0, pitch * slice * D));
    c = {};
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY, c.srcArray = vol;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE, c.dstDevice = linear, c.dstPitch = pitch, c.dstHeight = slice;
    c.WidthInBytes = row, c.Height = H, c.Depth = D;
    CHECK(cuMemcpy3D(&c));
    c = {};
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE, c.srcDevice = linear, c.srcPitch = pitch, c.srcHeight = slice;
    c.dstMemoryType = CU_MEMORYTYPE_HOST, c.dstHost = back.data(), c.dstPitch = row, c.dstHeight = H;
    c.WidthInBytes = row, c.Height = H, c.Depth = D;
    CHECK(cuMemcpy3D(&c));
    printf("host to a 3D array, to 3D pitched memory, to the host: %s\n", yes_no(same(back.data(), volume.data(), back.size())));

    // A box inside the volume, from the array straight to the host.
    std::vector<unsigned char> box(16 * 4 * 10 * 5, 0), box_want(box.size());
    c = {};
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY, c.srcArray = vol, c.srcXInBytes = 8 * 4, c.srcY = 30, c.srcZ = 12;
    c.dstMemoryType = CU_MEMORYTYPE_HOST, c.dstHost = box.data(), c.dstPitch = 16 * 4, c.dstHeight = 10;
    c.WidthInBytes = 16 * 4, c.Height = 10, c.Depth = 5;
    CHECK(cuMemcpy3D(&c));
    for (size_t z = 0; z < 5; z++)
        for (size_t y = 0; y < 10; y++)
            memcpy(&box_want[(z * 10 + y) * 64], &volume[((12 + z) * H + 30 + y) * row + 32], 64);
    printf("a box from inside the 3D array: %s\n", yes_no(box == box_want));

    // A layered 2D array of three layers, filled from 3D pitched memory.
    CUDA_ARRAY3D_DESCRIPTOR ld = {};
    ld.Width = 32, ld.Height = 16, ld.Depth = 3, ld.Format = CU_AD_FORMAT_FLOAT, ld.NumChannels = 2;
    ld.Flags = CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST;
    CUarray layers;
    CHECK(cuArray3DCreate(&layers, &ld));
    CHECK(cuArray3DGetDescriptor(&ad_back, layers));
    printf("layered array: %zu layers, flags %#x\n", ad_back.Depth, ad_back.Flags);
    c = {};
    c.srcMemoryType = CU_MEMORYTYPE_DEVICE, c.srcDevice = linear, c.srcPitch = pitch, c.srcHeight = slice;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY, c.dstArray = layers;
    c.WidthInBytes = 32 * 8, c.Height = 16, c.Depth = 3;
    CHECK(cuMemcpy3D(&c));
    std::vector<unsigned char> layer(32 * 8 * 16), layer_want(layer.size());
    c = {};
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY, c.srcArray = layers, c.srcZ = 2;
    c.dstMemoryType = CU_MEMORYTYPE_HOST, c.dstHost = layer.data(), c.dstPitch = 32 * 8, c.dstHeight = 16;
    c.WidthInBytes = 32 * 8, c.Height = 16, c.Depth = 1;
    CHECK(cuMemcpy3D(&c));
    for (size_t y = 0; y < 16; y++) memcpy(&layer_want[y * 256], &volume[(2 * H + y) * row], 256);
    printf("the third layer, read back: %s\n", yes_no(layer == layer_want));

    CUDA_RESOURCE_DESC rd = {};
    rd.resType = CU_RESOURCE_TYPE_ARRAY;
    rd.res.array.hArray = layers;
    CUsurfObject surf;
    CHECK(cuSurfObjectCreate(&surf, &rd));
    CUDA_RESOURCE_DESC rd_back;
    CHECK(cuSurfObjectGetResourceDesc(&rd_back, surf));
    printf("surface over the layered array: its resource is the array: %s\n",
           yes_no(rd_back.resType == CU_RESOURCE_TYPE_ARRAY && rd_back.res.array.hArray == layers));
    CHECK(cuSurfObjectDestroy(surf));
    CHECK(cuArrayDestroy(layers));
    CHECK(cuArrayDestroy(vol));
    CHECK(cuMemFree(linear));
}

static void lines(CUdevice) {
    // A 1D array of 4096 uint32: linear copies at byte offsets, every way.
    const size_t N = 4096, bytes = N * 4;
    CUDA_ARRAY_DESCRIPTOR ad = {};
    ad.Width = N, ad.Height = 0, ad.Format = CU_AD_FORMAT_UNSIGNED_INT32, ad.NumChannels = 1;
    CUarray a, b;
    CHECK(cuArrayCreate(&a, &ad));
    CHECK(cuArrayCreate(&b, &ad));
    std::vector<unsigned char> data(bytes), back(bytes, 0), want(bytes, 0);
    fill_pattern(data.data(), bytes, 3);
    CHECK(cuMemcpyHtoA(a, 0, data.data(), bytes));
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, bytes));
    CHECK(cuMemsetD8(d, 0, bytes));
    CHECK(cuMemcpyAtoD(d + 64, a, 128, 2048));
    CHECK(cuMemcpyDtoA(b, 0, d, bytes));
    CHECK(cuMemcpyAtoA(b, 8192, a, 0, 4096));
    CHECK(cuMemcpyAtoH(back.data(), b, 0, bytes));
    memcpy(&want[64], &data[128], 2048);
    memcpy(&want[8192], &data[0], 4096);
    printf("1D arrays: host, device and array copies at offsets: %s\n", yes_no(back == want));
    CHECK(cuMemFree(d));
    CHECK(cuArrayDestroy(a));
    CHECK(cuArrayDestroy(b));
}

static void pinned_and_large(CUdevice) {
    // From pinned memory, asynchronously on a stream, into an array and back.
    const size_t W = 512, H = 64, row = W * 2;
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned char *pinned, *pinned_back;
    CHECK(cuMemAllocHost((void **)&pinned, row * H));
    CHECK(cuMemAllocHost((void **)&pinned_back, row * H));
    fill_pattern(pinned, row * H, 4);
    memset(pinned_back, 0, row * H);
    CUDA_ARRAY_DESCRIPTOR ad = {};
    ad.Width = W, ad.Height = H, ad.Format = CU_AD_FORMAT_HALF, ad.NumChannels = 1;
    CUarray arr;
    CHECK(cuArrayCreate(&arr, &ad));
    CUDA_MEMCPY2D c = copy_2d(row, H);
    host_end(c, true, pinned, row);
    array_end(c, false, arr);
    CHECK(cuMemcpy2DAsync(&c, s));
    c = copy_2d(row, H);
    array_end(c, true, arr);
    host_end(c, false, pinned_back, row);
    CHECK(cuMemcpy2DAsync(&c, s));
    CHECK(cuStreamSynchronize(s));
    printf("pinned memory to an array and back on a stream: %s\n", yes_no(same(pinned, pinned_back, row * H)));
    CHECK(cuArrayDestroy(arr));
    CHECK(cuMemFreeHost(pinned));
    CHECK(cuMemFreeHost(pinned_back));
    CHECK(cuStreamDestroy(s));

    // An image larger than one copy's chunk, both ways.
    const size_t LW = 4096 * 4, LH = 1100;
    std::vector<unsigned char> big(LW * LH), big_back(LW * LH);
    fill_pattern(big.data(), big.size(), 5);
    CUdeviceptr p;
    size_t pitch;
    CHECK(cuMemAllocPitch(&p, &pitch, LW, LH, 16));
    c = copy_2d(LW, LH);
    host_end(c, true, big.data(), LW);
    device_end(c, false, p, pitch);
    CHECK(cuMemcpy2D(&c));
    c = copy_2d(LW, LH);
    device_end(c, true, p, pitch);
    host_end(c, false, big_back.data(), LW);
    CHECK(cuMemcpy2D(&c));
    printf("a %zu MiB image to pitched memory and back: %s checksum=%016llx\n", LW * LH >> 20,
           yes_no(big == big_back), (unsigned long long)checksum(big_back.data(), big_back.size()));
    CHECK(cuMemFree(p));
}

// A mipmapped array: each level an array of half the last one's extent,
// filled and read back through its level's array; a texture object over
// the whole mipmap.
static void mipmaps(CUdevice) {
    CUDA_ARRAY3D_DESCRIPTOR d = {};
    d.Width = 64, d.Height = 40, d.Format = CU_AD_FORMAT_FLOAT, d.NumChannels = 1;
    CUmipmappedArray mip;
    CHECK(cuMipmappedArrayCreate(&mip, &d, 4));
    CUarray level_array;
    for (unsigned level = 0; level < 4; level++) {
        CHECK(cuMipmappedArrayGetLevel(&level_array, mip, level));
        CUDA_ARRAY3D_DESCRIPTOR ld;
        CHECK(cuArray3DGetDescriptor(&ld, level_array));
        size_t row = ld.Width * sizeof(float);
        std::vector<unsigned char> img(row * ld.Height), back(row * ld.Height);
        fill_pattern(img.data(), img.size(), 10 + level);
        CUDA_MEMCPY2D c = copy_2d(row, ld.Height);
        host_end(c, true, img.data(), row);
        array_end(c, false, level_array);
        CHECK(cuMemcpy2D(&c));
        c = copy_2d(row, ld.Height);
        array_end(c, true, level_array);
        host_end(c, false, back.data(), row);
        CHECK(cuMemcpy2D(&c));
        printf("mipmap level %u: %zux%zu, filled and read back: %s\n", level, ld.Width, ld.Height, yes_no(img == back));
    }
    printf("a level past the last: %s\n", err_name(cuMipmappedArrayGetLevel(&level_array, mip, 9)));

    CUDA_RESOURCE_DESC res = {};
    res.resType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
    res.res.mipmap.hMipmappedArray = mip;
    CUDA_TEXTURE_DESC tex = {};
    tex.addressMode[0] = tex.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
    tex.filterMode = tex.mipmapFilterMode = CU_TR_FILTER_MODE_POINT;
    tex.maxMipmapLevelClamp = 3;
    tex.flags = CU_TRSF_NORMALIZED_COORDINATES;
    CUtexObject t;
    CHECK(cuTexObjectCreate(&t, &res, &tex, nullptr));
    CUDA_RESOURCE_DESC named;
    CHECK(cuTexObjectGetResourceDesc(&named, t));
    printf("a texture over the mipmap names it: %s\n",
           yes_no(named.resType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY && named.res.mipmap.hMipmappedArray == mip));
    CHECK(cuTexObjectDestroy(t));
    CHECK(cuMipmappedArrayDestroy(mip));
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    images(dev);
    volumes(dev);
    lines(dev);
    pinned_and_large(dev);
    mipmaps(dev);
    printf("done\n");
    return 0;
}
