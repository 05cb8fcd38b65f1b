#!/usr/bin/env python3
"""Framework workloads natively and through gpuplex, side by side.

PyTorch training steps (an MLP, a transformer encoder, a conv net, a small
GPT), a small-batch inference loop, a torch.compile'd training step, and a
jitted JAX training step. Each round runs every suite once natively and
once through gpuplex on each carrier, in an order that alternates from
round to round; each run is a fresh process, which times every step of
every workload (synchronized by reading the loss, as a training loop that
logs it does). A workload's figure per run is the median of its steps; the
table gives, per carrier, the median over rounds of the ratio to native in
the same round, with the spread of those ratios, and checks that every
loss matched native's exactly.

Usage: scripts/bench-frameworks.py [BIN_DIR] [--carriers shm,socket,tcp]
           [--rounds N] [--steps N] [--only NAME,...] [--trace DIR] [--json FILE]
BIN_DIR (default target/release) holds gpuplex and libcuda.so. With
--trace, one more run per workload through each carrier writes its
`gpuplex run --trace` table to DIR/CARRIER/NAME.txt.
"""
import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SUITES = {
    "torch": ["mlp", "transformer", "conv", "gpt", "inference", "compiled"],
    "jax": ["jax_mlp"],
}
WARMUP = 10


# ---------------------------------------------------------------- workloads
# Each builds its model and data from a fixed seed and returns `step()`,
# which runs one step and returns its loss as a Python float.

def torch_setup():
    import torch
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return torch


def train_step(torch, model, x, y, loss_fn):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def mlp_step(sizes, batch, act, compile=False):
    """A classifier of Linear layers of `sizes` with `act` between, trained on one batch."""
    torch = torch_setup()
    nn = torch.nn
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), act()]
    model = nn.Sequential(*layers[:-1]).cuda()
    x = torch.randn(batch, sizes[0], device="cuda")
    y = torch.randint(0, sizes[-1], (batch,), device="cuda")
    return train_step(torch, torch.compile(model) if compile else model, x, y, nn.functional.cross_entropy)


def w_mlp():
    import torch
    return mlp_step([1024, 4096, 4096, 10], 512, torch.nn.ReLU)


def w_transformer():
    torch = torch_setup()
    nn = torch.nn
    layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).cuda()
    x = torch.randn(16, 128, 512, device="cuda")
    y = torch.randn(16, 128, 512, device="cuda")
    return train_step(torch, model, x, y, nn.functional.mse_loss)


def w_conv():
    torch = torch_setup()
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 16 * 16, 10)).cuda()
    x = torch.randn(64, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    return train_step(torch, model, x, y, nn.functional.cross_entropy)


def gpt_model(torch, vocab=2048, d=256, heads=4, layers=4, seq=128):
    nn = torch.nn
    F = nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            return self.head(self.ln(self.blocks(x)))

    return GPT().cuda()


def w_gpt():
    torch = torch_setup()
    model = gpt_model(torch)
    idx = torch.randint(0, 2048, (8, 128), device="cuda")
    tgt = torch.randint(0, 2048, (8, 128), device="cuda")
    return train_step(torch, model, idx, tgt,
                      lambda logits, y: torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1)))


def w_inference():
    """Batch-1 generation-like loop: the GPT's forward on a short context, argmax, no grad."""
    torch = torch_setup()
    model = gpt_model(torch).eval()
    idx = torch.randint(0, 2048, (1, 32), device="cuda")

    def step():
        with torch.no_grad():
            logits = model(idx)
            return float(logits[0, -1].argmax().item())
    return step


def w_compiled():
    import torch
    return mlp_step([512, 2048, 2048, 10], 256, torch.nn.GELU, compile=True)


def w_jax_mlp():
    import jax
    import jax.numpy as jnp
    sizes = [1024, 4096, 4096, 10]
    keys = jax.random.split(jax.random.PRNGKey(0), len(sizes) + 1)
    params = [(jax.random.normal(k, (a, b)) / jnp.sqrt(a), jnp.zeros(b)) for k, a, b in zip(keys, sizes, sizes[1:])]
    x = jax.random.normal(keys[-2], (512, 1024))
    y = jax.random.randint(keys[-1], (512,), 0, 10)

    def loss_fn(params):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = params[-1]
        logits = h @ w + b
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    # Adam, written out: optax may not be installed.
    @jax.jit
    def update(params, m, v, t):
        loss, g = jax.value_and_grad(loss_fn)(params)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        params = jax.tree_util.tree_map(lambda p, m, v: p - 1e-3 * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), params, m, v)
        return params, m, v, loss

    state = {"p": params, "m": jax.tree_util.tree_map(jnp.zeros_like, params),
             "v": jax.tree_util.tree_map(jnp.zeros_like, params), "t": 0}

    def step():
        state["t"] += 1
        state["p"], state["m"], state["v"], loss = update(state["p"], state["m"], state["v"], state["t"])
        return float(loss)
    return step


def child(suite, steps, only):
    """Runs the suite's workloads; prints one JSON line each."""
    if suite == "jax":
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    for name in SUITES[suite]:
        if only and name not in only:
            continue
        try:
            step = globals()["w_" + name]()
            for _ in range(WARMUP):
                step()
            times, losses = [], []
            for _ in range(steps):
                t0 = time.perf_counter()
                losses.append(step())
                times.append((time.perf_counter() - t0) * 1e3)
            print(json.dumps({"name": name, "ms": times, "losses": losses}), flush=True)
        except Exception as e:  # reported, and the suite goes on
            print(json.dumps({"name": name, "error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)


# ------------------------------------------------------------------- driver

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Servers:
    """A gpuplex server listening on a Unix socket and on TCP loopback."""

    def __init__(self, bin_dir, work):
        self.bin = os.path.join(bin_dir, "gpuplex")
        self.sock = os.path.join(work, "gpuplex.sock")
        self.token = os.path.join(work, "token")
        with open(os.open(self.token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        self.port = free_port()
        self.log = open(os.path.join(work, "serve.log"), "w")
        self.proc = subprocess.Popen([self.bin, "serve", "--backend", "cuda", "--listen", "unix:" + self.sock,
                                      "--listen", f"tcp:127.0.0.1:{self.port}", "--token-file", self.token],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(600):
            if os.path.exists(self.sock):
                return
            time.sleep(0.05)
        raise SystemExit("gpuplex serve did not start (see serve.log)")

    def prefix(self, carrier, trace=False):
        run = [self.bin, "run"] + (["--trace"] if trace else [])
        if carrier == "tcp":
            return run + ["--server", f"tcp:127.0.0.1:{self.port}", "--token-file", self.token, "--"]
        return run + ["--server", "unix:" + self.sock, "--"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def run_suite(cmd, env, suite, steps, only, timeout):
    argv = cmd + [sys.executable, os.path.abspath(__file__), "--child", suite, "--steps", str(steps)]
    if only:
        argv += ["--only", ",".join(only)]
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {}, f"timed out after {timeout} s"
    results = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            results[r["name"]] = r
    return results, p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bin_dir", nargs="?", default="target/release")
    ap.add_argument("--carriers", default="shm,tcp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--only", default="")
    ap.add_argument("--suites", default="torch,jax")
    ap.add_argument("--trace", metavar="DIR")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    only = [n for n in a.only.split(",") if n]
    if a.child:
        return child(a.child, a.steps, only)

    carriers = [c for c in a.carriers.split(",") if c]
    work = tempfile.mkdtemp(prefix="bench-frameworks.")
    servers = Servers(os.path.abspath(a.bin_dir), work)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    columns = ["native"] + carriers
    # samples[suite_column][workload] = list of per-run medians; losses likewise.
    medians = {c: {} for c in columns}
    losses = {c: {} for c in columns}
    errors = {}
    try:
        for r in range(a.rounds):
            order = columns if r % 2 == 0 else columns[::-1]
            for suite in a.suites.split(","):
                for col in order:
                    cmd = [] if col == "native" else servers.prefix(col)
                    cenv = dict(env, GPUPLEX_CARRIER="socket") if col == "socket" else env
                    results, stderr = run_suite(cmd, cenv, suite, a.steps, only, a.timeout)
                    for name in SUITES[suite]:
                        if only and name not in only:
                            continue
                        res = results.get(name)
                        if res is None or "error" in res:
                            why = res["error"] if res else "no result: " + stderr.strip()[-1500:]
                            errors.setdefault((col, name), why)
                            continue
                        medians[col].setdefault(name, []).append(statistics.median(res["ms"]))
                        losses[col].setdefault(name, []).append(res["losses"])
                    print(f"round {r + 1}/{a.rounds}: {suite} {col} done", file=sys.stderr, flush=True)
        for carrier in carriers if a.trace else []:
            os.makedirs(os.path.join(a.trace, carrier), exist_ok=True)
            cenv = dict(env, GPUPLEX_CARRIER="socket") if carrier == "socket" else env
            for suite in a.suites.split(","):
                for name in SUITES[suite]:
                    if only and name not in only:
                        continue
                    _, stderr = run_suite(servers.prefix(carrier, trace=True), cenv, suite, a.steps, [name], a.timeout)
                    with open(os.path.join(a.trace, carrier, name + ".txt"), "w") as f:
                        f.write(stderr)
    finally:
        servers.stop()

    report = {"rounds": a.rounds, "steps": a.steps, "workloads": []}
    names = [n for s in a.suites.split(",") for n in SUITES[s] if not only or n in only]
    print(f"\n{a.rounds} rounds of {a.steps} steps (after {WARMUP} warm-up); ms per step, median of steps, "
          "then the median over rounds; ratio: median of the rounds' ratios to native [min-max]")
    head = f"{'workload':<12} {'native':>9}" + "".join(f" {c:>9} {'ratio':>20}" for c in carriers) + "  losses"
    print(head)
    for name in names:
        nat = medians["native"].get(name, [])
        row = {"name": name, "native_ms": nat, "carriers": {}}
        line = f"{name:<12} {statistics.median(nat) if nat else float('nan'):>9.3f}"
        same = True
        for c in carriers:
            ours = medians[c].get(name, [])
            ratios = [o / n for o, n in zip(ours, nat)] if len(ours) == len(nat) else []
            row["carriers"][c] = {"ms": ours, "ratios": ratios}
            if ratios:
                cell = f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
                line += f" {statistics.median(ours):>9.3f} {cell:>20}"
            else:
                line += f" {'-':>9} {'failed':>20}"
            if losses[c].get(name) != losses["native"].get(name):
                same = False
        row["losses_identical"] = same and bool(nat)
        line += "  " + ("identical" if row["losses_identical"] else "DIFFER")
        print(line)
        report["workloads"].append(row)
    for (col, name), why in sorted(errors.items()):
        print(f"error: {name} {col}: {why}")
    report["errors"] = {f"{c}/{n}": w for (c, n), w in errors.items()}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    ok = not errors and all(w["losses_identical"] for w in report["workloads"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
