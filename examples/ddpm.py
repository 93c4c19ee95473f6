#!/usr/bin/env python3
"""A small DDPM (Ho et al. 2020) for Fashion-MNIST as a TorchScript module for xloco: a U-Net of
about 1.1 M parameters with a sinusoidal timestep embedding, trained on the noise-prediction
loss; `sample(n)` draws images with DDIM (Song et al. 2021, eta = 0) in a few dozen steps.

    python3 examples/ddpm.py ddpm.pt
    xloco train --config configs/fmnist-ddpm.json                    # one cluster
    xloco local --config configs/fmnist-ddpm.json --set outer.providers=4 ...   # DiLoCo
    xloco sample --checkpoint runs/fmnist-ddpm/ckpt/step-... --out grid.png

The contract xloco trains (see examples/README.md):
    forward(batch) -> loss           batch: [b, 1, 28, 28] as xloco's fmnist data set gives it
                                     (normalised with the data set's mean 0.2860, std 0.3530);
                                     labels are not used, so forward takes no targets
    sample(n) -> [n, 1, 28, 28]      images in [0, 1]; xloco seeds torch's generator first
"""
import argparse
import math
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F



def timestep_embedding(t, dim: int):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float().unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat([torch.sin(args), torch.cos(args)], dim=1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(8, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(8, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(temb).unsqueeze(-1).unsqueeze(-1)
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    """28 -> 14 -> 7 and back, channels (40, 80, 120) by default, one residual block per level each way."""

    def __init__(self, ch: int = 40, tdim: int = 128):
        super().__init__()
        c1, c2, c3 = ch, 2 * ch, 3 * ch
        self.tdim = tdim
        self.time = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(1, c1, 3, padding=1)
        self.down1 = ResBlock(c1, c1, tdim)
        self.pool1 = nn.Conv2d(c1, c1, 3, stride=2, padding=1)    # 28 -> 14
        self.down2 = ResBlock(c1, c2, tdim)
        self.pool2 = nn.Conv2d(c2, c2, 3, stride=2, padding=1)    # 14 -> 7
        self.mid1 = ResBlock(c2, c3, tdim)
        self.mid2 = ResBlock(c3, c3, tdim)
        self.up2 = ResBlock(c3 + c2, c2, tdim)
        self.up1 = ResBlock(c2 + c1, c1, tdim)
        self.out_norm = nn.GroupNorm(8, c1)
        self.out = nn.Conv2d(c1, 1, 3, padding=1)

    def forward(self, x, t):
        temb = self.time(timestep_embedding(t, self.tdim))
        h1 = self.down1(self.inp(x), temb)                         # 28
        h2 = self.down2(self.pool1(h1), temb)                      # 14
        h = self.mid2(self.mid1(self.pool2(h2), temb), temb)       # 7
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")     # 14
        h = self.up2(torch.cat([h, h2], 1), temb)
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")     # 28
        h = self.up1(torch.cat([h, h1], 1), temb)
        return self.out(F.silu(self.out_norm(h)))


class Ddpm(nn.Module):
    def __init__(self, ch: int = 40, steps: int = 1000, sample_steps: int = 50):
        super().__init__()
        self.net = UNet(ch)
        self.steps = steps
        self.sample_steps = sample_steps
        betas = torch.linspace(1e-4, 0.02, steps)
        # A buffer, so it travels with the module; float32 buffers ride in xloco's θ (averaged
        # over providers each round), which leaves a constant unchanged.
        self.register_buffer("alpha_bar", torch.cumprod(1.0 - betas, 0))

    def forward(self, batch):
        x0 = (batch * 0.3530 + 0.2860) * 2.0 - 1.0  # xloco's normalisation (std, mean) -> [-1, 1]
        t = torch.randint(0, self.steps, (x0.size(0),), device=x0.device)
        noise = torch.randn_like(x0)
        ab = self.alpha_bar[t].view(-1, 1, 1, 1)
        xt = ab.sqrt() * x0 + (1.0 - ab).sqrt() * noise
        return F.mse_loss(self.net(xt, t), noise)

    @torch.jit.export
    def sample(self, n: int):
        x = torch.randn(n, 1, 28, 28, device=self.alpha_bar.device)
        stride = self.steps // self.sample_steps
        ts: List[int] = list(range(self.steps - 1, -1, -stride))
        for i, t in enumerate(ts):
            ab = self.alpha_bar[t]
            ab_prev = self.alpha_bar[ts[i + 1]] if i + 1 < len(ts) else torch.ones_like(ab)
            eps = self.net(x, torch.full((n,), t, dtype=torch.long, device=x.device))
            x0 = ((x - (1.0 - ab).sqrt() * eps) / ab.sqrt()).clamp(-1.0, 1.0)
            x = ab_prev.sqrt() * x0 + (1.0 - ab_prev).sqrt() * eps   # DDIM, eta = 0
        return ((x + 1.0) / 2.0).clamp(0.0, 1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="where to write the scripted module (.pt)")
    ap.add_argument("--channels", type=int, default=40, help="U-Net width at 28 x 28")
    ap.add_argument("--sample-steps", type=int, default=50, help="DDIM steps of sample(n)")
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    model = Ddpm(a.channels, sample_steps=a.sample_steps)
    torch.jit.script(model).save(a.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: DDPM U-Net, {n:,} parameters")


if __name__ == "__main__":
    main()
