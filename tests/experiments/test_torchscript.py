#!/usr/bin/env python3
"""ctest torchscript.cli: models written in Python, scripted, trained by the xloco binary.

- The TorchScript twin of the tiny GPT (examples/tiny_gpt.py) and the built-in gpt, started from
  the same weights (--init), give the same loss at every one of 20 steps over 2 ranks (1e-5).
- A K=2 DiLoCo run of the twin ends with the same θ_pub hash on the head and both providers, and
  its checkpoint loads into the Python module with load_state_dict(strict=True).
- A module with batch norm: its running statistics ride in θ (they change, reach the head's
  checkpoint) and num_batches_tracked is kept; the checkpoint loads strictly into Python.
- The DDPM of examples/ddpm.py (narrow) trains on Fashion-MNIST; `xloco sample` writes a PNG
  grid of its samples and scores them with a Fashion-MNIST cnn; `xloco eval --batch-size`.
- Modules that break the contract (no forward, wrong signature, float64 parameters, a loss that
  is not a scalar, a file that is not TorchScript, a graph that reads files with
  torch.from_file, a vocabulary smaller than the data's) are refused with errors naming the
  problem; a forward that never reads its targets is warned; the log names the vocabulary.
Needs python3-torch (deploy/setup.sh installs it)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(os.environ.get("XLOCO_SOURCE_DIR", Path(__file__).resolve().parents[2])) / "tests"))
from cli_checks import SRC, XLOCO, check, failures, torch_python, xloco  # noqa: E402
import read_safetensors  # noqa: E402


# Runs under the torch interpreter: scripts the modules the test needs into OUT.
MAKER = r'''
import json, math, struct, sys
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, sys.argv[2] + "/examples")
import tiny_gpt, ddpm
out = sys.argv[1]

def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().numpy().astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

torch.manual_seed(7)  # not xloco's seed: the runs must take the weights from --init
twin = tiny_gpt.TinyGpt(256, 128, 128, 4, 4)
torch.jit.script(twin).save(out + "/twin.pt")
write_safetensors(out + "/init.safetensors", twin.state_dict())
torch.jit.script(tiny_gpt.TinyGpt(256, 32, 32, 1, 2)).save(out + "/twin_small.pt")
torch.jit.script(ddpm.Ddpm(8, sample_steps=4)).save(out + "/ddpm.pt")

class BnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, stride=2)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 13 * 13, 10)
    def forward(self, inputs, targets):
        h = F.relu(self.bn(self.conv(inputs)))
        return F.cross_entropy(self.fc(h.flatten(1)), targets)
torch.jit.script(BnNet()).save(out + "/bn.pt")

class NoForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))
    @torch.jit.export
    def loss(self, x: torch.Tensor):
        return self.w.sum()
torch.jit.script(NoForward()).save(out + "/no_forward.pt")

class IntArg(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))
    def forward(self, x: int):
        return self.w.sum() * x
torch.jit.script(IntArg()).save(out + "/int_arg.pt")

class ThreeArgs(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))
    def forward(self, a, b, c):
        return self.w.sum()
torch.jit.script(ThreeArgs()).save(out + "/three_args.pt")

class NotScalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(256))
    def forward(self, inputs, targets):
        return self.w[inputs]
torch.jit.script(NotScalar()).save(out + "/not_scalar.pt")

torch.jit.script(tiny_gpt.TinyGpt(256, 32, 32, 1, 2).double()).save(out + "/double.pt")
# A vocabulary smaller than KJV's 256 bytes: refused before training (issue 53).
torch.jit.script(tiny_gpt.TinyGpt(128, 32, 32, 1, 2)).save(out + "/small_vocab.pt")

class IgnoresTargets(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(256))
    def forward(self, inputs, targets):
        return (self.w[inputs] ** 2).mean()
torch.jit.script(IgnoresTargets()).save(out + "/ignores_targets.pt")

# A model file is code: this one reads the head's secret key into a buffer that would leave in
# theta_pub (issue 52). The loader must refuse it before any call.
class ReadsKey(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))
    @torch.jit.export
    def steal(self) -> torch.Tensor:
        return torch.from_file("keys/head.key", False, 40, dtype=torch.uint8)
    def forward(self, inputs, targets):
        return self.w.sum()
torch.jit.script(ReadsKey()).save(out + "/reads_key.pt")
'''

# Loads an xloco checkpoint into the Python module (strict) and prints what it found.
LOADER = r'''
import json, struct, sys
import numpy as np
import torch
module = torch.jit.load(sys.argv[1])
raw = open(sys.argv[2], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
header.pop("__metadata__", None)
state = {}
for name, info in header.items():
    b, e = info["data_offsets"]
    np_type = {"F32": np.float32, "I64": np.int64}[info["dtype"]]
    state[name] = torch.from_numpy(np.frombuffer(raw[8 + n + b:8 + n + e], dtype=np_type).copy().reshape(info["shape"]))
module.load_state_dict(state, strict=True)
print(json.dumps({"loaded": len(state)}))
'''


def metric_losses(run_dir, name="provider-0"):
    rows = [json.loads(l) for l in (run_dir / "metrics" / f"{name}.jsonl").read_text().splitlines() if l.strip()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r and "step" in r]


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def main():
    py = torch_python()
    if py is None:
        print("SKIPPED: no Python with torch (Debian's python3-torch)")
        return 77
    tmp = Path(tempfile.mkdtemp(prefix="xloco-ts-"))
    try:
        return run(py, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(py, tmp):
    maker = tmp / "maker.py"
    maker.write_text(MAKER)
    res = subprocess.run([py, str(maker), str(tmp), str(SRC)], capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout + res.stderr)
        return 1
    kjv = SRC / "configs/kjv-tiny.json"
    fm = SRC / "configs/fmnist-cnn.json"
    common = ["--set", f"run.dir={tmp}/runs", "--set", "inner.eval_every=0", "--set", "inner.eval_batches=1"]

    # 1. The twin equals the built-in gpt, step by step, over 2 ranks.
    base = ["train", "--config", kjv, "--nproc", "2", "--init", tmp / "init.safetensors", *common,
            "--set", "inner.steps=20", "--set", "inner.warmup_steps=5", "--set", "inner.batch_size=8",
            "--set", "inner.log_every=1"]
    rc1, out1 = xloco(*base, "--set", "run.name=builtin")
    rc2, out2 = xloco(*base, "--set", "run.name=twin", "--set", "model.kind=torchscript",
                      "--set", f"model.path={tmp}/twin.pt")
    check(rc1 == 0 and rc2 == 0, "built-in and TorchScript tiny GPT train with 2 ranks" + ("" if rc1 == 0 and rc2 == 0 else f":\n{out1[-800:]}\n{out2[-800:]}"))
    if rc1 == 0 and rc2 == 0:
        a, b = metric_losses(tmp / "runs/builtin"), metric_losses(tmp / "runs/twin")
        worst = max((abs(x[1] - y[1]) for x, y in zip(a, b)), default=float("inf"))
        check(len(a) == 20 and [s for s, _ in a] == [s for s, _ in b] and worst <= 1e-5,
              f"twin loss sequence equals the built-in's over {len(a)} steps (max diff {worst:.2e})")
        check(a[-1][1] < a[0][1] - 0.5, f"and the loss falls ({a[0][1]:.3f} -> {a[-1][1]:.3f})")
        check("initial weights from" in out2, "--init named in the log")
        check("torchscript (vocabulary 256) |" in out2, "the module's vocabulary in the log")

    # 2. K=2 DiLoCo of the twin: θ_pub agrees; the checkpoint loads into Python.
    small = ["--set", "model.kind=torchscript", "--set", f"model.path={tmp}/twin_small.pt",
             "--set", "model.d_model=32", "--set", "model.n_layer=1", "--set", "model.n_head=2",
             "--set", "model.seq_len=32", "--set", "inner.batch_size=8", "--set", "inner.warmup_steps=2"]
    rc, out = xloco("local", "--config", SRC / "configs/kjv-tiny-4p.json", *common, *small,
                    "--set", "run.name=k2", "--set", "outer.providers=2", "--set", "outer.min_providers=2",
                    "--set", "inner.steps=20", "--set", "outer.inner_steps=10")
    check(rc == 0, "K=2 xloco local of the TorchScript twin" + ("" if rc == 0 else f":\n{out[-1500:]}"))
    if rc == 0:
        run_dir = tmp / "runs/k2"
        head = json.loads((run_dir / "summary.json").read_text())["theta_pub_hash"]
        hashes = []
        for p in ("provider-0", "provider-1"):
            rows = [json.loads(l) for l in (run_dir / "providers" / p / "metrics" / f"provider-{p}.jsonl").read_text().splitlines() if l.strip()]
            hashes += [r["theta_pub_hash"] for r in rows if r.get("final")]
        check(len(hashes) == 2 and all(h == head for h in hashes), f"θ_pub hash {head} on the head and both providers ({hashes})")
        ckpts = sorted((run_dir / "ckpt").glob("round-*"))
        loader = tmp / "loader.py"
        loader.write_text(LOADER)
        res = subprocess.run([py, str(loader), str(tmp / "twin_small.pt"), str(ckpts[-1] / "model.safetensors"), str(SRC)],
                             capture_output=True, text=True)
        check(res.returncode == 0 and '"loaded"' in res.stdout, "head checkpoint loads with load_state_dict(strict=True)" + ("" if res.returncode == 0 else ":\n" + res.stderr[-800:]))
        res = subprocess.run([XLOCO, "sample", "--checkpoint", str(ckpts[-1]), "--tokens", "20", "--prompt", "And"],
                             capture_output=True, text=True)  # the text on stdout, logs on stderr
        check(res.returncode == 0 and res.stdout.startswith("And") and len(res.stdout) > 10,
              "xloco sample continues text through the module's logits" + ("" if res.returncode == 0 else ":\n" + res.stderr[-600:]))

    # 3. Batch norm: float buffers in θ (averaged by the head), int64 buffers per rank.
    rc, out = xloco("local", "--config", SRC / "configs/kjv-tiny-4p.json", *common,
                    "--set", "data.dataset=fmnist", "--set", "model.kind=torchscript",
                    "--set", f"model.path={tmp}/bn.pt", "--set", "inner.batch_size=16",
                    "--set", "inner.warmup_steps=2", "--set", "run.name=bn", "--set", "outer.providers=2",
                    "--set", "outer.min_providers=2", "--set", "inner.steps=20", "--set", "outer.inner_steps=10")
    check(rc == 0, "K=2 run of a batch-norm module" + ("" if rc == 0 else f":\n{out[-1500:]}"))
    if rc == 0:
        ck = sorted((tmp / "runs/bn/ckpt").glob("round-*"))[-1] / "model.safetensors"
        t = read_safetensors.read(str(ck))["tensors"]
        mean = t["bn.running_mean"]["first"]
        check(any(abs(v) > 1e-4 for v in mean), f"head checkpoint holds trained running_mean {[round(v, 4) for v in mean]}...")
        check(t["bn.num_batches_tracked"]["dtype"] == "I64", "num_batches_tracked kept as int64")
        res = subprocess.run([py, str(tmp / "loader.py"), str(tmp / "bn.pt"), str(ck), str(SRC)], capture_output=True, text=True)
        check(res.returncode == 0, "batch-norm checkpoint loads strictly into the Python module" + ("" if res.returncode == 0 else ":\n" + res.stderr[-800:]))

    # 4. The DDPM: train, eval on fixed noise, sample a PNG grid, score it with a cnn.
    rc, out = xloco("train", "--config", SRC / "configs/fmnist-ddpm.json", *common,
                    "--set", f"model.path={tmp}/ddpm.pt", "--set", "run.name=ddpm", "--set", "inner.steps=4",
                    "--set", "inner.warmup_steps=1", "--set", "inner.batch_size=8")
    check(rc == 0, "xloco train of the DDPM" + ("" if rc == 0 else f":\n{out[-1500:]}"))
    rc2, out2 = xloco("train", "--config", fm, *common, "--set", "run.name=cnn", "--set", "inner.steps=3",
                      "--set", "inner.warmup_steps=1", "--set", "inner.batch_size=8")
    if rc == 0 and rc2 == 0:
        ck = sorted((tmp / "runs/ddpm/ckpt").glob("step-*"))[-1]
        cnn = sorted((tmp / "runs/cnn/ckpt").glob("step-*"))[-1]
        e1 = xloco("eval", "--checkpoint", ck, "--batch-size", "16", "--batches", "2")
        e2 = xloco("eval", "--checkpoint", ck, "--batch-size", "16", "--batches", "2")
        check(e1[0] == 0 and "over 32 images" in e1[1] and e1[1].split("(step")[0] == e2[1].split("(step")[0],
              f"xloco eval --batch-size scores the same held-out noise twice: {e1[1].strip()[:80]}")
        grid, score = tmp / "grid.png", tmp / "score.json"
        rc, out = xloco("sample", "--checkpoint", ck, "--images", "5", "--grid-images", "4", "--out", grid,
                        "--classifier", cnn, "--score-out", score)
        check(rc == 0, "xloco sample of the DDPM" + ("" if rc == 0 else f":\n{out[-800:]}"))
        if rc == 0:
            check(png_size(grid) == (2 * 30 + 2, 2 * 30 + 2), f"a 2 x 2 grid of 28 x 28 samples: {png_size(grid)}")
            s = json.loads(score.read_text())
            check(sum(s["class_histogram"]) == 5 and 1.0 <= s["inception_score"] <= 10.0,
                  f"score of 5 samples: histogram {s['class_histogram']}, IS {s['inception_score']:.3f}")
        rc, out = xloco("sample", "--checkpoint", ck, "--images", "2", "--classifier", ck)
        check(rc != 0 and "not the Fashion-MNIST cnn" in out, "a classifier that is not the cnn is refused")
    else:
        check(False, "cnn classifier trains:\n" + out2[-800:])

    # 5. Modules that break the contract.
    bad = tmp / "bad.pt"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    cases = [("no_forward.pt", "has no forward method"), ("int_arg.pt", "forward is `forward(__torch__"),
             ("three_args.pt", "forward is `forward("), ("double.pt", "is Double; xloco trains float32"),
             ("bad.pt", "torch.jit.load cannot read it"),
             ("reads_key.pt", "uses aten::from_file, which reads or writes files")]
    for name, want in cases:
        rc, out = xloco("train", "--config", kjv, *common, "--set", "run.name=bad", "--set", "inner.steps=2",
                        "--set", "inner.warmup_steps=1", "--set", "model.kind=torchscript",
                        "--set", f"model.path={tmp}/{name}")
        check(rc != 0 and want in out and name in out, f"{name} refused: {want!r}" + ("" if rc != 0 and want in out else f"\n{out[-600:]}"))
    rc, out = xloco("train", "--config", kjv, *common, "--set", "run.name=bad", "--set", "inner.steps=2",
                    "--set", "inner.warmup_steps=1", "--set", "inner.batch_size=4", "--set", "model.kind=torchscript",
                    "--set", f"model.path={tmp}/not_scalar.pt")
    check(rc != 0 and "xloco needs the scalar loss" in out, "a forward that returns no scalar is refused at the first step")
    # The same model error under `xloco local`: every provider fails, the head is stopped; the
    # ending names the providers' failure and their exit code, not an interruption to resume.
    rc, out = xloco("local", "--config", SRC / "configs/kjv-tiny-4p.json", *common, *small,
                    "--set", f"model.path={tmp}/not_scalar.pt", "--set", "run.name=bad-local",
                    "--set", "outer.providers=2", "--set", "outer.min_providers=2",
                    "--set", "inner.steps=4", "--set", "outer.inner_steps=2")
    ok = (rc not in (0, 130) and f"every provider failed: provider-0 (code {rc}), provider-1 (code {rc})" in out
          and "was interrupted; resume with" not in out)
    check(ok, f"a model error under xloco local ends with the providers' failure and their code ({rc})" +
          ("" if ok else f"\n{out[-1200:]}"))
    rc, out = xloco("train", "--config", kjv, *common, "--set", "run.name=bad", "--set", "inner.steps=2",
                    "--set", "inner.warmup_steps=1", "--set", "inner.batch_size=4", "--set", "model.kind=torchscript",
                    "--set", f"model.path={tmp}/small_vocab.pt")
    check(rc not in (0, 130) and "its logits have 128 entries but the data's vocabulary is 256" in out
          and "Traceback" not in out and len(out.splitlines()) < 40,
          "a module whose vocabulary is smaller than the data's is refused before training, in a line" +
          ("" if rc not in (0, 130) else f" (rc {rc})\n{out[-800:]}"))
    rc, out = xloco("train", "--config", kjv, *common, "--set", "run.name=ign", "--set", "inner.steps=2",
                    "--set", "inner.warmup_steps=1", "--set", "inner.batch_size=4", "--set", "model.kind=torchscript",
                    "--set", f"model.path={tmp}/ignores_targets.pt")
    check(rc == 0 and "never reads targets" in out, "a forward that never reads its targets is warned" +
          ("" if rc == 0 else f" (rc {rc})\n{out[-800:]}"))
    rc, out = xloco("train", "--config", kjv, *common, "--set", "model.kind=torchscript")
    check(rc != 0 and "needs model.path" in out, "model.kind=torchscript without model.path is a config error")
    rc, out = xloco("train", "--config", kjv, *common, "--set", "model.kind=torchscript", "--set", f"model.path={tmp}/nope.pt")
    check(rc != 0 and "nope.pt: cannot open it" in out, "a missing module file is named")

    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
