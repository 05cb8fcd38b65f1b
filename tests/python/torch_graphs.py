"""PyTorch's CUDA graphs and allocator back-ends: a training step captured
with torch.cuda.CUDAGraph and replayed, a model compiled with
torch.compile(mode="reduce-overhead") (CUDA graphs under the hood), and the
same step under each allocator back-end. Deterministic, so that the GPU
suite can compare its output natively and through gpuplex.

Usage: torch_graphs.py [native|async|expandable] -- the allocator: PyTorch's
own caching allocator, cudaMallocAsync (stream-ordered pools), or
expandable segments (virtual memory management). Only the first also
compiles, which takes long."""
import os
import sys

allocator = sys.argv[1] if len(sys.argv) > 1 else "native"
conf = {"native": None, "async": "backend:cudaMallocAsync", "expandable": "expandable_segments:True"}[allocator]
if conf:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf

import torch  # noqa: E402  (the allocator is chosen before CUDA starts)

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.use_deterministic_algorithms(True)
dev = torch.device("cuda")
print("allocator:", allocator, torch.cuda.get_allocator_backend())


def total(t):
    return "%.4f" % t.double().sum().item()


# A training step captured whole (forward, backward, optimizer) and replayed
# on new data copied into the captured input, as PyTorch's docs show it.
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = torch.nn.CrossEntropyLoss()
static_x = torch.randn(128, 64, device=dev)
static_y = torch.randint(0, 10, (128,), device=dev)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(static_x), static_y).backward()
        opt.step()
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
opt.zero_grad(set_to_none=True)
with torch.cuda.graph(graph):
    static_loss = loss_fn(model(static_x), static_y)
    static_loss.backward()
    opt.step()
for step in range(5):
    static_x.copy_(torch.randn(128, 64, device=dev))
    static_y.copy_(torch.randint(0, 10, (128,), device=dev))
    graph.replay()
    print("replay %d loss %.4f" % (step, static_loss.item()))
print("weights after the replays:", total(model[0].weight))

# Memory freed and taken again through the allocator back-end.
blocks = [torch.empty(1 << 20, device=dev) for _ in range(16)]
del blocks[::2]
more = [torch.ones(1 << 19, device=dev) for _ in range(8)]
print("allocated in use:", torch.cuda.memory_allocated() > 0, "sum of new blocks:", total(torch.stack(more)))

if allocator == "native":
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).to(dev)
    compiled = torch.compile(net, mode="reduce-overhead")
    with torch.no_grad():
        for i in range(4):
            out = compiled(torch.full((16, 32), 0.1 * (i + 1), device=dev))
            print("compiled call %d: %s" % (i, total(out)))
torch.cuda.synchronize()
print("done")
