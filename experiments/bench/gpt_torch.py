#!/usr/bin/env python3
"""PyTorch reference for the inner-step throughput benchmark (design §9): the same tiny GPT
(nanoGPT shape), batch, AdamW settings and thread count as `xloco train`, on KJV bytes.
Prints one JSON line: {"tokens_per_s": ..., "steps": ..., "threads": ...}."""
import argparse
import json
import math
import subprocess
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.h))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, d, layers, heads, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(256, d), nn.Embedding(seq, d)
        self.h = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0, 0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, x, y):
        h = self.wte(x) + self.wpe(torch.arange(x.shape[1]))
        for b in self.h:
            h = b(h, self.mask)
        logits = F.linear(self.ln_f(h), self.wte.weight)
        return F.cross_entropy(logits.view(-1, 256), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True).stdout
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    model = GPT(a.d_model, a.layers, a.heads, a.seq)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(0)

    def step():
        ix = torch.randint(len(data) - a.seq - 1, (a.batch,), generator=g)
        w = torch.stack([data[i:i + a.seq + 1] for i in ix.tolist()])
        loss = model(w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = time.perf_counter() - t0
    print(json.dumps({"tokens_per_s": a.steps * a.batch * a.seq / dt, "steps": a.steps,
                      "threads": a.threads, "final_loss": float(loss)}))


if __name__ == "__main__":
    main()
