#!/usr/bin/env python3
"""Framework workloads natively and through gpuplex, side by side.

PyTorch training steps (an MLP, a transformer encoder, a conv net, a small
GPT), a small-batch inference loop, a torch.compile'd training step, and a
jitted JAX training step, each step synchronized by reading its loss, as a
training loop that logs it does.

Every column (native, and gpuplex on each carrier) is one long-lived
process per suite that builds and warms up its workloads once; the
columns then take turns at the GPU, a few steps of one workload each, in
an order that reverses from turn to turn, so that each turn's ratio to
native compares steps taken moments apart. The machines' speed drifts by
tens of percent over seconds, which separate runs would compare. Fresh
processes are started `--sets` times, so that what one process happened
to get (its memory's placement, a library's choice of kernel) is not
taken for the carrier's cost. The table gives the median over all turns
of each turn's ratio with its 10th-90th percentile, and whether every loss
matched native's exactly.

JAX's columns share one set of autotuning results, made by a native
process first, so that they run the same kernels (`--own-autotuning`: each
process tunes its own, as a program left alone does).

Usage: scripts/bench-frameworks.py [BIN_DIR] [--carriers shm,socket,tcp]
           [--sets N] [--turns N] [--steps N] [--only NAME,...]
           [--baseline DIR] [--trace DIR] [--json FILE] [--own-autotuning]
BIN_DIR (default target/release) holds gpuplex and libcuda.so; with
--baseline, another build's BIN_DIR is measured too, as CARRIER@base
columns in the same turns. With --trace, one more process per workload
through each carrier writes its `gpuplex run --trace` table to
DIR/CARRIER/NAME.txt.
"""
import argparse
import json
import os
import queue
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SUITES = {
    "torch": ["mlp", "transformer", "conv", "gpt", "inference", "compiled"],
    "jax": ["jax_mlp"],
}
WARMUP = 10
# Untimed steps at the start of each turn: the GPU has just served another
# process, and the first steps after a switch pay for it in every column.
TURN_WARMUP = 2


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


def child(suite, only):
    """Builds the suite's workloads and warms each up, prints one JSON line
    naming them, then serves turns: each line `NAME WARM STEPS` read from
    stdin runs WARM untimed steps and STEPS timed ones of workload NAME and
    prints their times and losses as one JSON line."""
    if suite == "jax":
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    steps, errors = {}, {}
    for name in SUITES[suite]:
        if only and name not in only:
            continue
        try:
            step = globals()["w_" + name]()
            for _ in range(WARMUP):
                step()
            steps[name] = step
        except Exception as e:  # reported, and the suite goes on
            errors[name] = f"{type(e).__name__}: {e}"[:2000]
    print(json.dumps({"ready": list(steps), "errors": errors}), flush=True)
    for line in sys.stdin:
        name, warm, n = line.split()
        times, losses = [], []
        try:
            for _ in range(int(warm)):
                steps[name]()
            for _ in range(int(n)):
                t0 = time.perf_counter()
                losses.append(steps[name]())
                times.append((time.perf_counter() - t0) * 1e3)
            print(json.dumps({"name": name, "ms": times, "losses": losses}), flush=True)
        except Exception as e:
            print(json.dumps({"name": name, "error": f"{type(e).__name__}: {e}"[:2000]}), flush=True)


# ------------------------------------------------------------------- driver

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Servers:
    """A gpuplex server listening on a Unix socket and on TCP loopback."""

    def __init__(self, bin_dir, work):
        os.makedirs(work)
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


class Column:
    """One column's process for a suite: its workloads built once, then
    timed in turns on request (see `child`)."""

    def __init__(self, label, cmd, env, suite, only, work):
        self.label, self.error = label, None
        argv = cmd + [sys.executable, os.path.abspath(__file__), "--child", suite]
        if only:
            argv += ["--only", ",".join(only)]
        self.stderr_path = os.path.join(work, f"{suite}.{label.replace('@', '-')}.{time.monotonic_ns()}.err")
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(self.stderr_path, "w"), text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def reply(self, timeout):
        """The child's next JSON line, or None (with `error` set) if it ended or timed out."""
        if self.error:
            return None
        try:
            r = self.lines.get(timeout=timeout)
        except queue.Empty:
            r, self.error = None, f"no answer within {timeout} s"
            self.proc.kill()
        if r is None and not self.error:
            self.error = "ended: " + self.stderr_tail()
        return r

    def turn(self, name, warm, steps, timeout):
        if self.error:
            return None
        try:
            self.proc.stdin.write(f"{name} {warm} {steps}\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # the child is gone: reply() says why
        return self.reply(timeout)

    def close(self, timeout):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()

    def warnings(self):
        """gpuplex's own warnings so far (why a call failed), to go with an error."""
        with open(self.stderr_path) as f:
            ours = [line for line in f if line.startswith("gpuplex[")]
        return "".join("\n" + line.rstrip()[:500] for line in ours[-5:])

    def stderr_tail(self):
        with open(self.stderr_path) as f:
            return f.read().strip()[-1500:]


def share_autotuning(env, work, only, timeout):
    """The environment with XLA's autotuning results shared: one native JAX
    process autotunes every kernel into a cache, and every column's process
    then reads it. XLA picks kernels by timing candidates, and a choice can
    move a step by 25% from one process to the next, natively too; with one
    choice for all, each column runs the same kernels, as a comparison of
    carriers needs, and their losses can be compared exactly."""
    cache = os.path.join(work, "xla-autotune")
    os.makedirs(cache)
    flags = env.get("XLA_FLAGS", "") + f" --xla_gpu_per_fusion_autotune_cache_dir={cache}"
    shared = dict(env, XLA_FLAGS=flags.strip())
    primer = Column("autotune", [], shared, "jax", only, work)
    ready = primer.reply(timeout)
    primer.close(timeout)
    if not ready or ready.get("errors"):
        why = primer.error or ready["errors"]
        print(f"warning: the shared autotuning run failed ({why}); each JAX process autotunes itself",
              file=sys.stderr)
        return env
    if not os.listdir(cache):
        print("the native JAX run autotuned nothing (autotuning off?): nothing to share", file=sys.stderr)
        return env
    print(f"JAX columns share {len(os.listdir(cache))} autotuning results", file=sys.stderr)
    return shared


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bin_dir", nargs="?", default="target/release")
    ap.add_argument("--carriers", default="shm,tcp")
    ap.add_argument("--sets", type=int, default=3, help="fresh processes per column, one after another")
    ap.add_argument("--turns", type=int, default=10, help="turns per set of processes")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per turn")
    ap.add_argument("--only", default="")
    ap.add_argument("--suites", default="torch,jax")
    ap.add_argument("--baseline", metavar="DIR", help="another build's BIN_DIR, as CARRIER@base columns")
    ap.add_argument("--trace", metavar="DIR")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--own-autotuning", action="store_true",
                    help="each JAX process autotunes its kernels itself (default: all share one native run's)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds for a suite to start, or a turn to end")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    only = [n for n in a.only.split(",") if n]
    if a.child:
        return child(a.child, only)

    carriers = [c for c in a.carriers.split(",") if c]
    suites = [s for s in a.suites.split(",") if s]
    names = [n for s in suites for n in SUITES[s] if not only or n in only]
    work = tempfile.mkdtemp(prefix="bench-frameworks.")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if any(n in SUITES["jax"] for n in names) and not a.own_autotuning:
        env = share_autotuning(env, work, only, a.timeout)
    servers = {"": Servers(os.path.abspath(a.bin_dir), os.path.join(work, "this"))}
    if a.baseline:
        servers["@base"] = Servers(os.path.abspath(a.baseline), os.path.join(work, "base"))
    # (label, command prefix, environment) of every column; native first.
    columns = [("native", [], env)] + [
        (c + tag, srv.prefix(c), dict(env, GPUPLEX_CARRIER="socket") if c == "socket" else env)
        for tag, srv in servers.items() for c in carriers]
    labels = [c[0] for c in columns]
    # turns[label][name]: (set, median ms) per turn; losses[label][name][set]: every loss in order.
    turns = {c: {n: [] for n in names} for c in labels}
    losses = {c: {n: {} for n in names} for c in labels}
    errors = {}
    try:
        for s in range(a.sets):
            for suite in suites:
                procs = [Column(label, cmd, cenv, suite, only, work) for label, cmd, cenv in columns]
                for p in procs:
                    ready = p.reply(a.timeout)
                    for name, why in (ready or {}).get("errors", {}).items():
                        errors.setdefault((p.label, name), why)
                mine = [n for n in SUITES[suite] if n in names]
                for t in range(a.turns):
                    order = procs if (s * a.turns + t) % 2 == 0 else procs[::-1]
                    for name in mine:
                        for p in order:
                            r = p.turn(name, TURN_WARMUP, a.steps, a.timeout)
                            if r is None or "error" in r:
                                errors.setdefault((p.label, name), r["error"] + p.warnings() if r else p.error)
                                continue
                            turns[p.label][name].append((s, t, statistics.median(r["ms"])))
                            losses[p.label][name].setdefault(s, []).extend(r["losses"])
                for p in procs:
                    if p.error:
                        errors.setdefault((p.label, suite), p.error)
                    p.close(a.timeout)
                print(f"set {s + 1}/{a.sets}: {suite} done", file=sys.stderr, flush=True)
        for carrier in carriers if a.trace else []:
            os.makedirs(os.path.join(a.trace, carrier), exist_ok=True)
            cenv = dict(env, GPUPLEX_CARRIER="socket") if carrier == "socket" else env
            for suite in suites:
                for name in SUITES[suite]:
                    if name not in names:
                        continue
                    p = Column(carrier, servers[""].prefix(carrier, trace=True), cenv, suite, [name], work)
                    if p.reply(a.timeout):
                        p.turn(name, 0, a.steps, a.timeout)
                    p.close(a.timeout)
                    with open(os.path.join(a.trace, carrier, name + ".txt"), "w") as f, open(p.stderr_path) as e:
                        f.write(e.read())
    finally:
        for srv in servers.values():
            srv.stop()
    return report(a, labels, names, turns, losses, errors)


def report(a, labels, names, turns, losses, errors):
    others = labels[1:]
    print(f"\n{a.sets} sets of processes x {a.turns} turns x {a.steps} steps (after {WARMUP} warm-up steps, "
          f"and {TURN_WARMUP} more each turn); ms per step: median over turns of each turn's median; "
          "ratio: median of the turns' ratios to native [10th-90th percentile]")
    print(f"{'workload':<12} {'native':>8}" + "".join(f" {c:>9} {'ratio':>19}" for c in others) + "  losses")
    out = {"sets": a.sets, "turns": a.turns, "steps": a.steps, "workloads": []}
    for name in names:
        nat = {(s, t): ms for s, t, ms in turns["native"][name]}
        row = {"name": name, "native_ms": [ms for _, _, ms in turns["native"][name]], "columns": {}}
        line = f"{name:<12} {statistics.median(nat.values()) if nat else float('nan'):>8.3f}"
        same = bool(nat)
        for c in others:
            ours = turns[c][name]
            ratios = [(s, ms / nat[s, t]) for s, t, ms in ours if (s, t) in nat]
            by_set = [statistics.median(r for s2, r in ratios if s2 == s) for s in range(a.sets)
                      if any(s2 == s for s2, _ in ratios)]
            row["columns"][c] = {"ms": [ms for _, _, ms in ours], "ratios": [r for _, r in ratios],
                                 "set_medians": by_set}
            if ratios:
                rs = [r for _, r in ratios]
                cell = f"{statistics.median(rs):.3f} [{percentile(rs, 0.1):.3f}-{percentile(rs, 0.9):.3f}]"
                line += f" {statistics.median(ms for _, _, ms in ours):>9.3f} {cell:>19}"
            else:
                line += f" {'-':>9} {'failed':>19}"
            if losses[c][name] != losses["native"][name]:
                same = False
        row["losses_identical"] = same
        line += "  " + ("identical" if same else "DIFFER")
        print(line)
        out["workloads"].append(row)
    if a.sets > 1:
        print("each set's median ratio: " + "; ".join(
            f"{w['name']} {c} " + "/".join(f"{m:.3f}" for m in w["columns"][c]["set_medians"])
            for w in out["workloads"] for c in others if w["columns"][c]["set_medians"]))
    for (col, name), why in sorted(errors.items()):
        print(f"error: {name} {col}: {why}")
    out["errors"] = {f"{c}/{n}": w for (c, n), w in errors.items()}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    ok = not errors and all(w["losses_identical"] for w in out["workloads"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
