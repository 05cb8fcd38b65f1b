// graphs: a stream captured into a graph (a copy from pinned memory, a
// memset, kernels, a device-to-device copy and a copy back), the capture's
// state asked while it runs, the graph's nodes, then launched again and
// again with new input; copies from and to pageable memory in a capture,
// which the graph reads and writes at each launch, with a host function
// after them; an empty graph built and launched; a thread in relaxed
// capture mode allocating while its stream captures; the captured graph
// described in DOT to a file of the program's (PyTorch's debug dump).
#include "common.h"

#include <unistd.h>

#include <vector>

EMBED(vector_add_fatbin, "vector_add.fatbin");

static const int N = 1 << 16;

static const char *status_name(CUstreamCaptureStatus s) {
    switch (s) {
    case CU_STREAM_CAPTURE_STATUS_NONE: return "none";
    case CU_STREAM_CAPTURE_STATUS_ACTIVE: return "active";
    case CU_STREAM_CAPTURE_STATUS_INVALIDATED: return "invalidated";
    }
    return "?";
}

static void launch_add(CUfunction add, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, CUstream s) {
    int n = N;
    void *params[] = {&a, &b, &c, &n};
    CHECK(cuLaunchKernel(add, (N + 255) / 256, 1, 1, 256, 1, 1, 0, s, params, nullptr));
}

int main() {
    CUcontext ctx;
    init_primary(&ctx);
    CUmodule mod;
    CUfunction add;
    CHECK(cuModuleLoadData(&mod, vector_add_fatbin));
    CHECK(cuModuleGetFunction(&add, mod, "vector_add"));
    size_t bytes = N * sizeof(float);
    CUdeviceptr a, b, c, d;
    CHECK(cuMemAlloc(&a, bytes));
    CHECK(cuMemAlloc(&b, bytes));
    CHECK(cuMemAlloc(&c, bytes));
    CHECK(cuMemAlloc(&d, bytes));
    float *in, *out;
    CHECK(cuMemAllocHost((void **)&in, bytes));
    CHECK(cuMemAllocHost((void **)&out, bytes));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    CUstreamCaptureStatus status;
    CHECK(cuStreamIsCapturing(s, &status));
    printf("before: %s\n", status_name(status));
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuStreamIsCapturing(s, &status));
    cuuint64_t id = 0;
    CUgraph capturing = nullptr;
    const CUgraphNode *deps = nullptr;
    size_t ndeps = 99;
    CHECK(cuStreamGetCaptureInfo(s, &status, &id, &capturing, &deps, nullptr, &ndeps));
    printf("capturing: %s, a graph: %s, dependencies: %zu\n", status_name(status), yes_no(capturing != nullptr), ndeps);

    float half = 1.5f;
    unsigned bits;
    memcpy(&bits, &half, 4);
    CHECK(cuMemcpyHtoDAsync(a, in, bytes, s));
    CHECK(cuMemsetD32Async(b, bits, N, s));
    launch_add(add, a, b, c, s);
    CHECK(cuMemcpyDtoDAsync(d, c, bytes, s));
    launch_add(add, d, b, c, s);
    CHECK(cuMemcpyDtoHAsync(out, c, bytes, s));
    CHECK(cuStreamGetCaptureInfo(s, &status, nullptr, nullptr, &deps, nullptr, &ndeps));
    printf("after six captured steps: %s, dependencies: %zu\n", status_name(status), ndeps);
    CUgraph graph;
    CHECK(cuStreamEndCapture(s, &graph));
    CHECK(cuStreamIsCapturing(s, &status));
    printf("after the capture: %s, the same graph: %s\n", status_name(status), yes_no(graph == capturing));

    size_t count = 0;
    CHECK(cuGraphGetNodes(graph, nullptr, &count));
    std::vector<CUgraphNode> nodes(count);
    CHECK(cuGraphGetNodes(graph, nodes.data(), &count));
    int kernels = 0, copies = 0, memsets = 0;
    for (CUgraphNode node : nodes) {
        CUgraphNodeType type;
        CHECK(cuGraphNodeGetType(node, &type));
        kernels += type == CU_GRAPH_NODE_TYPE_KERNEL;
        copies += type == CU_GRAPH_NODE_TYPE_MEMCPY;
        memsets += type == CU_GRAPH_NODE_TYPE_MEMSET;
    }
    size_t roots = 0;
    CHECK(cuGraphGetRootNodes(graph, nullptr, &roots));
    printf("nodes: %zu (%d kernels, %d copies, %d memsets), roots: %zu\n", count, kernels, copies, memsets, roots);

    CUgraphExec exec;
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    CHECK(cuGraphUpload(exec, s));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) in[i] = (float)((i * (round + 3)) % 1000) * 0.25f;
        memset(out, 0, bytes);
        CHECK(cuGraphLaunch(exec, s));
        CHECK(cuStreamSynchronize(s));
        for (int i = 0; i < N; i++) EXPECT(out[i] == in[i] + 3.0f, "round %d: out[%d] = %g", round, i, out[i]);
        printf("launch %d: every value as computed, checksum=%016llx\n", round,
               (unsigned long long)checksum(out, bytes));
    }
    CHECK(cuGraphExecDestroy(exec));
    char dot_path[] = "/tmp/graphs-dot-XXXXXX";
    int dot_fd = mkstemp(dot_path);
    EXPECT(dot_fd >= 0, "mkstemp");
    close(dot_fd);
    CHECK(cuGraphDebugDotPrint(graph, dot_path, CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE));
    FILE *dot = fopen(dot_path, "r");
    char head[4096] = {0};
    size_t got = dot ? fread(head, 1, sizeof head - 1, dot) : 0;
    if (dot) fclose(dot);
    unlink(dot_path);
    printf("described in DOT: %s\n", yes_no(got > 0 && strstr(head, "digraph") != nullptr));
    CHECK(cuGraphDestroy(graph));

    // Copies between ordinary memory and the device in a capture: the graph
    // reads and writes the program's memory at each launch, and a host
    // function after the copy back sees what it wrote.
    std::vector<float> pin(N), pout(N);
    double seen_sum = -1;
    struct Look {
        const std::vector<float> *out;
        double *sum;
    } look = {&pout, &seen_sum};
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemcpyHtoDAsync(a, pin.data(), bytes, s));
    launch_add(add, a, b, c, s);
    CHECK(cuMemcpyDtoHAsync(pout.data(), c, bytes, s));
    CHECK(cuLaunchHostFunc(
        s,
        [](void *p) {
            Look *l = (Look *)p;
            double sum = 0;
            for (float v : *l->out) sum += v;
            *l->sum = sum;
        },
        &look));
    CUgraph from_pageable;
    CHECK(cuStreamEndCapture(s, &from_pageable));
    size_t pageable_nodes = 0;
    CHECK(cuGraphGetNodes(from_pageable, nullptr, &pageable_nodes));
    CUgraphExec pageable_exec;
    CHECK(cuGraphInstantiate(&pageable_exec, from_pageable, 0));
    CHECK(cuGraphDestroy(from_pageable));
    bool every = true, host_saw = true;
    for (int round = 0; round < 3; round++) {
        double want = 0;
        for (int i = 0; i < N; i++) {
            pin[i] = (float)((i + round) % 100);
            pout[i] = -1.0f;
            want += pin[i] + 1.5f;
        }
        CHECK(cuGraphLaunch(pageable_exec, s));
        CHECK(cuStreamSynchronize(s));
        for (int i = 0; i < N; i++) every = every && pout[i] == pin[i] + 1.5f;
        host_saw = host_saw && seen_sum == want;
    }
    printf("copies from and to ordinary memory captured: %zu nodes; three launches on new input, every value: %s, "
           "the host function saw the copy: %s\n",
           pageable_nodes, yes_no(every), yes_no(host_saw));
    CHECK(cuGraphExecDestroy(pageable_exec));

    // A thread in relaxed mode may allocate while its stream captures.
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    CUdeviceptr extra;
    CUresult rc = cuMemAlloc(&extra, 4096);
    printf("relaxed, an allocation during a capture: %s\n", err_name(rc));
    if (rc == CUDA_SUCCESS) CHECK(cuMemFree(extra));
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    launch_add(add, a, b, c, s);
    CHECK(cuStreamEndCapture(s, &graph));
    CHECK(cuGraphDestroy(graph));

    // Dependencies of a capture replaced: the next work starts a new root.
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemsetD32Async(c, 0, 16, s));
    CHECK(cuStreamUpdateCaptureDependencies(s, nullptr, nullptr, 0, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
    CHECK(cuMemsetD32Async(c, 1, 16, s));
    CHECK(cuStreamEndCapture(s, &graph));
    size_t two_roots = 0;
    CHECK(cuGraphGetRootNodes(graph, nullptr, &two_roots));
    printf("capture dependencies replaced by none: roots: %zu\n", two_roots);
    CHECK(cuGraphDestroy(graph));

    // A capture into a graph of the program's, after a node of its own (a
    // memset of b to 2.0f), as XLA traces its command buffers.
    CUgraph into;
    CHECK(cuGraphCreate(&into, 0));
    CUgraphNode set_b;
    CUDA_MEMSET_NODE_PARAMS sp = {};
    sp.dst = b, sp.value = 0x40000000, sp.elementSize = 4, sp.width = N, sp.height = 1;
    CHECK(cuGraphAddMemsetNode(&set_b, into, nullptr, 0, &sp, ctx));
    CHECK(cuStreamBeginCaptureToGraph(s, into, &set_b, nullptr, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuStreamGetCaptureInfo(s, &status, nullptr, &capturing, &deps, nullptr, &ndeps));
    bool into_info = status == CU_STREAM_CAPTURE_STATUS_ACTIVE && capturing == into && ndeps == 1 && deps[0] == set_b;
    CHECK(cuMemcpyHtoDAsync(a, in, bytes, s));
    launch_add(add, a, b, c, s);
    CHECK(cuMemcpyDtoHAsync(out, c, bytes, s));
    CUgraph ended = nullptr;
    CHECK(cuStreamEndCapture(s, &ended));
    size_t into_nodes = 0, into_roots = 0;
    CHECK(cuGraphGetNodes(into, nullptr, &into_nodes));
    CHECK(cuGraphGetRootNodes(into, nullptr, &into_roots));
    CUgraphExec into_exec;
    CHECK(cuGraphInstantiate(&into_exec, into, 0));
    for (int i = 0; i < N; i++) in[i] = (float)(i % 777), out[i] = 0;
    CHECK(cuGraphLaunch(into_exec, s));
    CHECK(cuStreamSynchronize(s));
    bool into_sums = true;
    for (int i = 0; i < N; i++) into_sums = into_sums && out[i] == in[i] + 2.0f;
    printf("captured into a graph after its own node: the capture says so: %s, the same graph back: %s, "
           "nodes: %zu, roots: %zu, sums: %s\n",
           yes_no(into_info), yes_no(ended == into), into_nodes, into_roots, yes_no(into_sums));
    CHECK(cuGraphExecDestroy(into_exec));
    CHECK(cuGraphDestroy(into));

    // A graph built empty runs and does nothing.
    CUgraph empty;
    CHECK(cuGraphCreate(&empty, 0));
    CHECK(cuGraphInstantiate(&exec, empty, 0));
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuGraphGetNodes(empty, nullptr, &count));
    printf("an empty graph launched, nodes: %zu\n", count);
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(empty));

    CHECK(cuStreamDestroy(s));
    CHECK(cuMemFreeHost(in));
    CHECK(cuMemFreeHost(out));
    printf("done\n");
    return 0;
}
