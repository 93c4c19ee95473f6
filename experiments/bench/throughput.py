#!/usr/bin/env python3
"""Inner-step throughput of `xloco train` (tiny GPT, 1 rank) against the PyTorch reference
(gpt_torch.py: same model, batch, optimizer and thread count), in one run, interleaved so that
both see the same machine state. Also sweeps LibTorch intra-op x OpenBLAS threads for xloco.

usage: throughput.py XLOCO_BIN [--steps N] [--repeats R]
       throughput.py XLOCO_BIN --torchscript   # the built-in tiny GPT against its TorchScript
                                               # twin (examples/tiny_gpt.py), both in xloco"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def xloco_rate(binary, steps, threads, blas, batch, extra=()):
    with tempfile.TemporaryDirectory() as d:
        cmd = [binary, "train", "--config", os.path.join(ROOT, "configs/kjv-tiny.json"),
               "--set", f"run.dir={d}", "--set", "run.name=bench", "--set", f"inner.steps={steps}",
               "--set", "inner.warmup_steps=5", "--set", "inner.log_every=5",
               "--set", "inner.eval_every=0", "--set", "inner.checkpoint_every=0",
               "--set", f"inner.batch_size={batch}",
               "--set", f"run.threads={threads}", "--set", f"run.blas_threads={blas}", *extra]
        subprocess.run(cmd, check=True, capture_output=True)
        rows = [json.loads(l) for l in open(os.path.join(d, "bench/metrics/provider-0.jsonl"))]
        rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]  # skip warm-up window
        return statistics.mean(rates)


def torch_rate(steps, threads, blas, batch):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable if sys.executable.startswith("/usr/bin") else "/usr/bin/python3",
                          os.path.join(HERE, "gpt_torch.py"), "--steps", str(steps), "--threads",
                          str(threads), "--batch", str(batch)],
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
    a = ap.parse_args()
    if a.torchscript:
        return torchscript(a)
    cores = os.cpu_count()
    print(f"# tiny GPT (d128 L4 H4 T128), batch {a.batch}, {a.steps} steps, {a.repeats} repeats, {cores} cores")
    print("| threads (intra-op x OpenBLAS) | xloco tok/s (median) | PyTorch tok/s (median) | ratio |")
    print("|---|---|---|---|")
    xl, pt = {}, {}
    for threads in sorted({1, cores}):
        for blas in sorted({1, cores}):
            xs, ts = [], []
            for _ in range(a.repeats):  # interleaved: both see the same machine state
                xs.append(xloco_rate(a.xloco, a.steps, threads, blas, a.batch))
                ts.append(torch_rate(a.steps, threads, blas, a.batch))
            xl[(threads, blas)], pt[(threads, blas)] = statistics.median(xs), statistics.median(ts)
            print(f"| {threads} x {blas} | {xl[(threads, blas)]:.0f} | {pt[(threads, blas)]:.0f} | "
                  f"{xl[(threads, blas)] / pt[(threads, blas)]:.2f} |", flush=True)
    bx, bp = max(xl, key=xl.get), max(pt, key=pt.get)
    print(f"\nbest xloco:   {xl[bx]:.0f} tok/s at {bx[0]} intra-op x {bx[1]} OpenBLAS threads")
    print(f"best PyTorch: {pt[bp]:.0f} tok/s at {bp[0]} intra-op x {bp[1]} OpenBLAS threads")
    print(f"ratio best xloco / best PyTorch = {xl[bx] / pt[bp]:.2f} (goal >= 1.15)")


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
