#!/usr/bin/env python3
"""A plain-Python reader of llm.c's token files (karpathy/llm.c dev/data/data_common.py: 256
int32 header with magic, version and count, then uint16 or uint32 tokens), sharing no code with
xloco, and SentencePiece's own `spm_encode` as the reference tokenization.

    llmc_reader.py DATA_DIR INPUT...

reads a directory `xloco prepare` wrote, puts its train and val blocks back in stream order
(meta.json's rule) and checks that they equal spm_encode's tokens of the inputs (each line's
UTF-8 through spm_encode, its newline and any byte that is not UTF-8 as byte pieces <0xNN>, the
eos token after each file). Exits 1 if not."""
import json
import math
import struct
import subprocess
import sys
from array import array
from pathlib import Path


def read_llmc(path):
    data = Path(path).read_bytes()
    magic, version, count = struct.unpack("<3i", data[:12])
    kind = {(20240520, 1): "H", (20240801, 7): "I"}[(magic, version)]
    tokens = array(kind)
    tokens.frombytes(data[1024:])
    assert len(tokens) == count, f"{path}: header says {count} tokens, body has {len(tokens)}"
    return tokens


def stream(data_dir):
    """Every token of a prepared directory, train and val blocks back in input order."""
    data_dir = Path(data_dir)
    meta = json.loads((data_dir / "meta.json").read_text())
    train = array("I")
    val = array("I")
    for f in meta["train"]["files"]:
        train.extend(iter(read_llmc(data_dir / f)))
    for f in meta["val"]["files"]:
        val.extend(iter(read_llmc(data_dir / f)))
    block, frac = meta["split_block_tokens"], meta["val_fraction"]
    out, ti, vi, j = array("I"), 0, 0, 0
    while ti < len(train) or vi < len(val):
        if math.floor((j + 1) * frac) > math.floor(j * frac):
            out.extend(val[vi:vi + block])
            vi += block
        else:
            out.extend(train[ti:ti + block])
            ti += block
        j += 1
    return out, len(train), len(val)


def parts(line):
    """A line cut into valid UTF-8 runs (str) and the bytes that are not UTF-8 (int), one by one."""
    out, at = [], 0
    while at < len(line):
        try:
            out.append(line[at:].decode("utf-8"))
            break
        except UnicodeDecodeError as e:
            if e.start:
                out.append(line[at:at + e.start].decode("utf-8"))
            out.append(line[at + e.start])
            at += e.start + 1
    return out


def spm_tokens(model, files):
    """spm_encode's ids of `files`, as xloco prepare lays them out: each line's valid UTF-8 runs
    through spm_encode, its other bytes and its newline as byte pieces <0xNN>, the eos token after
    each file."""
    vocab = subprocess.run(["spm_export_vocab", f"--model={model}"], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    pieces = [line.split("\t")[0] for line in vocab]
    byte_piece = {int(p[3:5], 16): i for i, p in enumerate(pieces) if len(p) == 6 and p.startswith("<0x")}
    eos = pieces.index("</s>")
    out = array("I")
    for f in files:
        text = Path(f).read_bytes()
        lines = text.split(b"\n")
        split = [parts(line) for line in lines]
        runs = [p for line in split for p in line if isinstance(p, str)]
        encoded = subprocess.run(["spm_encode", f"--model={model}", "--output_format=id"],
                                 input="\n".join(runs) + "\n", capture_output=True, text=True,
                                 check=True).stdout.split("\n")
        k = 0
        for i, line in enumerate(split):
            for p in line:
                if isinstance(p, str):
                    out.extend(int(t) for t in encoded[k].split())
                    k += 1
                else:
                    out.append(byte_piece[p])
            if i + 1 < len(split):
                out.append(byte_piece[10])
        out.append(eos)
    return out


def main():
    data_dir, inputs = sys.argv[1], sys.argv[2:]
    got, n_train, n_val = stream(data_dir)
    want = spm_tokens(Path(data_dir) / "tokenizer.model", inputs)
    same = got == want
    print(f"{data_dir}: {n_train} train + {n_val} val tokens read by a plain llm.c reader; "
          f"{'equal to' if same else 'DIFFERENT from'} spm_encode's {len(want)} tokens")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
