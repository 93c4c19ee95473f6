#!/usr/bin/env python3
"""Fills the {{PLACEHOLDERS}} of deploy/akash/head.yaml or provider.yaml from a keys folder and
the command line, and writes an SDL ready for `provider-services tx deployment create`.

  python3 deploy/akash/render.py head --keys keys --image IMAGE [--run NAME] -o head.sdl.yaml
  python3 deploy/akash/render.py provider --keys keys --name provider-0 [--shard 0] \\
      --head tcp://PROVIDER_HOST:FORWARDED_PORT --image IMAGE_CUDA [--gpus 8] -o p0.sdl.yaml

keys/ holds head.key, head.pub and one provider-N.key/.pub per provider (`xloco keygen
keys/NAME`); every provider-*.pub there is allow-listed on the head. A rendered SDL carries
secret keys: it is written with mode 0600, and it must not be committed.
"""
import argparse
import json
import os
import re
import secrets
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")


def read_key(path):
    try:
        text = path.read_text().strip()
    except OSError as e:
        sys.exit(f"render: cannot read {path}: {e.strerror} (make keys with `xloco keygen {path.with_suffix('')}`)")
    if len(text) != 40:
        sys.exit(f"render: {path} does not hold a 40-character Z85 key")
    return text


ENV_LINE = re.compile(r"^(\s*- )(XLOCO_[A-Z_]+=.*?)(\s+#.*)?$")


def render(template, values):
    missing = sorted({m for m in PLACEHOLDER.findall(template) if m not in values})
    if missing:
        sys.exit(f"render: no value for {', '.join(missing)}")
    out = []
    for line in template.splitlines():
        m = ENV_LINE.match(line)
        if m:
            # Z85 keys may hold ':' (YAML) and '$' (Kubernetes expands $(NAME) and turns $$ into
            # $ in env values): every env entry is one double-quoted scalar with '$' doubled.
            entry = PLACEHOLDER.sub(lambda p: str(values[p.group(1)]), m.group(2))
            line = m.group(1) + json.dumps(entry.replace("$", "$$")) + (m.group(3) or "")
        else:
            line = PLACEHOLDER.sub(lambda p: str(values[p.group(1)]), line)
        out.append(line)
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description="render an xloco Akash SDL")
    ap.add_argument("role", choices=["head", "provider"])
    ap.add_argument("--keys", required=True, type=Path, help="folder made with xloco keygen")
    ap.add_argument("--image", required=True, help="container image (see deploy/README.md)")
    ap.add_argument("--run", default="akash-run", help="run name (run.name)")
    ap.add_argument("--config", default="/opt/xloco/configs/kjv-small-gpu.json",
                    help="config path inside the image")
    ap.add_argument("--set", default="", help="more overrides, comma-separated KEY=VALUE")
    ap.add_argument("--advertise", default="", help="head: tcp://HOST:PORT providers use (optional)")
    ap.add_argument("--price", type=int, default=None, help="max price per block, in --denom")
    ap.add_argument("--denom", default="uakt", choices=["uakt", "uact"], help="pricing denom")
    ap.add_argument("--name", help="provider: its name (its key is KEYS/NAME.key)")
    ap.add_argument("--head", help="provider: tcp://HOST:PORT, the head's forwarded ZeroMQ port")
    ap.add_argument("--gpus", type=int, default=1, help="provider: GPUs (= ranks) per lease")
    ap.add_argument("--shard", type=int, default=-1,
                    help="provider: its data shard, 0..K-1 (default: -1, the head picks a free "
                         "one; pin it so that the run does not depend on who connects first)")
    ap.add_argument("--cpus", type=int, default=None, help="provider: CPU units (default 8 per GPU)")
    ap.add_argument("--memory", default=None, help="provider: memory (default 64Gi per GPU)")
    ap.add_argument("--shm", default="16Gi", help="provider: /dev/shm size")
    ap.add_argument("-o", "--output", type=Path, help="write here (mode 0600) instead of stdout")
    a = ap.parse_args()

    extra = "," + a.set if a.set else ""
    values = {"IMAGE": a.image, "RUN": a.run, "CONFIG": a.config, "SET": extra, "DENOM": a.denom}
    if a.role == "head":
        pubs = sorted(a.keys.glob("provider-*.pub"))
        if not pubs:
            sys.exit(f"render: no provider-*.pub in {a.keys}: make one key per provider first")
        token_file = a.keys / "http.token"
        if not token_file.exists():  # the status port is global: it needs a bearer token
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(16) + "\n")
            print(f"render: made {token_file}: xloco status --http-token $(cat {token_file})",
                  file=sys.stderr)
        values.update(HEAD_SECRET=read_key(a.keys / "head.key"), ADVERTISE=a.advertise,
                      HTTP_TOKEN=token_file.read_text().strip(),
                      ALLOW=",".join(f"{p.stem}={read_key(p)}" for p in pubs),
                      HEAD_PRICE=a.price or 10000)
    else:
        if not a.name or not a.head:
            sys.exit("render: a provider needs --name and --head tcp://HOST:PORT")
        if not re.fullmatch(r"tcp://[^:/]+:\d+", a.head):
            sys.exit(f"render: --head '{a.head}' is not tcp://HOST:PORT (the forwarded port from lease-status)")
        values.update(HEAD=a.head, HEAD_PUBLIC=read_key(a.keys / "head.pub"), NAME=a.name, SHARD=a.shard,
                      SECRET=read_key(a.keys / f"{a.name}.key"), GPUS=a.gpus,
                      CPUS=a.cpus or 8 * a.gpus, MEMORY=a.memory or f"{64 * a.gpus}Gi", SHM=a.shm,
                      PROVIDER_PRICE=a.price or 1000000)
    text = render((HERE / f"{a.role}.yaml").read_text(), values)
    if a.output:
        fd = os.open(a.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # also when the file already existed
        with os.fdopen(fd, "w") as f:
            f.write(text)
        print(f"render: wrote {a.output} (contains secret keys: do not commit it)", file=sys.stderr)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
