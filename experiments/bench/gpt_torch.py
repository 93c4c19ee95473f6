#!/usr/bin/env python3
"""PyTorch reference for the inner-step throughput benchmark (design §9): the same tiny GPT
(nanoGPT shape), batch, AdamW settings and thread count as `xloco train`, on KJV bytes.
Prints one JSON line: {"tokens_per_s": ..., "steps": ..., "threads": ...}.

Runs under Debian's PyTorch 1.13 and PyPI's 2.x alike. On 2.x, --attention sdpa (nanoGPT's
choice there: F.scaled_dot_product_attention, flash attention on a GPU), --compile
(torch.compile of the model), --device cuda and --dtype bf16 (autocast of the forward, fp32
weights and AdamW state, as xloco's run.precision = bf16) make it the reference of the GPU check
(deploy/gpu_check.sh), which also reads its eval loss (--eval-batches, on the text's last 10 %)
and peak GPU memory. --text FILE reads the bytes from a file instead of `bible`."""
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

    sdpa = False

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.h))
            y = att.masked_fill(mask[:T, :T], float("-inf")).softmax(-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
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
        h = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for b in self.h:
            h = b(h, self.mask)
        logits = F.linear(self.ln_f(h), self.wte.weight)
        return F.cross_entropy(logits.view(-1, 256).float(), y.reshape(-1))


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
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--attention", choices=["manual", "sdpa"], default="manual")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--text", help="a file of text (default: the KJV from `bible`)")
    ap.add_argument("--eval-batches", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    if a.text:
        raw = open(a.text, "rb").read()
    else:
        raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True).stdout
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    split = len(data) * 9 // 10
    train, val = data[:split], data[split:]
    dev = torch.device(a.device)
    Block.sdpa = a.attention == "sdpa"
    model = GPT(a.d_model, a.layers, a.heads, a.seq).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    fwd = torch.compile(model) if a.compile else model
    g = torch.Generator().manual_seed(0)

    def batch(src):
        ix = torch.randint(len(src) - a.seq - 1, (a.batch,), generator=g)
        w = torch.stack([src[i:i + a.seq + 1] for i in ix.tolist()]).to(dev)
        return w[:, :-1], w[:, 1:]

    def forward(x, y):
        if a.dtype == "bf16":
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                return fwd(x, y)
        return fwd(x, y)

    def step():
        loss = forward(*batch(train))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    dt = time.perf_counter() - t0
    out = {"tokens_per_s": a.steps * a.batch * a.seq / dt, "steps": a.steps,
           "threads": a.threads, "final_loss": loss.item(), "torch": torch.__version__,
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "dtype": a.dtype, "attention": a.attention, "compile": a.compile,
           "parameters": sum(p.numel() for p in model.parameters())}
    if dev.type == "cuda":
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated(dev)
    if a.eval_batches:
        model.eval()
        with torch.no_grad():
            out["eval_loss"] = sum(float(forward(*batch(val))) for _ in range(a.eval_batches)) / a.eval_batches
    print(json.dumps(out))


if __name__ == "__main__":
    main()
