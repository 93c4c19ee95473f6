#!/usr/bin/env python3
"""ctest hf.transformers (issue 55): Hugging Face transformers loads `xloco export --format hf`.

`xloco prepare` and `xloco train` on a small text (SentencePiece tokens), `xloco eval
--logits-out`, `xloco export --format hf`; then, in the interpreter of the pinned PyTorch 2.x +
transformers environment (deploy/setup_torch2.sh, XLOCO_TORCH2_PYTHON), AutoModelForCausalLM's
logits equal xloco's to 1e-4 and AutoTokenizer round-trips the training text byte for byte
(tests/hf_transformers_check.py). Without that environment the test is reported skipped, with
the command that makes it."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(os.environ.get("XLOCO_SOURCE_DIR", Path(__file__).resolve().parents[2])) / "tests"))
from cli_checks import SRC, check, corpus_text, failures, xloco  # noqa: E402

py = os.environ.get("XLOCO_TORCH2_PYTHON", str(SRC / ".venv-torch2/bin/python"))
if not Path(py).exists() or subprocess.run([py, "-c", "import transformers, torch, sentencepiece"],
                                           capture_output=True).returncode != 0:
    print(f"skipped: no PyTorch 2.x + transformers environment at {py} "
          "(make it with `bash deploy/setup_torch2.sh`; `make setup` does)")
    sys.exit(77)

with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "a.txt").write_text(corpus_text(3, 2500), encoding="utf-8")
    rc, out = xloco("prepare", "--input", tmp / "corpus", "--out", tmp / "data", "--vocab-size", 400,
                    "--val-fraction", 0.2)
    check(rc == 0, "xloco prepare" + ("" if rc == 0 else f":\n{out[-800:]}"))
    sets = ["data.dataset=tokens", f"data.path={tmp / 'data'}", "model.d_model=64", "model.n_layer=2",
            "model.n_head=4", "model.seq_len=64", "inner.batch_size=8", "inner.steps=40",
            "inner.warmup_steps=5", "inner.eval_every=0", "inner.log_every=20", "run.name=hf",
            "run.threads=1"]
    rc, out = xloco("train", "--config", SRC / "configs/kjv-tiny.json",
                    *[a for s in sets for a in ("--set", s)], cwd=tmp)
    check(rc == 0, "xloco train" + ("" if rc == 0 else f":\n{out[-800:]}"))
    ckpt = tmp / "runs/hf/ckpt/step-0000040"
    rc, out = xloco("eval", "--checkpoint", ckpt, "--logits-out", tmp / "logits.safetensors")
    check(rc == 0, "xloco eval --logits-out" + ("" if rc == 0 else f":\n{out[-800:]}"))
    rc, out = xloco("export", "--checkpoint", ckpt, "--format", "hf", "--out", tmp / "hf")
    check(rc == 0, "xloco export --format hf" + ("" if rc == 0 else f":\n{out[-800:]}"))
    if not failures:
        res = subprocess.run([py, SRC / "tests/hf_transformers_check.py", tmp / "hf",
                              tmp / "logits.safetensors", tmp / "corpus" / "a.txt", "--tol", "1e-4", "--lines", "1000"],
                             capture_output=True, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                  "TOKENIZERS_PARALLELISM": "false"})
        print(res.stdout, res.stderr[-3000:])
        check(res.returncode == 0, "transformers: logits within 1e-4 of xloco's, the tokenizer "
              "round-trips the training text byte for byte")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
