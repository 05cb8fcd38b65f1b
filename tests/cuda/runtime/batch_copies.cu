// batch_copies: cudaMemcpyBatchAsync and cudaMemcpy3DBatchAsync, as a
// gather of many small buffers and an upload of tiles into a 3D array use
// them. Host to device from ordinary memory read during the call (a stack
// buffer that is gone afterwards), device to device, device to pinned host
// memory; 3D copies from a pitched buffer into an array at an offset and
// back out; batches the runtime refuses.
#include "check.h"

#include <cstring>
#include <vector>

static const int PIECES = 8;
static const int PIECE = 1000;  // ints per piece

// Fills a piece of device memory from a stack buffer; the copy must be
// done reading it when the call returns, since the buffer goes with it.
static void upload_from_stack(int *dst, int seed, cudaStream_t s) {
    int buf[PIECE];
    for (int i = 0; i < PIECE; i++) buf[i] = seed * 100000 + i;
    void *dsts[1] = {dst};
    const void *srcs[1] = {buf};
    size_t sizes[1] = {sizeof(buf)};
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
    size_t idx = 0;
    CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attr, &idx, 1, s));
    memset(buf, 0xff, sizeof(buf));
}

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // Scatter: PIECES pieces of ordinary memory to separate allocations, one batch.
    std::vector<int> host(PIECES * PIECE);
    for (int i = 0; i < PIECES * PIECE; i++) host[i] = i * 7 + 3;
    std::vector<int *> dev(PIECES);
    for (auto &d : dev) CHECK(cudaMalloc(&d, PIECE * sizeof(int)));
    std::vector<void *> dsts(PIECES);
    std::vector<const void *> srcs(PIECES);
    std::vector<size_t> sizes(PIECES, PIECE * sizeof(int));
    for (int p = 0; p < PIECES; p++) {
        dsts[p] = dev[p];
        srcs[p] = &host[p * PIECE];
    }
    cudaMemcpyAttributes attrs[2] = {};
    attrs[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attrs[1].srcAccessOrder = cudaMemcpySrcAccessOrderAny;
    attrs[1].flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t idxs[2] = {0, PIECES / 2};
    CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), PIECES, attrs, idxs, 2, s));

    // Gather: the pieces, device to device, into one buffer, reversed.
    int *gathered;
    CHECK(cudaMalloc(&gathered, PIECES * PIECE * sizeof(int)));
    for (int p = 0; p < PIECES; p++) {
        dsts[p] = gathered + (PIECES - 1 - p) * PIECE;
        srcs[p] = dev[p];
    }
    size_t zero = 0;
    CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), PIECES, attrs, &zero, 1, s));

    // Back to pinned memory in two halves, one batch.
    int *pinned;
    CHECK(cudaMallocHost(&pinned, PIECES * PIECE * sizeof(int)));
    void *back_dsts[2] = {pinned, pinned + PIECES * PIECE / 2};
    const void *back_srcs[2] = {gathered, gathered + PIECES * PIECE / 2};
    size_t half = PIECES * PIECE / 2 * sizeof(int);
    size_t back_sizes[2] = {half, half};
    CHECK(cudaMemcpyBatchAsync(back_dsts, back_srcs, back_sizes, 2, attrs, &zero, 1, s));
    CHECK(cudaStreamSynchronize(s));
    bool right = true;
    for (int p = 0; p < PIECES; p++)
        for (int i = 0; i < PIECE; i++) right = right && pinned[(PIECES - 1 - p) * PIECE + i] == host[p * PIECE + i];
    printf("scattered, gathered reversed and read back in batches: %s\n", yes_no(right));

    // A source on the stack, read during the call.
    upload_from_stack(dev[0], 42, s);
    CHECK(cudaMemcpyAsync(pinned, dev[0], PIECE * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    printf("a stack buffer read during the call: %s (first %d, last %d)\n",
           yes_no(pinned[0] == 4200000 && pinned[PIECE - 1] == 4200000 + PIECE - 1), pinned[0], pinned[PIECE - 1]);

    // 3D: a 16x8x4 block of floats from a pitched buffer into a 32x16x8 array at (4, 2, 1), and back.
    const int W = 16, H = 8, D = 4;
    cudaChannelFormatDesc fmt = cudaCreateChannelDesc<float>();
    cudaArray_t array;
    CHECK(cudaMalloc3DArray(&array, &fmt, make_cudaExtent(32, 16, 8)));
    const size_t row = 20;  // elements per row of the source, wider than the block
    std::vector<float> block(row * H * D);
    for (size_t i = 0; i < block.size(); i++) block[i] = (float)i * 0.5f;
    float *src3d, *out3d;
    CHECK(cudaMalloc(&src3d, block.size() * sizeof(float)));
    CHECK(cudaMalloc(&out3d, W * H * D * sizeof(float)));
    CHECK(cudaMemcpy(src3d, block.data(), block.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaMemcpy3DBatchOp ops[2] = {};
    ops[0].src.type = cudaMemcpyOperandTypePointer;
    ops[0].src.op.ptr.ptr = src3d;
    ops[0].src.op.ptr.rowLength = row;
    ops[0].src.op.ptr.layerHeight = H;
    ops[0].dst.type = cudaMemcpyOperandTypeArray;
    ops[0].dst.op.array.array = array;
    ops[0].dst.op.array.offset = {4, 2, 1};
    ops[0].extent = make_cudaExtent(W, H, D);
    ops[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    CHECK(cudaMemcpy3DBatchAsync(1, ops, 0, s));
    ops[1].src.type = cudaMemcpyOperandTypeArray;
    ops[1].src.op.array.array = array;
    ops[1].src.op.array.offset = {4, 2, 1};
    ops[1].dst.type = cudaMemcpyOperandTypePointer;
    ops[1].dst.op.ptr.ptr = out3d;  // tightly packed: row length and layer height 0
    ops[1].extent = make_cudaExtent(W, H, D);
    ops[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    CHECK(cudaMemcpy3DBatchAsync(1, &ops[1], 0, s));
    std::vector<float> out(W * H * D);
    CHECK(cudaMemcpyAsync(out.data(), out3d, out.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    bool same = true;
    for (int z = 0; z < D; z++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) same = same && out[(z * H + y) * W + x] == block[(z * H + y) * row + x];
    printf("a pitched block into an array at an offset and back out, in 3D batches: %s\n", yes_no(same));

    // Refused: the legacy default stream, attribute runs not starting at 0, a zero extent.
    cudaError_t legacy = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), PIECES, attrs, &zero, 1, 0);
    size_t one = 1;
    cudaError_t late = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), PIECES, attrs, &one, 1, s);
    ops[0].extent = make_cudaExtent(0, H, D);
    cudaError_t flat = cudaMemcpy3DBatchAsync(1, ops, 0, s);
    printf("refused: the legacy stream %s, attributes from copy 1 %s, a zero width %s\n", cudaGetErrorName(legacy),
           cudaGetErrorName(late), cudaGetErrorName(flat));
    cudaGetLastError();

    CHECK(cudaFreeArray(array));
    CHECK(cudaFree(src3d));
    CHECK(cudaFree(out3d));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(gathered));
    for (auto d : dev) CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    printf("done\n");
    return 0;
}
