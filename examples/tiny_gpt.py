#!/usr/bin/env python3
"""The tiny GPT as a TorchScript module: a twin of xloco's built-in `gpt` model (same shapes,
same parameter names, same operations in the same order), written in Python and trained by
xloco with no Python on the providers.

    python3 examples/tiny_gpt.py tiny_gpt.pt                  # vocab 256, d 128, 4 layers
    xloco train --config configs/kjv-tiny.json \\
        --set model.kind=torchscript --set model.path=tiny_gpt.pt

The contract xloco trains (see examples/README.md):
    forward(inputs, targets) -> loss     inputs, targets: [batch, T] int64 token ids
    logits(inputs) -> [batch, T, vocab]   optional; `xloco sample` and `eval --logits-out` use it
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, hs).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))  # exact (erf) GELU


class Block(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, n_head)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = Mlp(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d: int, n_layer: int, n_head: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.h = nn.ModuleList([Block(d, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)


class TinyGpt(nn.Module):
    def __init__(self, vocab=256, seq_len=128, d=128, n_layer=4, n_head=4):
        super().__init__()
        self.transformer = Transformer(vocab, seq_len, d, n_layer, n_head)
        # nanoGPT's init, as xloco's: normal(0, 0.02), residual projections / sqrt(2 n_layer).
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    @torch.jit.export
    def logits(self, inputs):
        T = inputs.size(1)
        pos = torch.arange(T, dtype=torch.long, device=inputs.device)
        h = self.transformer.wte(inputs) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            h = block(h)
        h = self.transformer.ln_f(h)
        return F.linear(h, self.transformer.wte.weight)  # LM head tied to the embedding

    def forward(self, inputs, targets):
        lg = self.logits(inputs)
        return F.cross_entropy(lg.view(-1, lg.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="where to write the scripted module (.pt)")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    model = TinyGpt(a.vocab, a.seq_len, a.d_model, a.n_layer, a.n_head)
    torch.jit.script(model).save(a.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: tiny GPT, {n:,} parameters")


if __name__ == "__main__":
    main()
