// graph_conditional: conditional graph nodes, as the graphConditionalNodes
// sample uses them. A kernel sets a handle's value on the device; an if
// node (with and without an else body), a while node and a switch node run
// their body graphs by it. Built node by node, and once from a captured
// stream whose conditional body is captured too. Each graph is launched
// several times with new input between launches.
#include "check.h"

// Sets the condition to *value. Reference: kernels.rs `set_condition`.
__global__ void setCondition(const int *value, cudaGraphConditionalHandle handle) {
    cudaGraphSetConditional(handle, *value);
}

// *p += v. Reference: kernels.rs `add_to`.
__global__ void addTo(int *p, int v) { *p += v; }

// One round of a while loop: counts *counter down and *rounds up, and goes
// on while *counter is above 0. Reference: kernels.rs `count_down`.
__global__ void countDown(int *counter, int *rounds, cudaGraphConditionalHandle handle) {
    *counter -= 1;
    *rounds += 1;
    cudaGraphSetConditional(handle, *counter > 0);
}

static int *d_value, *d_sum, *d_rounds;

static void set(int *d, int v) { CHECK(cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice)); }

static int get(const int *d) {
    int v;
    CHECK(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost));
    return v;
}

static cudaGraphNode_t kernel_node(cudaGraph_t g, const cudaGraphNode_t *dep, void *fn, void **args) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeKernel;
    p.kernel.func = fn;
    p.kernel.gridDim = dim3(1);
    p.kernel.blockDim = dim3(1);
    p.kernel.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddNode(&node, g, dep, nullptr, dep ? 1 : 0, &p));
    return node;
}

static cudaGraphNode_t add_to_node(cudaGraph_t g, int v) {
    void *args[] = {&d_sum, &v};
    return kernel_node(g, nullptr, (void *)addTo, args);
}

// A graph of setCondition(d_value) then a conditional node of `type` with
// `size` bodies; body i adds adds[i] to the sum.
static cudaGraph_t conditional_graph(cudaGraphConditionalNodeType type, unsigned size, const int *adds,
                                     cudaGraphNode_t *cond_out) {
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle handle;
    CHECK(cudaGraphConditionalHandleCreate(&handle, g, 0, 0));
    void *args[] = {&d_value, &handle};
    cudaGraphNode_t setter = kernel_node(g, nullptr, (void *)setCondition, args);
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = handle;
    p.conditional.type = type;
    p.conditional.size = size;
    CHECK(cudaGraphAddNode(cond_out, g, &setter, nullptr, 1, &p));
    for (unsigned i = 0; i < size; i++) add_to_node(p.conditional.phGraph_out[i], adds[i]);
    return g;
}

// Launches `g` once for each value, printing the sum after each.
static void run(const char *what, cudaGraph_t g, const int *values, int n, cudaStream_t s) {
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    set(d_sum, 0);
    printf("%s:", what);
    for (int i = 0; i < n; i++) {
        set(d_value, values[i]);
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        printf(" %d->%d", values[i], get(d_sum));
    }
    printf("\n");
    CHECK(cudaGraphExecDestroy(exec));
}

int main() {
    CHECK(cudaMalloc(&d_value, sizeof(int)));
    CHECK(cudaMalloc(&d_sum, sizeof(int)));
    CHECK(cudaMalloc(&d_rounds, sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int values[] = {1, 0, 3, 0, 2, 7};

    // if: the body runs when the value is not 0.
    const int if_adds[] = {1};
    cudaGraphNode_t cond;
    cudaGraph_t g = conditional_graph(cudaGraphCondTypeIf, 1, if_adds, &cond);
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(cond, &type));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    printf("if graph: %zu nodes, the conditional's type is conditional: %s\n", nodes,
           yes_no(type == cudaGraphNodeTypeConditional));
    run("if", g, values, 6, s);
    CHECK(cudaGraphDestroy(g));

    // if/else: the second body runs when the value is 0.
    const int else_adds[] = {10, 100};
    g = conditional_graph(cudaGraphCondTypeIf, 2, else_adds, &cond);
    run("if/else", g, values, 6, s);
    CHECK(cudaGraphDestroy(g));

    // switch: body n runs for value n; a value past the last runs none.
    const int switch_adds[] = {1, 10, 100, 1000};
    g = conditional_graph(cudaGraphCondTypeSwitch, 4, switch_adds, &cond);
    run("switch", g, values, 6, s);
    CHECK(cudaGraphDestroy(g));

    // while: starts true (its default, applied at each launch) and counts
    // d_value down to 0 in as many rounds.
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle handle;
    CHECK(cudaGraphConditionalHandleCreate(&handle, g, 1, cudaGraphCondAssignDefault));
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = handle;
    p.conditional.type = cudaGraphCondTypeWhile;
    p.conditional.size = 1;
    CHECK(cudaGraphAddNode(&cond, g, nullptr, nullptr, 0, &p));
    void *args[] = {&d_value, &d_rounds, &handle};
    kernel_node(p.conditional.phGraph_out[0], nullptr, (void *)countDown, args);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    printf("while:");
    for (int start : {5, 1, 12}) {
        set(d_value, start);
        set(d_rounds, 0);
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        printf(" from %d: %d rounds, ends at %d;", start, get(d_rounds), get(d_value));
    }
    printf("\n");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));

    // Captured: the setter is captured, the conditional node joins the
    // capture, and its body is captured from another stream.
    cudaStream_t body_stream;
    CHECK(cudaStreamCreateWithFlags(&body_stream, cudaStreamNonBlocking));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus status;
    cudaGraph_t captured;
    const cudaGraphNode_t *deps;
    size_t ndeps;
    CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &captured, nullptr, nullptr, nullptr));
    CHECK(cudaGraphConditionalHandleCreate(&handle, captured, 0, 0));
    setCondition<<<1, 1, 0, s>>>(d_value, handle);
    CHECK_LAUNCH();
    CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, &captured, &deps, nullptr, &ndeps));
    p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = handle;
    p.conditional.type = cudaGraphCondTypeIf;
    p.conditional.size = 1;
    CHECK(cudaGraphAddNode(&cond, captured, deps, nullptr, ndeps, &p));
    CHECK(cudaStreamUpdateCaptureDependencies(s, &cond, nullptr, 1, cudaStreamSetCaptureDependencies));
    CHECK(cudaStreamBeginCaptureToGraph(body_stream, p.conditional.phGraph_out[0], nullptr, nullptr, 0,
                                        cudaStreamCaptureModeGlobal));
    addTo<<<1, 1, 0, body_stream>>>(d_sum, 5);
    CHECK_LAUNCH();
    cudaGraph_t body;
    CHECK(cudaStreamEndCapture(body_stream, &body));
    printf("captured body is the node's body: %s\n", yes_no(body == p.conditional.phGraph_out[0]));
    addTo<<<1, 1, 0, s>>>(d_sum, 1000);
    CHECK_LAUNCH();
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    printf("captured graph: %zu nodes\n", nodes);
    run("captured if", g, values, 6, s);
    CHECK(cudaGraphDestroy(g));

    CHECK(cudaStreamDestroy(body_stream));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d_value));
    CHECK(cudaFree(d_sum));
    CHECK(cudaFree(d_rounds));
    printf("done\n");
    return 0;
}
