"""PyTorch end to end: cuBLAS, cuDNN, kernels of its own, pinned memory,
streams and events, and a few steps of training. Deterministic, so that the
GPU suite can compare its output natively and through gpuplex."""
import torch

torch.manual_seed(0)
torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
torch.use_deterministic_algorithms(True)
dev = torch.device("cuda")
print("device:", torch.cuda.get_device_name(0), "count:", torch.cuda.device_count())

def show(name, t):
    print("%s: shape %s sum %.4f" % (name, tuple(t.shape), t.double().sum().item()))

# cuBLAS and elementwise kernels.
a = torch.randn(512, 512, device=dev)
b = torch.randn(512, 512, device=dev)
show("matmul", a @ b)
show("tanh+mul", torch.tanh(a) * b + 1)
show("softmax", torch.softmax(a, dim=1))

# Host to device and back, from pageable and from pinned memory, async on a stream.
host = torch.arange(1 << 20, dtype=torch.float32)
pinned = host.pin_memory()
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    on_gpu = pinned.to(dev, non_blocking=True)
    doubled = on_gpu * 2
    back = torch.empty_like(pinned).pin_memory()
    back.copy_(doubled, non_blocking=True)
done = torch.cuda.Event()
done.record(stream)
done.synchronize()
print("pinned round trip ok:", bool(torch.equal(back, host * 2)))
print("pageable round trip ok:", bool(torch.equal(host.to(dev).cpu(), host)))

# cuDNN convolution.
conv = torch.nn.Conv2d(3, 8, 3, padding=1).to(dev)
image = torch.randn(4, 3, 32, 32, device=dev)
show("conv2d", conv(image))

# A few steps of training.
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(256, 64, device=dev)
y = torch.randint(0, 10, (256,), device=dev)
for step in range(20):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if step % 5 == 4:
        print("step %d loss %.4f" % (step + 1, loss.item()))
print("allocated after training > 0:", torch.cuda.memory_allocated() > 0)
print("done")
