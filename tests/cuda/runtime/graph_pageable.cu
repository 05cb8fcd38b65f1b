// graph_pageable: a stream captured into a graph whose copies name the
// program's ordinary memory, as simpleCudaGraphs does: input from a vector,
// the result into a stack variable (cudaMemcpyDefault) and a vector, and a
// host function after them that prints the result. Launched three times
// with new input written between launches. The graph is described in DOT
// first, as PyTorch's debug dump does.
#include "check.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

// out[i] = in[i] * scale + offset for i < n. Reference: kernels.rs `scale_add`.
__global__ void scaleAdd(int *out, const int *in, int scale, int offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * scale + offset;
}

static void CUDART_CB report(void *p) { printf("host function: the first result is %d\n", *(int *)p); }

int main() {
    const int n = 1000;
    std::vector<int> in(n), out(n);
    int *d_in, *d_out;
    CHECK(cudaMalloc(&d_in, n * sizeof(int)));
    CHECK(cudaMalloc(&d_out, n * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    int first = 0;
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyAsync(d_in, in.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
    scaleAdd<<<(n + 255) / 256, 256, 0, s>>>(d_out, d_in, 3, 1, n);
    CHECK(cudaMemcpyAsync(&first, d_out, sizeof first, cudaMemcpyDefault, s));
    CHECK(cudaMemcpyAsync(out.data(), d_out, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, report, &first));
    CHECK(cudaStreamEndCapture(s, &graph));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    printf("captured: %zu nodes\n", nodes);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    char dot_path[] = "/tmp/graph-pageable-XXXXXX";
    int dot_fd = mkstemp(dot_path);
    if (dot_fd < 0) return 1;
    close(dot_fd);
    CHECK(cudaGraphDebugDotPrint(graph, dot_path, cudaGraphDebugDotFlagsVerbose));
    std::ifstream dot(dot_path);
    std::string text((std::istreambuf_iterator<char>(dot)), std::istreambuf_iterator<char>());
    unlink(dot_path);
    printf("described in DOT: %s\n", text.find("digraph") != std::string::npos ? "yes" : "no");
    CHECK(cudaGraphDestroy(graph));

    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < n; i++) in[i] = i + 10 * round;
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        bool right = true;
        for (int i = 0; i < n; i++) right = right && out[i] == 3 * in[i] + 1;
        printf("launch %d: first %d, every result right: %s\n", round, first, right ? "yes" : "no");
    }

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    printf("done\n");
    return 0;
}
