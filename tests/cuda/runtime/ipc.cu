// ipc: device memory and an event shared with another process, as NVIDIA's
// simpleIPC sample shares them. The parent fills a buffer on the device,
// records an interprocess event after it and starts a child process (this
// program again) with the two IPC handles. The child opens both, waits on
// the event, checks the buffer, doubles it in place and closes the memory;
// the parent then finds the buffer doubled.
#include "check.h"

#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

static const int N = 1 << 16;

// p[i] = 3 * i.
__global__ void fill(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = 3 * i;
}

// p[i] *= 2.
__global__ void twice(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= 2;
}

static std::string hex(const void *bytes, size_t n) {
    std::string s;
    char two[3];
    for (size_t i = 0; i < n; i++) {
        snprintf(two, sizeof two, "%02x", ((const unsigned char *)bytes)[i]);
        s += two;
    }
    return s;
}

static void unhex(const char *s, void *bytes, size_t n) {
    EXPECT(strlen(s) == 2 * n, "a handle of %zu hex digits", 2 * n);
    for (size_t i = 0; i < n; i++) sscanf(s + 2 * i, "%2hhx", (unsigned char *)bytes + i);
}

static bool all(const std::vector<int> &v, int factor) {
    for (int i = 0; i < N; i++)
        if (v[i] != factor * i) return false;
    return true;
}

static int child(const char *mem_hex, const char *event_hex) {
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t event_handle;
    unhex(mem_hex, &mem, sizeof mem);
    unhex(event_hex, &event_handle, sizeof event_handle);
    int *p;
    CHECK(cudaIpcOpenMemHandle((void **)&p, mem, cudaIpcMemLazyEnablePeerAccess));
    cudaEvent_t ready;
    CHECK(cudaIpcOpenEventHandle(&ready, event_handle));
    CHECK(cudaStreamWaitEvent(0, ready, 0));
    std::vector<int> seen(N);
    CHECK(cudaMemcpy(seen.data(), p, N * sizeof(int), cudaMemcpyDeviceToHost));
    printf("child: the parent's buffer, filled: %s\n", yes_no(all(seen, 3)));
    twice<<<(N + 255) / 256, 256>>>(p, N);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaIpcCloseMemHandle(p));
    CHECK(cudaEventDestroy(ready));
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "child") == 0) return child(argv[2], argv[3]);

    int *p;
    CHECK(cudaMalloc(&p, N * sizeof(int)));
    fill<<<(N + 255) / 256, 256>>>(p, N);
    CHECK_LAUNCH();
    cudaEvent_t ready;
    CHECK(cudaEventCreateWithFlags(&ready, cudaEventInterprocess | cudaEventDisableTiming));
    CHECK(cudaEventRecord(ready, 0));
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t event_handle;
    CHECK(cudaIpcGetMemHandle(&mem, p));
    CHECK(cudaIpcGetEventHandle(&event_handle, ready));
    printf("parent: handles made\n");
    fflush(stdout);

    std::string mem_hex = hex(&mem, sizeof mem), event_hex = hex(&event_handle, sizeof event_handle);
    pid_t pid = fork();
    if (pid == 0) {
        char *args[] = {argv[0], (char *)"child", (char *)mem_hex.c_str(), (char *)event_hex.c_str(), nullptr};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int status = 0;
    EXPECT(pid > 0 && waitpid(pid, &status, 0) == pid, "a child process");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "ipc.cu: the child failed: status %d\n", status);
        return 1;
    }
    std::vector<int> back(N);
    CHECK(cudaMemcpy(back.data(), p, N * sizeof(int), cudaMemcpyDeviceToHost));
    printf("parent: the child doubled the buffer: %s\n", yes_no(all(back, 6)));
    CHECK(cudaEventDestroy(ready));
    CHECK(cudaFree(p));
    printf("done\n");
    return 0;
}
