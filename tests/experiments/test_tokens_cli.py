#!/usr/bin/env python3
"""ctest tokens.cli: bring-your-own-text end to end through the xloco binary.

`xloco prepare` on a folder of text; the token files read back by a plain-Python llm.c reader
equal SentencePiece's own `spm_encode` on the same text with the same tokenizer; `xloco train`
on them (the tokens data set); `xloco eval` in nats per byte with --logits-out; `xloco sample`
decodes words; `xloco export --format hf` loads into an independent GPT-2 (tests/hf_gpt2_reader.py)
whose logits match xloco's to 1e-4; bad shards, a missing data path and a tokenizer that
contradicts --vocab-size are refused with errors that name the file."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(os.environ.get("XLOCO_SOURCE_DIR", Path(__file__).resolve().parents[2])) / "tests"))
from cli_checks import SRC, check, corpus_text as text, failures, torch_python, xloco  # noqa: E402
from llmc_reader import spm_tokens, stream  # noqa: E402


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    src = tmp / "corpus"
    (src / "b").mkdir(parents=True)
    (src / "a.txt").write_text(text(1, 3000))
    (src / "b" / "c.txt").write_text(text(2, 1500))
    # What a real folder holds beside its text (Debian's fortunes: .dat indexes and symlinked
    # duplicates): none of it may be read.
    (src / "a.txt.dat").write_bytes(b"\x00\x00\x00\x02" + bytes(range(256)) * 4)
    (src / "ctl.bin").write_bytes(bytes(range(1, 32)) * 100)
    (src / "link.txt").symlink_to(src / "a.txt")
    (src / "b" / "copy.txt").write_bytes((src / "a.txt").read_bytes())
    (src / "empty.txt").write_bytes(b"")
    data = tmp / "data"
    rc, out = xloco("prepare", "--input", src, "--out", data, "--vocab-size", 500, "--val-fraction", 0.2)
    print(out[-2000:])
    check(rc == 0, "xloco prepare ran")
    if rc != 0:
        sys.exit(1)
    check("round trip byte-exact" in out and "MB/s" in out, "prepare reports the round trip and its rate")
    meta = json.loads((data / "meta.json").read_text())
    check(meta["vocab_size"] == 500 and len(meta["sources"]) == 2, "meta.json: vocabulary and both sources")
    check(sorted(Path(x["path"]).name for x in meta["sources"]) == ["a.txt", "c.txt"],
          "only the two text files were read")
    for name, why in [("a.txt.dat", "binary"), ("ctl.bin", "binary"),
                      ("link.txt", "a symlink"), ("copy.txt", "the same bytes as"), ("empty.txt", "empty")]:
        check(any(name in line and "skipped" in line and why in line for line in out.splitlines()),
              f"prepare says it skipped {name} ({why})")
    check("2 input files read, 5 skipped" in out, "the summary counts inputs, not outputs")
    rc, out = xloco("prepare", "--input", src / "a.txt.dat", "--out", tmp / "none")
    check(rc != 0 and "no text files" in out and not (tmp / "none").exists(),
          "a binary file alone is refused, nothing written")

    # The token stream, put back in order from the train and val files by meta.json's rule,
    # against SentencePiece's own encoder on the same files (tests/llmc_reader.py).
    tokens, n_train, n_val = stream(data)
    check(n_val > 0 and n_train > 3 * n_val, f"a validation split ({n_val} of {n_train + n_val} tokens)")
    expected = spm_tokens(data / "tokenizer.model", [src / "a.txt", src / "b" / "c.txt"])
    check(tokens == expected, f"the llm.c files hold exactly spm_encode's tokens ({len(tokens)} tokens)")

    # data.dataset kjv (the file's) with a folder of token files: it can only be tokens.
    rc, out = xloco("config", "--config", SRC / "configs/kjv-tiny.json", "--set", f"data.path={data}")
    check(rc == 0 and json.loads(out)["data"]["dataset"] == "tokens",
          "data.dataset inferred from a data.path of token files" + ("" if rc == 0 else f":\n{out[-400:]}"))
    rc, out = xloco("config", "--config", SRC / "configs/kjv-tiny.json", "--set", f"data.path={src}")
    check(rc == 0 and json.loads(out)["data"]["dataset"] == "kjv", "and not from a folder of text")

    # Train on it, evaluate in nats per byte, sample, export.
    sets = ["data.dataset=tokens", f"data.path={data}", "model.d_model=64", "model.n_layer=2",
            "model.n_head=4", "model.seq_len=64", "inner.batch_size=8", "inner.steps=60",
            "inner.warmup_steps=5", "inner.eval_every=0", "inner.log_every=20", "run.name=tok",
            "run.threads=1"]
    rc, out = xloco("train", "--config", SRC / "configs/kjv-tiny.json", *[a for s in sets for a in ("--set", s)], cwd=tmp)
    print(out[-1500:])
    check(rc == 0 and "vocabulary 500" in out, "xloco train on the tokens data set (vocabulary from meta.json)")
    ckpt = tmp / "runs/tok/ckpt/step-0000060"
    rc, out = xloco("eval", "--checkpoint", ckpt, "--logits-out", tmp / "logits.safetensors")
    print(out)
    check(rc == 0 and "nats per byte" in out, "xloco eval reports nats per byte")
    loss = float(out.split("eval loss ")[1].split()[0])
    npb = float(out.split("| ")[1].split()[0])
    bpt = float(out.split("(")[1].split()[0])
    check(abs(npb - loss / bpt) < 1e-3 and 1.5 < bpt < 6, f"nats per byte = loss / bytes per token ({npb} = {loss} / {bpt})")
    rc, out = xloco("sample", "--checkpoint", ckpt, "--prompt", "the LORD", "--tokens", 30, "--temperature", 0.3)
    print(f"rc {rc}: {out}")
    corpus_words = set((src / "a.txt").read_text().split())
    new = out[len("the LORD"):].split()
    check(rc == 0 and out.startswith("the LORD") and sum(w.strip(".,;:") in corpus_words for w in new) >= 3,
          f"xloco sample decodes words of the corpus through the run's tokenizer ({new})")
    hf = tmp / "hf"
    rc, out = xloco("export", "--checkpoint", ckpt, "--format", "hf", "--out", hf)
    print(f"rc {rc}: {out}")
    check(rc == 0 and (hf / "tokenizer.model").exists() and (hf / "config.json").exists(), "xloco export --format hf")
    py = torch_python()
    check(py is not None, "a python3 with torch (python3-torch) for the independent reader")
    if py:
        res = subprocess.run([py, SRC / "tests/hf_gpt2_reader.py", hf, tmp / "logits.safetensors", "--tol", "1e-4"],
                             capture_output=True, text=True)
        print(res.stdout, res.stderr[-2000:])
        check(res.returncode == 0, "an independent GPT-2 on the export matches xloco's logits to 1e-4")

    # Refusals that name the file.
    rc, out = xloco("train", "--config", SRC / "configs/kjv-tiny.json", "--set", "data.dataset=tokens",
                    "--set", f"data.path={tmp / 'nowhere'}", cwd=tmp)
    check(rc == 2 and str(tmp / "nowhere") in out and "does not exist" in out, f"a missing data path is named: {out.strip()[-200:]}")
    bad = tmp / "bad"
    shutil.copytree(data, bad)
    raw = bytearray((bad / meta["val"]["files"][0]).read_bytes())
    raw[0:4] = struct.pack("<i", 12345)
    (bad / meta["val"]["files"][0]).write_bytes(bytes(raw))
    rc, out = xloco(
        "train", "--config", SRC / "configs/kjv-tiny.json", *[a for s in sets[2:] + ["data.dataset=tokens", f"data.path={bad}"] for a in ("--set", s)], cwd=tmp)
    check(rc == 2 and "val_000000.bin: bad magic 12345 at byte offset 0" in out, f"a shard with a bad magic is named: {out.strip()[-200:]}")
    rc, out = xloco("prepare", "--input", src, "--out", tmp / "again", "--tokenizer", data / "tokenizer.model", "--vocab-size", 800)
    check(rc == 2 and "--vocab-size 800 does not match the tokenizer" in out and "tokenizer.model (500 pieces)" in out,
          f"a tokenizer that contradicts --vocab-size is refused: {out.strip()[-200:]}")

    # A tokenizer that cannot reproduce the bytes (SentencePiece's defaults: NFKC normalization and
    # a dummy prefix) is refused with the offset where decoding differs, and nothing is written.
    subprocess.run(["spm_train", f"--input={src / 'a.txt'}", f"--model_prefix={tmp / 'lossy'}",
                    "--vocab_size=400", "--model_type=bpe", "--minloglevel=2"], capture_output=True, check=True)
    rc, out = xloco("prepare", "--input", src, "--out", tmp / "lossy-data", "--tokenizer", tmp / "lossy.model")
    check(rc == 2 and "does not reproduce the text from byte offset" in out and "a.txt" in out
          and not (tmp / "lossy-data").exists(), f"a lossy tokenizer is refused: {out.strip()[-240:]}")

print(f"{len(failures)} failure(s)" if failures else "all checks passed")
sys.exit(1 if failures else 0)
