// user_objects: cudaUserObjectCreate, as frameworks tie a resource's life
// to the graphs that use it: an object whose reference moves into a graph
// lives as long as the executable graph made from it; references the
// program holds, retained and released; a graph's own references released
// from it; what the runtime refuses. Destructors run once each, on a
// thread of CUDA's, some time after the last reference goes.
#include "check.h"

#include <atomic>
#include <chrono>
#include <thread>

static std::atomic<int> freed_a{0}, freed_b{0}, freed_c{0};

static void count_free(void *counter) { static_cast<std::atomic<int> *>(counter)->fetch_add(1); }

// Whether `n` reaches 1 within five seconds.
static bool freed(std::atomic<int> &n) {
    for (int i = 0; i < 500 && n.load() == 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return n.load() == 1;
}

static void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

// One thread adds v to *p. Reference: kernels.rs `add_to`.
__global__ void addTo(int *p, int v) { *p += v; }

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *d;
    CHECK(cudaMalloc(&d, sizeof(int)));
    CHECK(cudaMemset(d, 0, sizeof(int)));

    // One reference, moved into a captured graph; the executable graph keeps the object.
    cudaUserObject_t a;
    CHECK(cudaUserObjectCreate(&a, &freed_a, count_free, 1, cudaUserObjectNoDestructorSync));
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    addTo<<<1, 1, 0, s>>>(d, 1);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphRetainUserObject(g, a, 1, cudaGraphUserObjectMove));
    cudaGraphExec_t e;
    CHECK(cudaGraphInstantiate(&e, g, 0));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaStreamSynchronize(s));
    settle();
    bool kept = freed_a.load() == 0;
    CHECK(cudaGraphExecDestroy(e));
    int runs = 0;
    CHECK(cudaMemcpy(&runs, d, sizeof(int), cudaMemcpyDeviceToHost));
    printf("an object moved into a graph: kept by its executable graph %s, the graph ran %d times, "
           "destroyed after it %s\n",
           yes_no(kept), runs, yes_no(freed(freed_a)));

    // The program's own references: two made, one more retained, then released.
    cudaUserObject_t b;
    CHECK(cudaUserObjectCreate(&b, &freed_b, count_free, 2, cudaUserObjectNoDestructorSync));
    CHECK(cudaUserObjectRetain(b, 1));
    CHECK(cudaUserObjectRelease(b, 2));
    settle();
    bool held = freed_b.load() == 0;
    CHECK(cudaUserObjectRelease(b));
    printf("three references of the program's: kept after two are released %s, destroyed after the third %s\n",
           yes_no(held), yes_no(freed(freed_b)));

    // References a graph owns, released from it.
    cudaUserObject_t c;
    CHECK(cudaUserObjectCreate(&c, &freed_c, count_free, 1, cudaUserObjectNoDestructorSync));
    cudaGraph_t h;
    CHECK(cudaGraphCreate(&h, 0));
    CHECK(cudaGraphRetainUserObject(h, c, 2, 0));
    CHECK(cudaUserObjectRelease(c));
    settle();
    bool owned = freed_c.load() == 0;
    CHECK(cudaGraphReleaseUserObject(h, c, 2));
    printf("a graph's own references: kept while it holds them %s, destroyed once it releases them %s\n",
           yes_no(owned), yes_no(freed(freed_c)));
    CHECK(cudaGraphDestroy(h));

    // Refused: no flags, and no references.
    cudaUserObject_t bad;
    cudaError_t no_flags = cudaUserObjectCreate(&bad, &freed_c, count_free, 1, 0);
    cudaError_t no_refs = cudaUserObjectCreate(&bad, &freed_c, count_free, 0, cudaUserObjectNoDestructorSync);
    printf("refused: no flags %s, no references %s\n", cudaGetErrorName(no_flags), cudaGetErrorName(no_refs));
    cudaGetLastError();

    settle();
    printf("each destructor ran once: %s\n", yes_no(freed_a == 1 && freed_b == 1 && freed_c == 1));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    printf("done\n");
    return 0;
}
