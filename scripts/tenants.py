#!/usr/bin/env python3
"""GPU-time sharing between tenants, natively and through gpuplex, on a GPU.

Each tenant is a separate process of its own uid running
tests/cuda/sched/busy_loop (a closed loop of launch + synchronize of a
kernel whose blocks each wait a set time), all started to measure the same
window. Natively they share the GPU by the driver's time-slicing; through
gpuplex they are tenants of one server (`--config`, one uid each) under
each policy. Prints, per scenario, each tenant's kernels per second, its
share of the GPU time the server measured, Jain's index and the aggregate
against one tenant alone.

Usage (as root, for the uids): scripts/tenants.py BIN_DIR [SECONDS]
  BIN_DIR holds gpuplex and libcuda.so; $CUDA_HOME (default /usr/local/cuda)
  has nvcc. With $OUT set, the report is also written to $OUT/tenants.txt.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.abspath(sys.argv[1])
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
CUDA = os.environ.get("CUDA_HOME", "/usr/local/cuda")
WORK = tempfile.mkdtemp(prefix="gpuplex-tenants.")
os.chmod(WORK, 0o755)
LOOP = os.path.join(WORK, "busy_loop")
LONG = ("528", "500")  # blocks, microseconds per block: the whole GPU, 0.5 ms
SMALL = ("8", "100")  # a few SMs for 0.1 ms
UID0 = 2000
report = []


def say(line=""):
    print(line, flush=True)
    report.append(line)


def build():
    src = os.path.join(ROOT, "tests/cuda/sched/busy_loop.cu")
    subprocess.run([f"{CUDA}/bin/nvcc", "-O2", "-o", LOOP, src], check=True)
    os.chmod(LOOP, 0o755)


def tenant_cmd(i, shape, start, server):
    loop = [LOOP, str(SECONDS), shape[0], shape[1], f"{start:.3f}"]
    as_user = ["setpriv", f"--reuid={UID0 + i}", f"--regid={UID0 + i}", "--clear-groups"]
    if server is None:
        return as_user + loop
    return as_user + [f"{BIN}/gpuplex", "run", "--server", server, "--"] + loop


def run_tenants(shapes, server=None):
    """Runs one process per shape, together; returns each one's figures."""
    start = time.time() + 3.0
    procs = [subprocess.Popen(tenant_cmd(i, s, start, server), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, s in enumerate(shapes)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=SECONDS + 60)
        if p.returncode != 0:
            raise SystemExit(f"a tenant failed ({p.returncode}): {err.strip()[-400:]}")
        words = out.split()
        results.append({words[k]: float(words[k + 1]) for k in range(0, len(words), 2)})
    return results


class Server:
    def __init__(self, policy, weights, classes):
        self.sock = os.path.join(WORK, f"{policy}.sock")
        config = os.path.join(WORK, f"{policy}.toml")
        with open(config, "w") as f:
            for i, (w, c) in enumerate(zip(weights, classes)):
                f.write(f'[tenants.t{i}]\nuids = [{UID0 + i}]\nweight = {w}\npriority = "{c}"\n\n')
        old = os.umask(0)
        self.proc = subprocess.Popen([f"{BIN}/gpuplex", "serve", "--listen", f"unix:{self.sock}", "--config", config,
                                      "--workers", str(len(weights)), "--policy", policy],
                                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, f"{policy}.log"), "w"))
        os.umask(old)
        for _ in range(300):
            if os.path.exists(self.sock):
                break
            time.sleep(0.1)
        self.address = f"unix:{self.sock}"

    def gpu_seconds(self):
        out = subprocess.run([f"{BIN}/gpuplex", "status", "--server", self.address, "--json"], check=True,
                             capture_output=True, text=True).stdout
        s = json.loads(out)
        return {t["name"]: sum(g["compute_seconds"] for g in t["gpu_time"]) for t in s["tenants"]}

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def jain(xs):
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


def show(name, results, alone, used=None, weights=None):
    rates = [r["per_second"] for r in results]
    line = f"{name:<44} jain {jain([r / (w or 1) for r, w in zip(rates, weights or [1] * len(rates))]):.4f}" \
           f"  aggregate/alone {sum(rates) / alone:.3f}"
    say(line)
    total = sum(used.values()) if used else 0
    for i, r in enumerate(results):
        share = f"  gpu-time share {used.get(f't{i}', 0) / total:.3f}" if total else ""
        want = f" (weight share {weights[i] / sum(weights):.3f})" if weights else ""
        say(f"    t{i}: {r['per_second']:8.1f}/s  p50 {r['p50_us']:9.1f} us  p99 {r['p99_us']:9.1f} us{share}{want}")


def under(policy, shapes, weights=None, classes=None):
    """Tenants running `shapes` through one server; its configuration may
    list more tenants (`weights`), which stay idle."""
    weights = weights or [1] * len(shapes)
    classes = classes or ["normal"] * len(weights)
    server = Server(policy, weights, classes)
    try:
        before = server.gpu_seconds()
        results = run_tenants(shapes, server.address)
        after = server.gpu_seconds()
        used = {k: v - before.get(k, 0.0) for k, v in after.items()}
        return results, used
    finally:
        server.close()


def main():
    build()
    say(f"tenants: {SECONDS:.0f} s windows; long kernel {LONG[0]} blocks x {LONG[1]} us, small {SMALL[0]} x {SMALL[1]} us")
    for kind, shape in (("long", LONG), ("small", SMALL)):
        native1 = run_tenants([shape])[0]["per_second"]
        fair1, _ = under("fair", [shape])
        none1, _ = under("none", [shape])
        say(f"{kind}: one alone natively {native1:.1f}/s; through gpuplex fair {fair1[0]['per_second']:.1f}/s "
            f"(x{fair1[0]['per_second'] / native1:.3f}), none {none1[0]['per_second']:.1f}/s "
            f"(x{none1[0]['per_second'] / native1:.3f})")
        show(f"{kind}: 8 tenants natively", run_tenants([shape] * 8), native1)
        for policy in ("fair", "none"):
            results, used = under(policy, [shape] * 8)
            show(f"{kind}: 8 tenants through gpuplex, {policy}", results, native1, used)
    native1 = run_tenants([LONG])[0]["per_second"]
    results, used = under("fair", [LONG] * 3, weights=[1, 2, 4])
    show("long: weights 1:2:4, fair", results, native1, used, [1, 2, 4])
    results, used = under("fair", [LONG] * 2, weights=[1, 2, 4])
    show("long: weights 1:2:4, the weight-4 tenant idle, fair", results, native1, used, [1, 2])
    hi_alone = run_tenants([SMALL])[0]
    say(f"priority: the short-kernel tenant alone natively: p50 {hi_alone['p50_us']:.1f} us, p99 {hi_alone['p99_us']:.1f} us")
    show("priority: short beside 7 long, natively", run_tenants([SMALL] + [LONG] * 7), native1)
    results, used = under("fair", [SMALL] + [LONG] * 7, classes=["high"] + ["normal"] * 7)
    show("priority: short (high) beside 7 long, fair", results, native1, used)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "tenants.txt"), "w") as f:
            f.write("\n".join(report) + "\n")


main()
