// graph_memory: graph memory nodes, as NVIDIA's graphMemoryNodes sample
// builds them: two allocations, a copy in from ordinary memory and a memset
// into them, a kernel adding them into ordinary device memory, the two
// freed, a copy out; launched twice on new input. Then the nodes'
// parameters read back, the graph memory attributes, a trim, and an
// allocation and a free made with the generic cuGraphAddNode.
#include "common.h"

#include <vector>

EMBED(vector_add_fatbin, "vector_add.fatbin");

static const int N = 1 << 14;

int main() {
    CUcontext ctx;
    CUdevice dev = init_primary(&ctx);
    CUmodule mod;
    CUfunction add;
    CHECK(cuModuleLoadData(&mod, vector_add_fatbin));
    CHECK(cuModuleGetFunction(&add, mod, "vector_add"));
    size_t bytes = N * sizeof(float);
    CUdeviceptr sum;
    CHECK(cuMemAlloc(&sum, bytes));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    std::vector<float> in(N), out(N);

    CUDA_MEM_ALLOC_NODE_PARAMS alloc = {};
    alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    alloc.poolProps.location.id = dev;
    alloc.bytesize = bytes;
    CUgraph graph;
    CHECK(cuGraphCreate(&graph, 0));
    CUgraphNode alloc_a, alloc_b, copy_in, set_b, kernel, free_a, free_b, copy_out;
    CHECK(cuGraphAddMemAllocNode(&alloc_a, graph, nullptr, 0, &alloc));
    CUdeviceptr a = alloc.dptr;
    CHECK(cuGraphAddMemAllocNode(&alloc_b, graph, &alloc_a, 1, &alloc));
    CUdeviceptr b = alloc.dptr;
    printf("two allocations, at distinct addresses: %s\n", yes_no(a != 0 && b != 0 && a != b));
    CUDA_MEMCPY3D c = copy_1d(CU_MEMORYTYPE_HOST, in.data(), CU_MEMORYTYPE_DEVICE, (void *)a, bytes);
    CHECK(cuGraphAddMemcpyNode(&copy_in, graph, &alloc_b, 1, &c, ctx));
    CUDA_MEMSET_NODE_PARAMS m = {};
    float half = 1.5f;
    memcpy(&m.value, &half, 4);
    m.dst = b, m.elementSize = 4, m.width = N, m.height = 1;
    CHECK(cuGraphAddMemsetNode(&set_b, graph, &alloc_b, 1, &m, ctx));
    int n = N;
    void *params[] = {&a, &b, &sum, &n};
    CUDA_KERNEL_NODE_PARAMS k = {};
    k.func = add, k.gridDimX = (N + 255) / 256, k.gridDimY = 1, k.gridDimZ = 1;
    k.blockDimX = 256, k.blockDimY = 1, k.blockDimZ = 1, k.kernelParams = params;
    CUgraphNode before_kernel[] = {copy_in, set_b};
    CHECK(cuGraphAddKernelNode(&kernel, graph, before_kernel, 2, &k));
    CHECK(cuGraphAddMemFreeNode(&free_a, graph, &kernel, 1, a));
    CHECK(cuGraphAddMemFreeNode(&free_b, graph, &kernel, 1, b));
    c = copy_1d(CU_MEMORYTYPE_DEVICE, (void *)sum, CU_MEMORYTYPE_HOST, out.data(), bytes);
    CHECK(cuGraphAddMemcpyNode(&copy_out, graph, &kernel, 1, &c, ctx));

    size_t count = 0;
    CHECK(cuGraphGetNodes(graph, nullptr, &count));
    std::vector<CUgraphNode> nodes(count);
    CHECK(cuGraphGetNodes(graph, nodes.data(), &count));
    int allocs = 0, frees = 0;
    for (CUgraphNode node : nodes) {
        CUgraphNodeType type;
        CHECK(cuGraphNodeGetType(node, &type));
        allocs += type == CU_GRAPH_NODE_TYPE_MEM_ALLOC;
        frees += type == CU_GRAPH_NODE_TYPE_MEM_FREE;
    }
    printf("nodes: %zu, allocations: %d, frees: %d\n", count, allocs, frees);

    CUDA_MEM_ALLOC_NODE_PARAMS back = {};
    CHECK(cuGraphMemAllocNodeGetParams(alloc_b, &back));
    printf("the second allocation read back: its size: %s, its device: %s, its address: %s\n",
           yes_no(back.bytesize == bytes), yes_no(back.poolProps.location.id == dev), yes_no(back.dptr == b));
    CUdeviceptr freed = 0;
    CHECK(cuGraphMemFreeNodeGetParams(free_a, &freed));
    printf("the first free frees the first allocation: %s\n", yes_no(freed == a));

    CUgraphExec exec;
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    bool right = true;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            in[i] = (float)((i * 7 + round) % 1000);
            out[i] = -1.0f;
        }
        CHECK(cuGraphLaunch(exec, s));
        CHECK(cuStreamSynchronize(s));
        for (int i = 0; i < N; i++) right = right && out[i] == in[i] + 1.5f;
    }
    printf("launched twice on new input, every sum right: %s\n", yes_no(right));

    cuuint64_t reserved = 0, high = 0;
    CHECK(cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved));
    CHECK(cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &high));
    printf("graph memory reserved for both allocations: %s, used at its highest: %s\n",
           yes_no(reserved >= 2 * bytes), yes_no(high >= 2 * bytes));
    cuuint64_t zero = 0;
    CHECK(cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero));
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuCtxSynchronize());
    CHECK(cuDeviceGraphMemTrim(dev));
    printf("high watermark reset, graph memory trimmed\n");

    // The generic form: the address comes back in the caller's parameters.
    CUgraph generic;
    CHECK(cuGraphCreate(&generic, 0));
    CUgraphNodeParams p = {};
    p.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    p.alloc.poolProps = alloc.poolProps;
    p.alloc.bytesize = 4096;
    CUgraphNode generic_alloc, generic_free;
    CHECK(cuGraphAddNode(&generic_alloc, generic, nullptr, nullptr, 0, &p));
    CUdeviceptr g = p.alloc.dptr;
    CUgraphNodeParams f = {};
    f.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    f.free.dptr = g;
    CHECK(cuGraphAddNode(&generic_free, generic, &generic_alloc, nullptr, 1, &f));
    CUgraphExec generic_exec;
    CHECK(cuGraphInstantiate(&generic_exec, generic, 0));
    CHECK(cuGraphLaunch(generic_exec, s));
    CHECK(cuStreamSynchronize(s));
    printf("cuGraphAddNode: an allocation with its address written back: %s, freed by the next node, launched\n",
           yes_no(g != 0));
    CHECK(cuGraphExecDestroy(generic_exec));
    CHECK(cuGraphDestroy(generic));

    CHECK(cuMemFree(sum));
    printf("done\n");
    return 0;
}
