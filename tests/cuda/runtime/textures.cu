// textures: texture and surface objects as image filters use them: an image
// in a 2D array sampled by a kernel into a shifted copy (point sampling,
// unnormalized coordinates, clamped at the edges); the same image in
// pitched memory sampled alike; an int buffer fetched by index, past its
// end too; a surface written by a kernel and read back; a volume through a
// 3D array and back. Every result is compared with what the host computes.
#include "check.h"

#include <vector>

// out[y * w + x] = tex2D<float>(tex, x + dx + 0.5f, y + dy + 0.5f) for x < w, y < h.
// Reference: kernels.rs `tex_shift`.
__global__ void texShift(float *out, cudaTextureObject_t tex, int w, int h, int dx, int dy) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(tex, x + dx + 0.5f, y + dy + 0.5f);
}

// out[i] = 2 * tex1Dfetch<int>(tex, i) for i < n. Reference: kernels.rs `fetch_twice`.
__global__ void fetchTwice(int *out, cudaTextureObject_t tex, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2 * tex1Dfetch<int>(tex, i);
}

// surf2Dwrite((float)(x * 1000 + y), surf, x * 4, y) for x < w, y < h. Reference: kernels.rs `surf_fill`.
__global__ void surfFill(cudaSurfaceObject_t surf, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) surf2Dwrite((float)(x * 1000 + y), surf, x * 4, y);
}

static const int W = 300, H = 200;

static float pixel(int x, int y) { return (float)((x * 7 + y * 13) % 1000) * 0.5f; }

static float shifted(int x, int y, int dx, int dy) {
    int sx = x + dx < 0 ? 0 : (x + dx >= W ? W - 1 : x + dx);
    int sy = y + dy < 0 ? 0 : (y + dy >= H ? H - 1 : y + dy);
    return pixel(sx, sy);
}

static cudaTextureObject_t point_clamped(const cudaResourceDesc &res) {
    cudaTextureDesc td = {};
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = 0;
    cudaTextureObject_t tex;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
    return tex;
}

// Runs texShift over tex and checks every pixel; prints a checksum of the result.
static void sample(const char *what, cudaTextureObject_t tex, float *out, int dx, int dy) {
    dim3 block(16, 16), grid((W + 15) / 16, (H + 15) / 16);
    texShift<<<grid, block>>>(out, tex, W, H, dx, dy);
    CHECK_LAUNCH();
    std::vector<float> got(W * H);
    CHECK(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            float want = shifted(x, y, dx, dy);
            EXPECT(got[y * W + x] == want, "%s (%d, %d) = %g, want %g", what, x, y, got[y * W + x], want);
            sum += got[y * W + x];
        }
    printf("%s, shifted by (%d, %d), clamped: ok sum=%.1f\n", what, dx, dy, sum);
}

int main() {
    std::vector<float> image(W * H);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) image[y * W + x] = pixel(x, y);
    float *out;
    CHECK(cudaMalloc(&out, W * H * sizeof(float)));

    // The image in a 2D array.
    cudaChannelFormatDesc f32 = cudaCreateChannelDesc<float>();
    cudaArray_t arr;
    CHECK(cudaMallocArray(&arr, &f32, W, H));
    CHECK(cudaMemcpy2DToArray(arr, 0, 0, image.data(), W * sizeof(float), W * sizeof(float), H, cudaMemcpyHostToDevice));
    cudaResourceDesc res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = arr;
    cudaTextureObject_t tex = point_clamped(res);
    sample("a 2D array sampled", tex, out, -3, 5);
    CHECK(cudaDestroyTextureObject(tex));

    // The image in pitched memory.
    float *pitched;
    size_t pitch;
    CHECK(cudaMallocPitch(&pitched, &pitch, W * sizeof(float), H));
    CHECK(cudaMemcpy2D(pitched, pitch, image.data(), W * sizeof(float), W * sizeof(float), H, cudaMemcpyHostToDevice));
    res = {};
    res.resType = cudaResourceTypePitch2D;
    res.res.pitch2D.devPtr = pitched;
    res.res.pitch2D.desc = f32;
    res.res.pitch2D.width = W;
    res.res.pitch2D.height = H;
    res.res.pitch2D.pitchInBytes = pitch;
    tex = point_clamped(res);
    sample("pitched memory sampled", tex, out, 4, -2);
    CHECK(cudaDestroyTextureObject(tex));

    // An int buffer fetched by index, 100 past its end.
    const int N = 5000;
    std::vector<int> ints(N);
    for (int i = 0; i < N; i++) ints[i] = i * 3 - 7000;
    int *buf, *twice;
    CHECK(cudaMalloc(&buf, N * sizeof(int)));
    CHECK(cudaMalloc(&twice, (N + 100) * sizeof(int)));
    CHECK(cudaMemcpy(buf, ints.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    res = {};
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = buf;
    res.res.linear.desc = cudaCreateChannelDesc<int>();
    res.res.linear.sizeInBytes = N * sizeof(int);
    cudaTextureDesc td = {};
    td.readMode = cudaReadModeElementType;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
    fetchTwice<<<(N + 100 + 255) / 256, 256>>>(twice, tex, N + 100);
    CHECK_LAUNCH();
    std::vector<int> fetched(N + 100);
    CHECK(cudaMemcpy(fetched.data(), twice, fetched.size() * sizeof(int), cudaMemcpyDeviceToHost));
    bool all = true;
    for (int i = 0; i < N + 100; i++) all = all && fetched[i] == (i < N ? 2 * ints[i] : 0);
    printf("a linear buffer fetched by index, zeros past its end: %s\n", yes_no(all));
    CHECK(cudaDestroyTextureObject(tex));

    // A surface written by a kernel, read back through a copy.
    cudaArray_t target;
    CHECK(cudaMallocArray(&target, &f32, W, H, cudaArraySurfaceLoadStore));
    res = {};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = target;
    cudaSurfaceObject_t surf;
    CHECK(cudaCreateSurfaceObject(&surf, &res));
    surfFill<<<dim3((W + 15) / 16, (H + 15) / 16), dim3(16, 16)>>>(surf, W, H);
    CHECK_LAUNCH();
    std::vector<float> written(W * H);
    CHECK(cudaMemcpy2DFromArray(written.data(), W * sizeof(float), target, 0, 0, W * sizeof(float), H,
                                cudaMemcpyDeviceToHost));
    all = true;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) all = all && written[y * W + x] == (float)(x * 1000 + y);
    printf("a surface written by a kernel, read back: %s\n", yes_no(all));
    CHECK(cudaDestroySurfaceObject(surf));

    // A volume through a 3D array and back.
    const int VW = 40, VH = 30, VD = 12;
    cudaArray_t vol;
    cudaChannelFormatDesc u8x4 = cudaCreateChannelDesc<uchar4>();
    CHECK(cudaMalloc3DArray(&vol, &u8x4, make_cudaExtent(VW, VH, VD)));
    std::vector<unsigned char> volume(VW * VH * VD * 4), back(volume.size());
    for (size_t i = 0; i < volume.size(); i++) volume[i] = (unsigned char)(i * 31 + 7);
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr(volume.data(), VW * 4, VW, VH);
    p.dstArray = vol;
    p.extent = make_cudaExtent(VW, VH, VD);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    p = {};
    p.srcArray = vol;
    p.dstPtr = make_cudaPitchedPtr(back.data(), VW * 4, VW, VH);
    p.extent = make_cudaExtent(VW, VH, VD);
    p.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p));
    printf("a volume through a 3D array and back: %s\n", yes_no(back == volume));

    CHECK(cudaFreeArray(vol));
    CHECK(cudaFreeArray(target));
    CHECK(cudaFreeArray(arr));
    CHECK(cudaFree(pitched));
    CHECK(cudaFree(buf));
    CHECK(cudaFree(twice));
    CHECK(cudaFree(out));
    printf("done\n");
    return 0;
}
