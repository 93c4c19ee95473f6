#!/usr/bin/env python3
"""Inner-step throughput of `xloco train` (tiny GPT, 1 rank) against the PyTorch reference
(gpt_torch.py: same model, batch, optimizer and thread count), in one run, interleaved so that
both see the same machine state. Also sweeps LibTorch intra-op x OpenBLAS threads for xloco.
Each row also has xloco with LibTorch's attention (run.kernels=aten: the fused kernel's own
share) and PyTorch on OpenBLAS's own choice of kernels (what `python3` gets where OpenBLAS does
not know the CPU; xloco picks the kernels the CPU can run, src/inner/blas_core.h). The ratios
the goal is held to are against PyTorch on the same OpenBLAS kernels as xloco.

usage: throughput.py XLOCO_BIN [--steps N] [--repeats R]
       throughput.py XLOCO_BIN --torchscript   # the built-in tiny GPT against its TorchScript
                                               # twin (examples/tiny_gpt.py), both in xloco
       throughput.py XLOCO_BIN --torch2 PYTHON   # against PyTorch 2.x (PYTHON: an interpreter
                                               # with PyPI's torch, deploy/setup_torch2.sh)
                                               # eager and torch.compile, beside Debian's 1.13
       throughput.py XLOCO_BIN --mfu BENCH_MATMUL   # model FLOPs utilisation at 1 x 1 threads:
                                               # the tiny GPT and a 25 M GPT against LibTorch's
                                               # sgemm at their shapes (bench_matmul), one run"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import platform
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


CORE = {}  # the OpenBLAS core xloco ran on (its log), for the references


def xloco_rate(binary, steps, threads, blas, batch, extra=()):
    with tempfile.TemporaryDirectory() as d:
        cmd = [binary, "train", "--config", os.path.join(ROOT, "configs/kjv-tiny.json"),
               "--set", f"run.dir={d}", "--set", "run.name=bench", "--set", f"inner.steps={steps}",
               "--set", "inner.warmup_steps=5", "--set", "inner.log_every=5",
               "--set", "inner.eval_every=0", "--set", "inner.checkpoint_every=0",
               "--set", f"inner.batch_size={batch}",
               "--set", f"run.threads={threads}", "--set", f"run.blas_threads={blas}", *extra]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        m = re.search(r"OpenBLAS core (\S+):", out.stdout + out.stderr)
        if m and "name" not in CORE:
            CORE["name"] = m.group(1)
            print(f"# xloco runs OpenBLAS core {m.group(1)}", flush=True)
        rows = [json.loads(l) for l in open(os.path.join(d, "bench/metrics/provider-0.jsonl"))]
        rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]  # skip warm-up window
        return statistics.mean(rates)


def machine():
    """The machine a figure belongs to: CPU model (lscpu), cores, kernel."""
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "")
    except OSError:
        pass
    return f"{model or platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores, Linux {platform.release()}"


def blas_env(env, core):
    """OPENBLAS_CORETYPE = core, or OpenBLAS's own choice when core is None."""
    env = dict(env)
    env.pop("OPENBLAS_CORETYPE", None)
    if core:
        env["OPENBLAS_CORETYPE"] = core
    return env


def torch_rate(steps, threads, blas, batch, core=None, python=None, extra=()):
    env = blas_env(dict(os.environ, OPENBLAS_NUM_THREADS=str(blas), OMP_NUM_THREADS=str(threads)), core)
    py = python or (sys.executable if sys.executable.startswith("/usr/bin") else "/usr/bin/python3")
    out = subprocess.run([py, os.path.join(HERE, "gpt_torch.py"), "--steps", str(steps), "--threads",
                          str(threads), "--batch", str(batch), *extra],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["tokens_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("xloco")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--torchscript", action="store_true",
                    help="built-in tiny GPT vs its TorchScript twin, both trained by xloco")
    ap.add_argument("--torch2", metavar="PYTHON",
                    help="against PyTorch 2.x in this interpreter (eager, SDPA, torch.compile) and Debian's 1.13")
    ap.add_argument("--mfu", metavar="BENCH_MATMUL",
                    help="model FLOPs utilisation against this bench_matmul binary's sgemm")
    a = ap.parse_args()
    print(f"# machine: {machine()}")
    if a.mfu:
        return mfu(a)
    if a.torch2:
        return torch2(a)
    if a.torchscript:
        return torchscript(a)
    cores = os.cpu_count()
    print(f"# tiny GPT (d128 L4 H4 T128), batch {a.batch}, {a.steps} steps, {a.repeats} repeats, {cores} cores")
    xloco_rate(a.xloco, 6, 1, 1, a.batch)  # which OpenBLAS core xloco runs (printed)
    core = CORE.get("name")
    print("| threads (intra-op x OpenBLAS) | xloco tok/s | xloco, LibTorch attention | "
          f"PyTorch tok/s, OpenBLAS {core} | PyTorch tok/s, OpenBLAS's own choice | "
          "ratio (same kernels) | ratio (PyTorch as installed) |")
    print("|---|---|---|---|---|---|---|")
    xl, xa, pt, pd = {}, {}, {}, {}
    for threads in sorted({1, cores}):
        for blas in sorted({1, cores}):
            xs, xas, ts, ds = [], [], [], []
            for _ in range(a.repeats):  # interleaved: all see the same machine state
                xs.append(xloco_rate(a.xloco, a.steps, threads, blas, a.batch))
                xas.append(xloco_rate(a.xloco, a.steps, threads, blas, a.batch, ("--set", "run.kernels=aten")))
                ts.append(torch_rate(a.steps, threads, blas, a.batch, core))
                ds.append(torch_rate(a.steps, threads, blas, a.batch, None))
            k = (threads, blas)
            xl[k], xa[k] = statistics.median(xs), statistics.median(xas)
            pt[k], pd[k] = statistics.median(ts), statistics.median(ds)
            print(f"| {threads} x {blas} | {xl[k]:.0f} | {xa[k]:.0f} | {pt[k]:.0f} | {pd[k]:.0f} | "
                  f"{xl[k] / pt[k]:.2f} | {xl[k] / pd[k]:.2f} |", flush=True)
    bx, bp, bd = max(xl, key=xl.get), max(pt, key=pt.get), max(pd, key=pd.get)
    print(f"\nbest xloco:   {xl[bx]:.0f} tok/s at {bx[0]} intra-op x {bx[1]} OpenBLAS threads")
    print(f"best PyTorch (OpenBLAS {core}): {pt[bp]:.0f} tok/s at {bp[0]} intra-op x {bp[1]} OpenBLAS threads")
    print(f"best PyTorch (OpenBLAS's own choice): {pd[bd]:.0f} tok/s at {bd[0]} x {bd[1]}")
    print(f"ratio best xloco / best PyTorch, same kernels = {xl[bx] / pt[bp]:.2f} (goal >= 1.15); "
          f"at 1 x 1 = {xl[(1, 1)] / pt[(1, 1)]:.2f} (goal >= 1.15)")
    print(f"ratio best xloco / best PyTorch as installed = {xl[bx] / pd[bd]:.2f}")
    print(f"fused attention alone (xloco fused / xloco aten), best setting: {xl[bx] / xa[bx]:.2f}; "
          f"1 x 1: {xl[(1, 1)] / xa[(1, 1)]:.2f}")


def torch2(a):
    """xloco against PyTorch 2.x from PyPI (its own MKL BLAS) in its three forms a user would run
    (eager as nanoGPT's 1.13 code, eager with scaled_dot_product_attention, torch.compile of
    that), and Debian's 1.13 on the OpenBLAS kernels xloco runs: every thread setting of 1 and
    all cores, interleaved, the median of the repeats; best against best and 1 x 1."""
    cores = os.cpu_count()
    version = subprocess.run([a.torch2, "-c", "import torch; print(torch.__version__)"],
                             check=True, capture_output=True, text=True).stdout.strip()
    print(f"# tiny GPT (d128 L4 H4 T128), batch {a.batch}, {a.steps} steps, {a.repeats} repeats, {cores} cores; "
          f"PyTorch {version} from {a.torch2}")
    xloco_rate(a.xloco, 6, 1, 1, a.batch)
    core = CORE.get("name")
    runs = {"xloco": lambda t, b: xloco_rate(a.xloco, a.steps, t, b, a.batch),
            f"PyTorch 1.13 (OpenBLAS {core})": lambda t, b: torch_rate(a.steps, t, b, a.batch, core),
            f"PyTorch {version} eager": lambda t, b: torch_rate(a.steps, t, b, a.batch, python=a.torch2),
            f"PyTorch {version} eager, SDPA": lambda t, b: torch_rate(
                a.steps, t, b, a.batch, python=a.torch2, extra=("--attention", "sdpa")),
            f"PyTorch {version} torch.compile, SDPA": lambda t, b: torch_rate(
                a.steps, t, b, a.batch, python=a.torch2, extra=("--attention", "sdpa", "--compile"))}
    settings = sorted({(t, b) for t in (1, cores) for b in (1, cores)})
    rate = {name: {} for name in runs}
    print("| threads (intra-op x BLAS) | " + " | ".join(f"{n} tok/s" for n in runs) + " |")
    print("|---" * (len(runs) + 1) + "|")
    for k in settings:
        got = {name: [] for name in runs}
        for _ in range(a.repeats):  # interleaved: all see the same machine state
            for name, fn in runs.items():
                try:
                    got[name].append(fn(*k))
                except subprocess.CalledProcessError as e:
                    print(f"# {name} at {k}: failed ({(e.stderr or '')[-300:]!r})", flush=True)
        for name in runs:
            rate[name][k] = statistics.median(got[name]) if got[name] else float("nan")
        print(f"| {k[0]} x {k[1]} | " + " | ".join(f"{rate[n][k]:.0f}" for n in runs) + " |", flush=True)
    x = rate["xloco"]
    bx = max(x, key=x.get)
    print(f"\nbest xloco: {x[bx]:.0f} tok/s at {bx[0]} x {bx[1]}")
    for name in list(runs)[1:]:
        r = rate[name]
        ok = {k: v for k, v in r.items() if v == v}
        if not ok:
            print(f"{name}: no run finished")
            continue
        br = max(ok, key=ok.get)
        print(f"{name}: best {r[br]:.0f} tok/s at {br[0]} x {br[1]}; xloco / it: best against best "
              f"{x[bx] / r[br]:.2f}, at 1 x 1 {x[(1, 1)] / r[(1, 1)]:.2f} (goal >= 1.15)")


def sgemm_rates(bench, d, tokens):
    """FLOP/s of bench_matmul's products at width d and `tokens` rows, 1 intra-op x 1 OpenBLAS
    thread."""
    env = blas_env(dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"), CORE.get("name"))
    out = subprocess.run([bench, f"--benchmark_filter=/K:{d}/|/N:{d}/t:1", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True, env=env).stdout
    rows = []
    for b in json.loads(out)["benchmarks"]:
        parts = dict(p.split(":") for p in b["name"].split("/")[1:])
        M, K, N = int(parts["M"]), int(parts["K"]), int(parts["N"])
        if M != tokens or d not in (K, N):
            continue
        rows.append({"shape": f"{M}x{K}x{N}" + ("" if parts["t"] == "1" else " (B not transposed)"),
                     "flops": 2.0 * M * K * N, "rate": b["FLOP/s"]})
    return rows


def mfu(a):
    """Achieved model FLOP/s of xloco train at 1 x 1 threads against the sgemm rate at the same
    shapes. Model FLOPs per token: 6 x (matmul weights: 12 d^2 per layer + the tied head d x V)
    + 12 x layers x T x d (attention scores and mixing, forward and backward)."""
    models = [("tiny GPT (d128 L4 H4 T128, 0.84 M), batch 32", 128, 4, 4, 32, 40),
              ("25 M GPT (d512 L8 H8 T128), batch 8", 512, 8, 8, 8, 15)]
    T, V = 128, 256
    print("| model | tok/s (1 x 1) | model GFLOP/s | sgemm GFLOP/s at its shapes: best (FLOP-weighted, min) | MFU: vs best sgemm (vs FLOP-weighted) |")
    print("|---|---|---|---|---|")
    for label, d, L, H, batch, steps in models:
        extra = ("--set", f"model.d_model={d}", "--set", f"model.n_layer={L}", "--set", f"model.n_head={H}")
        rate = xloco_rate(a.xloco, steps, 1, 1, batch, extra)
        n_mm = L * 12 * d * d + d * V
        flops_per_token = 6 * n_mm + 12 * L * T * d
        achieved = rate * flops_per_token
        rows = sgemm_rates(a.mfu, d, batch * T)
        fwd = [r for r in rows if "not transposed" not in r["shape"]]
        # The rate of a step that did nothing but these products, each as often as the model does.
        peak = sum(r["flops"] for r in fwd) / sum(r["flops"] / r["rate"] for r in fwd)
        lo, hi = min(r["rate"] for r in rows), max(r["rate"] for r in rows)
        print(f"| {label} | {rate:.0f} | {achieved / 1e9:.2f} | {hi / 1e9:.2f} ({peak / 1e9:.2f}, {lo / 1e9:.2f}) | "
              f"{achieved / hi:.3f} ({achieved / peak:.3f}) |", flush=True)
        for r in rows:
            print(f"|  sgemm {r['shape']} | | | {r['rate'] / 1e9:.2f} | |")


def torchscript(a):
    cores = os.cpu_count()
    py = sys.executable if sys.executable.startswith("/usr/bin") else "/usr/bin/python3"
    with tempfile.TemporaryDirectory() as d:
        twin = os.path.join(d, "tiny_gpt.pt")
        subprocess.run([py, os.path.join(ROOT, "examples/tiny_gpt.py"), twin], check=True,
                       capture_output=True)
        print(f"# tiny GPT (d128 L4 H4 T128), batch {a.batch}, {a.steps} steps, {a.repeats} "
              f"repeats, {cores} cores: xloco's C++ model vs the same model scripted in Python")
        print("| threads (intra-op x OpenBLAS) | built-in tok/s (median) | TorchScript tok/s (median) | ratio |")
        print("|---|---|---|---|")
        for threads, blas in ((1, cores), (cores, 1)):
            bs, ts = [], []
            for _ in range(a.repeats):  # interleaved
                bs.append(xloco_rate(a.xloco, a.steps, threads, blas, a.batch))
                ts.append(xloco_rate(a.xloco, a.steps, threads, blas, a.batch,
                                     ("--set", "model.kind=torchscript", "--set", f"model.path={twin}")))
            b, t = statistics.median(bs), statistics.median(ts)
            print(f"| {threads} x {blas} | {b:.0f} | {t:.0f} | {t / b:.3f} |", flush=True)


if __name__ == "__main__":
    main()
