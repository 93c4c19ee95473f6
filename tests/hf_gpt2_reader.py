#!/usr/bin/env python3
"""An independent reader of a Hugging Face GPT-2 directory (what `xloco export --format hf`
writes): a plain safetensors parser and a GPT-2 forward pass written from the paper's and
transformers' conventions (Conv1D weights stored [in, out], y = x @ W + b; pre-LayerNorm blocks;
tied LM head), sharing no code with xloco. It needs only python3-torch (transformers is not in
Debian).

    hf_gpt2_reader.py HF_DIR LOGITS.safetensors [--tol 1e-4]

compares its logits on the tokens in LOGITS.safetensors (written by `xloco eval --logits-out`)
with xloco's, prints the largest difference and exits 1 when it exceeds --tol."""
import argparse
import json
import math
import struct
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "F64": torch.float64}


def read_safetensors(path):
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + begin:base + end]), dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out, header.get("__metadata__", {})


class Gpt2:
    def __init__(self, directory):
        directory = Path(directory)
        self.config = json.loads((directory / "config.json").read_text())
        weights, meta = read_safetensors(directory / "model.safetensors")
        assert meta.get("format") == "pt", "transformers needs format=pt in the metadata"
        # Both spellings transformers writes: "transformer.h.0…" and the hub's "h.0…".
        self.w = {k[len("transformer."):] if k.startswith("transformer.") else k: v.double()
                  for k, v in weights.items()}
        act = self.config.get("activation_function", "gelu_new")
        self.act = {"gelu": lambda x: F.gelu(x),
                    "gelu_new": lambda x: F.gelu(x, approximate="tanh")}[act]

    def ln(self, x, prefix):
        return F.layer_norm(x, x.shape[-1:], self.w[prefix + ".weight"], self.w[prefix + ".bias"],
                            self.config.get("layer_norm_epsilon", 1e-5))

    def conv1d(self, x, prefix):  # transformers' Conv1D: weight [in, out]
        return x @ self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def logits(self, tokens):
        c = self.config
        T = tokens.shape[-1]
        h = self.w["wte.weight"][tokens] + self.w["wpe.weight"][torch.arange(T)]
        n_head, d = c["n_head"], c["n_embd"]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for i in range(c["n_layer"]):
            p = f"h.{i}"
            a = self.conv1d(self.ln(h, p + ".ln_1"), p + ".attn.c_attn")
            q, k, v = a.split(d, dim=-1)
            split = lambda t: t.view(*t.shape[:-1], n_head, d // n_head).transpose(-3, -2)
            q, k, v = split(q), split(k), split(v)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(d // n_head)
            att = att.masked_fill(~causal, float("-inf")).softmax(-1)
            y = (att @ v).transpose(-3, -2).reshape(*h.shape)
            h = h + self.conv1d(y, p + ".attn.c_proj")
            m = self.act(self.conv1d(self.ln(h, p + ".ln_2"), p + ".mlp.c_fc"))
            h = h + self.conv1d(m, p + ".mlp.c_proj")
        h = self.ln(h, "ln_f")
        return h @ self.w["wte.weight"].T  # tied head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("logits")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    ref, _ = read_safetensors(a.logits)
    model = Gpt2(a.hf_dir)
    with torch.no_grad():
        mine = model.logits(ref["tokens"].long())
    diff = (mine - ref["logits"].double()).abs().max().item()
    print(f"{a.hf_dir}: independent GPT-2 logits vs xloco's on {ref['tokens'].numel()} tokens: "
          f"max |diff| {diff:.3g} (tolerance {a.tol:g})")
    sys.exit(0 if diff <= a.tol else 1)


if __name__ == "__main__":
    main()
