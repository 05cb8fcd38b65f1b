// graph_nodes: a graph built node by node, as simpleCudaGraphs builds one:
// a copy in from pinned memory and a memset, a kernel after both, a copy
// out after it, an empty node and an event record closing it; launched
// three times on new input; its edges and a node's dependencies read back;
// a kernel node's parameters read, and changed in the executable graph; a
// clone and its copy of a node; a child graph; edges added and removed; an
// executable graph updated from a graph of the same shape and refused one
// of another; a node destroyed; host functions, as host nodes and launched
// into a capture, running after the work before them, copy nodes to and
// from ordinary memory; a graph made with the
// generic cuGraphAddNode and changed through cuGraph[Exec]NodeSetParams and
// the per-type setters (memset, memcpy, event), as XLA's command buffers
// are; a node turned off and on in an executable graph, and its flags. Every result is compared with the host's.
#include "common.h"

#include <cmath>
#include <vector>

EMBED(vector_add_fatbin, "vector_add.fatbin");

static const int N = 1 << 16;

// sum[i] == in[i] + b for i < n, and untouched (NaN) from n on.
static bool sums(const float *sum, const float *in, float b, int n) {
    for (int i = 0; i < N; i++) {
        bool ok = i < n ? sum[i] == in[i] + b : sum[i] != sum[i];
        if (!ok) return false;
    }
    return true;
}

// What host functions saw: how often each ran, and the sum of the copy
// that came before.
struct Seen {
    int runs = 0;
    double sum = 0;
    const float *data = nullptr;
};

static void CUDA_CB look(void *p) {
    Seen *seen = (Seen *)p;
    seen->runs++;
    seen->sum = 0;
    for (int i = 0; i < N; i++) seen->sum += seen->data[i];
}

static void CUDA_CB count(void *p) { ((Seen *)p)->runs++; }

static size_t count_nodes(CUgraph g) {
    size_t n = 0;
    CHECK(cuGraphGetNodes(g, nullptr, &n));
    return n;
}

int main() {
    CUcontext ctx;
    init_primary(&ctx);
    CUmodule mod;
    CUfunction add;
    CHECK(cuModuleLoadData(&mod, vector_add_fatbin));
    CHECK(cuModuleGetFunction(&add, mod, "vector_add"));
    float *in, *out;
    CHECK(cuMemAllocHost((void **)&in, N * sizeof(float)));
    CHECK(cuMemAllocHost((void **)&out, N * sizeof(float)));
    CUdeviceptr a, b, sum;
    CHECK(cuMemAlloc(&a, N * sizeof(float)));
    CHECK(cuMemAlloc(&b, N * sizeof(float)));
    CHECK(cuMemAlloc(&sum, N * sizeof(float)));
    CUevent done;
    CHECK(cuEventCreate(&done, CU_EVENT_DEFAULT));

    CUgraph graph;
    CHECK(cuGraphCreate(&graph, 0));
    CUgraphNode copy_in, set_b, kernel, copy_out, join, record;
    CUDA_MEMCPY3D c = copy_1d(CU_MEMORYTYPE_HOST, in, CU_MEMORYTYPE_DEVICE, (void *)a, N * sizeof(float));
    CHECK(cuGraphAddMemcpyNode(&copy_in, graph, nullptr, 0, &c, ctx));
    CUDA_MEMSET_NODE_PARAMS m = {};
    m.dst = b, m.value = 0x40400000, m.elementSize = 4, m.width = N, m.height = 1;  // 3.0f
    CHECK(cuGraphAddMemsetNode(&set_b, graph, nullptr, 0, &m, ctx));
    int n = N;
    void *args[] = {&a, &b, &sum, &n};
    CUDA_KERNEL_NODE_PARAMS k = {};
    k.func = add, k.gridDimX = (N + 255) / 256, k.gridDimY = k.gridDimZ = 1;
    k.blockDimX = 256, k.blockDimY = k.blockDimZ = 1, k.kernelParams = args;
    CUgraphNode both[] = {copy_in, set_b};
    CHECK(cuGraphAddKernelNode(&kernel, graph, both, 2, &k));
    c = copy_1d(CU_MEMORYTYPE_DEVICE, (void *)sum, CU_MEMORYTYPE_HOST, out, N * sizeof(float));
    CHECK(cuGraphAddMemcpyNode(&copy_out, graph, &kernel, 1, &c, ctx));
    CHECK(cuGraphAddEmptyNode(&join, graph, &copy_out, 1));
    CHECK(cuGraphAddEventRecordNode(&record, graph, &join, 1, done));
    printf("nodes: %zu\n", count_nodes(graph));
    size_t edges = 0;
    CHECK(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
    CUgraphNode deps[4] = {};
    size_t ndeps = 4;
    CHECK(cuGraphNodeGetDependencies(kernel, deps, nullptr, &ndeps));
    size_t ndependents = 0;
    CHECK(cuGraphNodeGetDependentNodes(kernel, nullptr, nullptr, &ndependents));
    printf("edges: %zu; the kernel after the copy in and the memset: %s; one node after it: %s\n", edges,
           yes_no(ndeps == 2 && ((deps[0] == copy_in && deps[1] == set_b) || (deps[0] == set_b && deps[1] == copy_in))),
           yes_no(ndependents == 1));
    CUgraphNodeType type;
    CHECK(cuGraphNodeGetType(record, &type));
    printf("the last node records an event: %s\n", yes_no(type == CU_GRAPH_NODE_TYPE_EVENT_RECORD));

    CUgraphExec exec;
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    bool all = true;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) in[i] = (float)((i * (round + 3)) % 1000) - 400.0f;
        CHECK(cuMemsetD32(sum, 0x7fc00000, N));
        CHECK(cuGraphLaunch(exec, s));
        CHECK(cuEventSynchronize(done));
        all = all && sums(out, in, 3.0f, N);
    }
    printf("launched three times on new input, every sum right: %s checksum=%016llx\n", yes_no(all),
           (unsigned long long)checksum(out, N * sizeof(float)));

    // The kernel node's parameters, read back and changed in the executable graph only.
    CUDA_KERNEL_NODE_PARAMS got = {};
    CHECK(cuGraphKernelNodeGetParams(kernel, &got));
    printf("kernel node parameters: its function, its grid, n = %d: %s\n", *(int *)got.kernelParams[3],
           yes_no(got.func == add && got.gridDimX == (unsigned)(N + 255) / 256));
    int half = N / 2;
    void *half_args[] = {&a, &b, &sum, &half};
    k.kernelParams = half_args;
    CHECK(cuGraphExecKernelNodeSetParams(exec, kernel, &k));
    CHECK(cuMemsetD32(sum, 0x7fc00000, N));
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    printf("the executable graph's kernel now covers half: %s\n", yes_no(sums(out, in, 3.0f, N / 2)));
    CHECK(cuGraphKernelNodeGetParams(kernel, &got));
    printf("the graph's own node still says n = %d\n", *(int *)got.kernelParams[3]);

    // A clone, its copy of the kernel node, instantiated and run.
    CUgraph clone;
    CHECK(cuGraphClone(&clone, graph));
    CUgraphNode kernel_in_clone;
    CHECK(cuGraphNodeFindInClone(&kernel_in_clone, kernel, clone));
    CHECK(cuGraphNodeGetType(kernel_in_clone, &type));
    printf("clone: %zu nodes, its copy of the kernel node is a kernel node: %s\n", count_nodes(clone),
           yes_no(type == CU_GRAPH_NODE_TYPE_KERNEL && kernel_in_clone != kernel));

    // A kernel node's launch attributes: a priority set, read back and copied to the clone's node.
    int least, greatest;
    CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
    CUlaunchAttributeValue prio = {};
    prio.priority = greatest;
    CHECK(cuGraphKernelNodeSetAttribute(kernel, CU_LAUNCH_ATTRIBUTE_PRIORITY, &prio));
    CUlaunchAttributeValue read = {};
    CHECK(cuGraphKernelNodeGetAttribute(kernel, CU_LAUNCH_ATTRIBUTE_PRIORITY, &read));
    CUlaunchAttributeValue in_clone = {};
    CHECK(cuGraphKernelNodeCopyAttributes(kernel_in_clone, kernel));
    CHECK(cuGraphKernelNodeGetAttribute(kernel_in_clone, CU_LAUNCH_ATTRIBUTE_PRIORITY, &in_clone));
    printf("kernel node priority: set and read back: %s; copied to the clone's node: %s\n",
           yes_no(read.priority == greatest), yes_no(in_clone.priority == greatest));

    // A child graph: the clone without its event record, then a memset of
    // the sum, in a graph of its own.
    CUgraphNode record_in_clone;
    CHECK(cuGraphNodeFindInClone(&record_in_clone, record, clone));
    CHECK(cuGraphDestroyNode(record_in_clone));
    CUgraph parent;
    CHECK(cuGraphCreate(&parent, 0));
    CUgraphNode child, zero;
    CHECK(cuGraphAddChildGraphNode(&child, parent, nullptr, 0, clone));
    m = {};
    m.dst = sum, m.value = 0, m.elementSize = 4, m.width = N, m.height = 1;
    CHECK(cuGraphAddMemsetNode(&zero, parent, &child, 1, &m, ctx));
    CUgraphExec parent_exec;
    CHECK(cuGraphInstantiate(&parent_exec, parent, 0));
    CHECK(cuGraphLaunch(parent_exec, s));
    CHECK(cuStreamSynchronize(s));
    std::vector<float> after(N);
    CHECK(cuMemcpyDtoH(after.data(), sum, N * sizeof(float)));
    bool zeroed = true;
    for (float v : after) zeroed = zeroed && v == 0.0f;
    printf("a child graph ran, then the memset after it: %s %s\n", yes_no(sums(out, in, 3.0f, N)), yes_no(zeroed));
    // What the nodes hold, read back: the child node's own graph (a copy of
    // the clone, of as many nodes), the event node's event, the memset's
    // parameters.
    CUgraph childs_own;
    CHECK(cuGraphChildGraphNodeGetGraph(child, &childs_own));
    CUevent recorded;
    CHECK(cuGraphEventRecordNodeGetEvent(record, &recorded));
    CUDA_MEMSET_NODE_PARAMS memset_back;
    CHECK(cuGraphMemsetNodeGetParams(zero, &memset_back));
    printf("the child node's graph: its own, of %zu nodes; the record node's event: %s; the memset's: %s\n",
           count_nodes(childs_own), yes_no(recorded == done),
           yes_no(memset_back.dst == sum && memset_back.value == 0 && memset_back.elementSize == 4 && memset_back.width == N &&
                  memset_back.height == 1));
    // The executable graph's child replaced by a graph of the same shape
    // whose memset sets 6.0f.
    CUgraph reshaped;
    CHECK(cuGraphClone(&reshaped, clone));
    CUgraphNode set_in_clone, set_in_reshaped;
    CHECK(cuGraphNodeFindInClone(&set_in_clone, set_b, clone));
    CHECK(cuGraphNodeFindInClone(&set_in_reshaped, set_in_clone, reshaped));
    m = {};
    m.dst = b, m.value = 0x40c00000, m.elementSize = 4, m.width = N, m.height = 1;
    CHECK(cuGraphMemsetNodeSetParams(set_in_reshaped, &m));
    CHECK(cuGraphExecChildGraphNodeSetParams(parent_exec, child, reshaped));
    CHECK(cuGraphLaunch(parent_exec, s));
    CHECK(cuStreamSynchronize(s));
    printf("the child replaced in the executable graph: sums with 6.0: %s\n", yes_no(sums(out, in, 6.0f, N)));
    // The same child set again before each launch, as XLA sets its nested
    // command buffers (gpuplex posts a repeat); its memset set anew in
    // between; then, with a node more, the set refused.
    bool every = true;
    for (int i = 0; i < 4; i++) {
        if (i == 2) {
            m.value = 0x40e00000;  // 7.0f
            CHECK(cuGraphMemsetNodeSetParams(set_in_reshaped, &m));
        }
        CHECK(cuGraphExecChildGraphNodeSetParams(parent_exec, child, reshaped));
        CHECK(cuGraphLaunch(parent_exec, s));
        CHECK(cuStreamSynchronize(s));
        every = every && sums(out, in, i < 2 ? 6.0f : 7.0f, N);
    }
    CUgraphNode extra;
    CHECK(cuGraphAddEmptyNode(&extra, reshaped, nullptr, 0));
    CUresult grown = cuGraphExecChildGraphNodeSetParams(parent_exec, child, reshaped);
    printf("set again before each of 4 launches, 7.0 from the third: %s; with a node more, refused: %s\n",
           yes_no(every), yes_no(grown != CUDA_SUCCESS));
    CHECK(cuGraphDestroy(reshaped));

    // Edges added and removed between empty nodes.
    CUgraph plain;
    CHECK(cuGraphCreate(&plain, 0));
    CUgraphNode e[3];
    for (auto &node : e) CHECK(cuGraphAddEmptyNode(&node, plain, nullptr, 0));
    CUgraphNode from[] = {e[0], e[1]}, to[] = {e[1], e[2]};
    CHECK(cuGraphAddDependencies(plain, from, to, nullptr, 2));
    size_t roots = 0, before = 0, after_removal = 0;
    CHECK(cuGraphGetRootNodes(plain, nullptr, &roots));
    CHECK(cuGraphGetEdges(plain, nullptr, nullptr, nullptr, &before));
    CHECK(cuGraphRemoveDependencies(plain, from, to, nullptr, 1));
    CHECK(cuGraphGetEdges(plain, nullptr, nullptr, nullptr, &after_removal));
    printf("edges added: %zu, one root; after removing one: %zu edge(s)\n", before, after_removal);
    (void)roots;

    // Updates: from a graph of the same shape, then from one missing a node.
    CUgraph same, fewer;
    CHECK(cuGraphClone(&same, graph));
    CUgraphExecUpdateResultInfo info;
    CUresult rc = cuGraphExecUpdate(exec, same, &info);
    printf("an update from a graph of the same shape: %s, result %d\n", err_name(rc), (int)info.result);
    CHECK(cuGraphClone(&fewer, graph));
    CUgraphNode set_in_fewer;
    CHECK(cuGraphNodeFindInClone(&set_in_fewer, set_b, fewer));
    CHECK(cuGraphDestroyNode(set_in_fewer));
    rc = cuGraphExecUpdate(exec, fewer, &info);
    printf("an update from a graph missing a node: %s, result %d\n", err_name(rc), (int)info.result);
    CHECK(cuGraphDestroyNode(join));
    printf("a node destroyed: %zu nodes left\n", count_nodes(graph));

    // Copy nodes between ordinary memory and the device, and a host node
    // after the copy out: it sees the copy's data. Launched twice, with new
    // input written to the program's memory between.
    CUgraph with_host;
    CHECK(cuGraphCreate(&with_host, 0));
    std::vector<float> plain_in(N), plain_out(N);
    CUgraphNode plain_copy_in, copy_node, host_node;
    c = copy_1d(CU_MEMORYTYPE_HOST, plain_in.data(), CU_MEMORYTYPE_DEVICE, (void *)a, N * sizeof(float));
    CHECK(cuGraphAddMemcpyNode(&plain_copy_in, with_host, nullptr, 0, &c, ctx));
    c = copy_1d(CU_MEMORYTYPE_DEVICE, (void *)a, CU_MEMORYTYPE_HOST, plain_out.data(), N * sizeof(float));
    CHECK(cuGraphAddMemcpyNode(&copy_node, with_host, &plain_copy_in, 1, &c, ctx));
    Seen seen;
    seen.data = plain_out.data();
    CUDA_HOST_NODE_PARAMS h = {};
    h.fn = look, h.userData = &seen;
    CHECK(cuGraphAddHostNode(&host_node, with_host, &copy_node, 1, &h));
    CUDA_HOST_NODE_PARAMS h_back = {};
    CHECK(cuGraphHostNodeGetParams(host_node, &h_back));
    CUgraphExec host_exec;
    CHECK(cuGraphInstantiate(&host_exec, with_host, 0));
    bool saw = true, copied = true;
    for (int round = 1; round <= 2; round++) {
        double want = 0;
        for (int i = 0; i < N; i++) {
            plain_in[i] = (float)(i % 7 + round);
            want += plain_in[i];
        }
        CHECK(cuGraphLaunch(host_exec, s));
        CHECK(cuStreamSynchronize(s));
        saw = saw && seen.sum == want;
        copied = copied && plain_out == plain_in;
    }
    printf("copy nodes to and from ordinary memory, a host node after them: ran %d time(s), saw the copy: %s, "
           "the program's memory has it: %s, its parameters read back: %s\n",
           seen.runs, yes_no(saw), yes_no(copied), yes_no(h_back.fn == look && h_back.userData == &seen));

    // Memcpy nodes' parameters read back: pinned memory to the device, and ordinary memory from it.
    CUDA_MEMCPY3D got_in = {}, got_out = {};
    CHECK(cuGraphMemcpyNodeGetParams(copy_in, &got_in));
    CHECK(cuGraphMemcpyNodeGetParams(copy_node, &got_out));
    bool in_right = got_in.srcMemoryType == CU_MEMORYTYPE_HOST && got_in.srcHost == in &&
                    got_in.dstMemoryType == CU_MEMORYTYPE_DEVICE && got_in.dstDevice == a &&
                    got_in.WidthInBytes == N * sizeof(float) && got_in.Height == 1 && got_in.Depth == 1;
    bool out_right = got_out.srcMemoryType == CU_MEMORYTYPE_DEVICE && got_out.srcDevice == a &&
                     got_out.dstMemoryType == CU_MEMORYTYPE_HOST && got_out.dstHost == plain_out.data() &&
                     got_out.WidthInBytes == N * sizeof(float);
    printf("memcpy nodes' parameters read back: from pinned memory %s, to ordinary memory %s\n", yes_no(in_right),
           yes_no(out_right));

    // A host function launched into a capture, between a memset and a copy.
    Seen counted;
    CUstream cap;
    CHECK(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemsetD32Async(b, 0x3f800000, N, cap));  // 1.0f
    CHECK(cuLaunchHostFunc(cap, count, &counted));
    CHECK(cuMemcpyDtoDAsync(sum, b, N * sizeof(float), cap));
    CUgraph captured;
    CHECK(cuStreamEndCapture(cap, &captured));
    size_t captured_nodes = count_nodes(captured);
    CUgraphExec captured_exec;
    CHECK(cuGraphInstantiate(&captured_exec, captured, 0));
    for (int i = 0; i < 3; i++) CHECK(cuGraphLaunch(captured_exec, cap));
    CHECK(cuStreamSynchronize(cap));
    CHECK(cuMemcpyDtoH(after.data(), sum, N * sizeof(float)));
    bool ones = true;
    for (float v : after) ones = ones && v == 1.0f;
    printf("a captured host function: %zu nodes, ran %d times in 3 launches, the copy after it done: %s\n",
           captured_nodes, counted.runs, yes_no(ones));
    CHECK(cuGraphExecDestroy(captured_exec));
    CHECK(cuGraphExecDestroy(host_exec));
    CHECK(cuGraphDestroy(captured));
    CHECK(cuGraphDestroy(with_host));
    CHECK(cuStreamDestroy(cap));

    // Generic nodes: a copy in, a memset of b to 1.0f, the kernel, a copy
    // out and an event record, each made by cuGraphAddNode.
    CUgraph generic;
    CHECK(cuGraphCreate(&generic, 0));
    CUgraphNode g_in, g_set, g_kernel, g_out, g_record;
    CUgraphNodeParams gp = {};
    gp.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    gp.memcpy.copyCtx = ctx;
    gp.memcpy.copyParams = copy_1d(CU_MEMORYTYPE_HOST, in, CU_MEMORYTYPE_DEVICE, (void *)a, N * sizeof(float));
    CHECK(cuGraphAddNode(&g_in, generic, nullptr, nullptr, 0, &gp));
    gp = {};
    gp.type = CU_GRAPH_NODE_TYPE_MEMSET;
    gp.memset.dst = b, gp.memset.value = 0x3f800000, gp.memset.elementSize = 4;  // 1.0f
    gp.memset.width = N, gp.memset.height = 1, gp.memset.ctx = ctx;
    CHECK(cuGraphAddNode(&g_set, generic, nullptr, nullptr, 0, &gp));
    CUgraphNodeParams set_params = gp;
    gp = {};
    gp.type = CU_GRAPH_NODE_TYPE_KERNEL;
    gp.kernel.func = add, gp.kernel.gridDimX = (N + 255) / 256, gp.kernel.gridDimY = gp.kernel.gridDimZ = 1;
    gp.kernel.blockDimX = 256, gp.kernel.blockDimY = gp.kernel.blockDimZ = 1;
    n = N;
    gp.kernel.kernelParams = args;
    CUgraphNode inputs[] = {g_in, g_set};
    CHECK(cuGraphAddNode(&g_kernel, generic, inputs, nullptr, 2, &gp));
    CUgraphNodeParams kernel_params = gp;
    gp = {};
    gp.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    gp.memcpy.copyCtx = ctx;
    gp.memcpy.copyParams = copy_1d(CU_MEMORYTYPE_DEVICE, (void *)sum, CU_MEMORYTYPE_HOST, out, N * sizeof(float));
    CHECK(cuGraphAddNode(&g_out, generic, &g_kernel, nullptr, 1, &gp));
    CUgraphNodeParams out_params = gp;
    gp = {};
    gp.type = CU_GRAPH_NODE_TYPE_EVENT_RECORD;
    gp.eventRecord.event = done;
    CHECK(cuGraphAddNode(&g_record, generic, &g_out, nullptr, 1, &gp));
    CUgraphExec generic_exec;
    CHECK(cuGraphInstantiate(&generic_exec, generic, 0));
    auto run_generic = [&](CUgraphExec e) {
        for (int i = 0; i < N; i++) out[i] = nanf("");
        CHECK(cuGraphLaunch(e, s));
        CHECK(cuStreamSynchronize(s));
    };
    run_generic(generic_exec);
    bool first = sums(out, in, 1.0f, N);
    // The memset changed in the executable graph, generically.
    set_params.memset.value = 0x40000000;  // 2.0f
    CHECK(cuGraphExecNodeSetParams(generic_exec, g_set, &set_params));
    run_generic(generic_exec);
    bool second = sums(out, in, 2.0f, N);
    printf("generic nodes: %zu, sums with 1.0 then, its memset set anew, 2.0: %s %s\n", count_nodes(generic),
           yes_no(first), yes_no(second));
    // The per-type setters: memset to 4.0f, the copy out of the first half
    // only, the event record onto an event never recorded before.
    CUDA_MEMSET_NODE_PARAMS ms = {};
    ms.dst = b, ms.value = 0x40800000, ms.elementSize = 4, ms.width = N, ms.height = 1;
    CHECK(cuGraphExecMemsetNodeSetParams(generic_exec, g_set, &ms, ctx));
    CUDA_MEMCPY3D first_half = copy_1d(CU_MEMORYTYPE_DEVICE, (void *)sum, CU_MEMORYTYPE_HOST, out, N / 2 * sizeof(float));
    CHECK(cuGraphExecMemcpyNodeSetParams(generic_exec, g_out, &first_half, ctx));
    CUevent fresh;
    CHECK(cuEventCreate(&fresh, CU_EVENT_DEFAULT));
    float ms_between = 0;
    CUresult before_rc = cuEventElapsedTime(&ms_between, fresh, fresh);
    CHECK(cuGraphExecEventRecordNodeSetEvent(generic_exec, g_record, fresh));
    run_generic(generic_exec);
    CUresult after_rc = cuEventElapsedTime(&ms_between, fresh, fresh);
    printf("set in the executable graph: sums with 4.0 over the first half only: %s; the new event recorded: %s\n",
           yes_no(sums(out, in, 4.0f, N / 2)), yes_no(before_rc != CUDA_SUCCESS && after_rc == CUDA_SUCCESS));
    // The graph's own nodes changed, then instantiated again: the changes
    // made in the first executable graph are not in the graph.
    set_params.memset.value = 0x40a00000;  // 5.0f
    CHECK(cuGraphNodeSetParams(g_set, &set_params));
    CHECK(cuGraphMemcpyNodeSetParams(g_out, &out_params.memcpy.copyParams));
    CUgraphExec again;
    CHECK(cuGraphInstantiate(&again, generic, 0));
    run_generic(again);
    printf("the graph's own memset set to 5.0, instantiated again, sums over all: %s\n", yes_no(sums(out, in, 5.0f, N)));
    // The memset turned off in the executable graph, with b cleared first,
    // then on again; and the flags it was instantiated with.
    unsigned on = 9, off = 9;
    CHECK(cuGraphNodeGetEnabled(again, g_set, &on));
    CHECK(cuGraphNodeSetEnabled(again, g_set, 0));
    CHECK(cuGraphNodeGetEnabled(again, g_set, &off));
    CHECK(cuMemsetD32(b, 0, N));
    run_generic(again);
    bool skipped = sums(out, in, 0.0f, N);
    CHECK(cuGraphNodeSetEnabled(again, g_set, 1));
    run_generic(again);
    bool back_on = sums(out, in, 5.0f, N);
    cuuint64_t flags = 99;
    CHECK(cuGraphExecGetFlags(again, &flags));
    printf("the memset turned off (enabled %u, then %u): sums with 0.0: %s; on again, 5.0: %s; flags %llu\n", on, off,
           yes_no(skipped), yes_no(back_on), (unsigned long long)flags);
    CHECK(cuGraphExecDestroy(again));
    CHECK(cuGraphExecDestroy(generic_exec));

    // A programmatic edge between two kernels, as XLA adds them on Hopper:
    // its data read back, and both kernels run (each writes the same sums).
    CUgraph pdl;
    CHECK(cuGraphCreate(&pdl, 0));
    CUgraphNode first_kernel, second_kernel;
    CHECK(cuGraphAddNode(&first_kernel, pdl, nullptr, nullptr, 0, &kernel_params));
    CUgraphEdgeData programmatic = {};
    programmatic.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
    programmatic.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    CHECK(cuGraphAddNode(&second_kernel, pdl, &first_kernel, &programmatic, 1, &kernel_params));
    CUgraphNode edge_from = nullptr, edge_to = nullptr;
    CUgraphEdgeData edge = {};
    size_t nedges = 1;
    CHECK(cuGraphGetEdges(pdl, &edge_from, &edge_to, &edge, &nedges));
    bool read_back = nedges == 1 && edge_from == first_kernel && edge_to == second_kernel &&
                     edge.type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC &&
                     edge.from_port == CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
    CUgraphExec pdl_exec;
    CHECK(cuGraphInstantiate(&pdl_exec, pdl, 0));
    CHECK(cuMemsetD32(sum, 0x7fc00000, N));
    CHECK(cuGraphLaunch(pdl_exec, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemcpyDtoH(out, sum, N * sizeof(float)));
    printf("a programmatic edge between two kernels read back as such: %s; they ran: %s\n", yes_no(read_back),
           yes_no(sums(out, in, 5.0f, N)));
    CHECK(cuGraphExecDestroy(pdl_exec));
    CHECK(cuGraphDestroy(pdl));
    CHECK(cuGraphDestroy(generic));
    CHECK(cuEventDestroy(fresh));

    CHECK(cuGraphExecDestroy(parent_exec));
    CHECK(cuGraphExecDestroy(exec));
    for (CUgraph g : {graph, clone, parent, plain, same, fewer}) CHECK(cuGraphDestroy(g));
    CHECK(cuStreamDestroy(s));
    CHECK(cuEventDestroy(done));
    CHECK(cuMemFreeHost(in));
    CHECK(cuMemFreeHost(out));
    CHECK(cuModuleUnload(mod));
    printf("done\n");
    return 0;
}
