#!/usr/bin/env python3
"""The runs of deploy/gpu_check.sh (issue 55), on the machine the pack was carried to.

Every run trains the same GPT on the same KJV bytes for the same steps and batch:
  xloco train bf16, xloco train fp32, xloco local K = 2 bf16 (both providers on this device),
  PyTorch eager bf16 and fp32 (experiments/bench/gpt_torch.py: the same model with SDPA
  attention and AdamW), and PyTorch torch.compile bf16 unless --quick.
Reported per run: tokens/s (steady state), MFU = model FLOP/s over the device's measured bf16
matmul rate, peak device memory (nvidia-smi, the whole device, context included; PyTorch's own
max_memory_allocated beside it), eval loss after the budget (xloco: its KJV validation blocks;
PyTorch: the text's last 10 %, so the two are close, not equal), wall time.
Writes OUT/gpu_check.json, OUT/gpu_check.md and OUT/logs/*.log."""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch


def matmul_rate(device, quick):
    """The device's bf16 matmul FLOP/s, measured: square products, best of several."""
    n = (8192 if not quick else 4096) if device == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    reps = 20 if device == "cuda" else 3
    best = 0.0
    for _ in range(3):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2.0 * n ** 3 * reps / (time.perf_counter() - t0))
    return best


class GpuMemory:
    """The device's peak used memory during a run (nvidia-smi every 0.2 s), over its idle use."""

    def __init__(self, device):
        self.on = device == "cuda" and subprocess.run(["which", "nvidia-smi"], capture_output=True).returncode == 0
        self.peak = None

    def used(self):
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                              "--id=0"], capture_output=True, text=True).stdout.strip()
        return int(out.splitlines()[0]) * 1024 * 1024 if out else 0

    def __enter__(self):
        if self.on:
            self.base, self.peak, self.stop = self.used(), 0, False
            self.thread = threading.Thread(target=self.poll, daemon=True)
            self.thread.start()
        return self

    def poll(self):
        while not self.stop:
            self.peak = max(self.peak, self.used() - self.base)
            time.sleep(0.2)

    def __exit__(self, *exc):
        if self.on:
            self.stop = True
            self.thread.join()


def run_logged(cmd, log, env=None):
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write(" ".join(map(str, cmd)) + "\n")
        f.flush()
        rc = subprocess.run(list(map(str, cmd)), stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    return rc, time.perf_counter() - t0


def jsonl(path):
    return [json.loads(l) for l in open(path) if l.strip()] if Path(path).exists() else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xloco", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="fewer steps, no torch.compile")
    a = ap.parse_args()
    out, root = Path(a.out), Path(a.root)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    dev = a.device
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: --device cuda but torch sees no GPU (--device cpu checks the script here)")
    if dev == "cuda":
        m = dict(d=768, L=12, H=12, T=512, batch=32, steps=60 if a.quick else 300, lr=6e-4, warmup=20)
    else:  # the script's own check on a CPU: the tiny GPT, few steps
        m = dict(d=128, L=4, H=4, T=128, batch=16, steps=30 if a.quick else 60, lr=2e-3, warmup=10)
    threads = os.cpu_count() if dev == "cuda" else 1
    # Model FLOPs per token (as experiments/bench/throughput.py): 6 x matmul weights (12 d^2 per
    # layer + the tied head d x 256) + 12 x layers x T x d (attention, forward and backward).
    flops_per_token = 6 * (m["L"] * 12 * m["d"] ** 2 + m["d"] * 256) + 12 * m["L"] * m["T"] * m["d"]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "CPU")
    report = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else f"{cpu}, {os.cpu_count()} cores",
              "torch": torch.__version__, "model": m, "flops_per_token": flops_per_token,
              "host": platform.node(), "cpus": os.cpu_count(), "runs": []}
    rate = matmul_rate(dev, a.quick)
    report["bf16_matmul_flops"] = rate
    print(f"gpu_check: {report['device']}, torch {torch.__version__}: bf16 matmul {rate / 1e12:.1f} TFLOP/s",
          flush=True)

    common = ["--set", f"data.path={a.text}", "--set", f"model.d_model={m['d']}",
              "--set", f"model.n_layer={m['L']}", "--set", f"model.n_head={m['H']}",
              "--set", f"model.seq_len={m['T']}", "--set", f"inner.batch_size={m['batch']}",
              "--set", f"inner.lr={m['lr']}", "--set", f"inner.min_lr={m['lr'] / 10}",
              "--set", f"inner.warmup_steps={m['warmup']}", "--set", "inner.eval_batches=16",
              "--set", "inner.log_every=10", "--set", f"run.device={dev}",
              "--set", f"run.threads={threads}", "--set", f"run.dir={out / 'runs'}"]

    def xloco_train(precision):
        name = f"train-{precision}"
        cmd = [a.xloco, "train", "--config", root / "configs/kjv-tiny.json", *common,
               "--set", f"run.name={name}", "--set", f"run.precision={precision}",
               "--set", f"inner.steps={m['steps']}", "--set", f"inner.eval_every={m['steps']}",
               "--set", f"inner.checkpoint_every={m['steps']}"]
        with GpuMemory(dev) as mem:
            rc, wall = run_logged(cmd, out / "logs" / f"xloco-{name}.log")
        rows = jsonl(out / "runs" / name / "metrics" / "provider-0.jsonl")
        rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]
        evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
        return {"run": f"xloco train {precision}", "rc": rc, "wall_s": wall,
                "tokens_per_s": statistics.median(rates) if rates else None,
                "eval_loss": evals[-1] if evals else None, "peak_device_bytes": mem.peak}

    def xloco_local(precision):
        name = f"local-{precision}"
        rounds, h = 4, max(5, m["steps"] // 4)
        cmd = [a.xloco, "local", "--config", root / "configs/kjv-small-gpu.json", "--providers", 2,
               *common, "--set", f"run.name={name}", "--set", f"run.precision={precision}",
               "--set", f"inner.steps={rounds * h}", "--set", f"outer.inner_steps={h}",
               "--set", "outer.eval_every=1", "--set", f"outer.checkpoint_every={rounds}",
               "--set", "outer.start_grace_s=120"]
        with GpuMemory(dev) as mem:
            rc, wall = run_logged(cmd, out / "logs" / f"xloco-{name}.log")
        rows = [r for r in jsonl(out / "runs" / name / "metrics" / "head.jsonl") if "round" in r]
        tokens = sum(r.get("tokens", 0) for r in rows)
        compute = sum(r.get("round_wall_s", 0) for r in rows)
        evals = [r["eval_loss"] for r in rows if r.get("eval_loss") is not None]
        return {"run": f"xloco local K=2 {precision}", "rc": rc, "wall_s": wall, "rounds": len(rows),
                "tokens_per_s": tokens / compute if compute else None,
                "eval_loss": evals[-1] if evals else None, "peak_device_bytes": mem.peak,
                "note": f"{rounds} rounds of H={h}, int8 both ways; tokens/s over the rounds' wall time, both providers"}

    def pytorch(precision, compile_=False):
        cmd = [sys.executable, root / "experiments/bench/gpt_torch.py", "--device", dev,
               "--dtype", precision, "--attention", "sdpa", "--text", a.text,
               "--d-model", m["d"], "--layers", m["L"], "--heads", m["H"], "--seq", m["T"],
               "--batch", m["batch"], "--steps", m["steps"], "--warmup", 5, "--lr", m["lr"],
               "--threads", threads, "--eval-batches", 16]
        if compile_:
            cmd.append("--compile")
        label = f"pytorch-{precision}" + ("-compile" if compile_ else "")
        with GpuMemory(dev) as mem:
            rc, wall = run_logged(cmd, out / "logs" / f"{label}.log")
        lines = [l for l in open(out / "logs" / f"{label}.log") if l.startswith("{")]
        res = json.loads(lines[-1]) if lines else {}
        return {"run": f"PyTorch {torch.__version__} {'torch.compile' if compile_ else 'eager'} {precision}",
                "rc": rc, "wall_s": wall, "tokens_per_s": res.get("tokens_per_s"),
                "eval_loss": res.get("eval_loss"), "peak_device_bytes": mem.peak,
                "torch_max_allocated_bytes": res.get("peak_memory_bytes")}

    plan = [lambda: xloco_train("bf16"), lambda: pytorch("bf16"), lambda: xloco_train("fp32"),
            lambda: pytorch("fp32"), lambda: xloco_local("bf16")]
    if not a.quick and dev == "cuda":
        plan.append(lambda: pytorch("bf16", compile_=True))
    for step in plan:
        r = step()
        if r.get("tokens_per_s"):
            r["mfu"] = r["tokens_per_s"] * flops_per_token / rate
        report["runs"].append(r)
        print(f"gpu_check: {r['run']}: rc {r['rc']}, {r.get('tokens_per_s') or 0:.0f} tok/s, "
              f"eval loss {r.get('eval_loss')}, {r['wall_s']:.0f} s", flush=True)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")

    lines = [f"# gpu_check: {report['device']} ({dev}), torch {torch.__version__}",
             f"model d{m['d']} L{m['L']} H{m['H']} T{m['T']}, batch {m['batch']}, {m['steps']} steps; "
             f"bf16 matmul measured {rate / 1e12:.1f} TFLOP/s; {flops_per_token / 1e9:.3f} GFLOP/token", "",
             "| run | rc | tokens/s | MFU (vs bf16 matmul) | peak device memory | eval loss | wall s |",
             "|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        mem = f"{r['peak_device_bytes'] / 2**30:.2f} GiB" if r.get("peak_device_bytes") else "n/a"
        if r.get("torch_max_allocated_bytes"):
            mem += f" (allocated {r['torch_max_allocated_bytes'] / 2**30:.2f} GiB)"
        tps = f"{r['tokens_per_s']:.0f}" if r.get("tokens_per_s") else "n/a"
        mfu = f"{r['mfu']:.3f}" if r.get("mfu") else "n/a"
        ev = f"{r['eval_loss']:.4f}" if r.get("eval_loss") is not None else "n/a"
        lines.append(f"| {r['run']} | {r['rc']} | {tps} | {mfu} | {mem} | {ev} | {r['wall_s']:.0f} |")
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(1 if any(r["rc"] != 0 for r in report["runs"]) else 0)


if __name__ == "__main__":
    main()
