#!/usr/bin/env python3
"""ctest deploy.akash_sdl: renders deploy/akash/head.yaml and provider.yaml with throwaway keys
and validates them with Akash's own SDL input schema (tests/deploy/akash/sdl-input.schema.yaml,
the draft-07 schema that Akash's Go SDL parser embeds; source and licence in its header), then
checks the cross-references that parser makes beyond the schema and what an xloco run needs.

The validator is python3-jsonschema (Debian, installed by deploy/setup.sh). Skipped (exit 77),
with the reason, only when neither this interpreter nor /usr/bin/python3 can import it.
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = Path(os.environ.get("XLOCO_SOURCE_DIR", HERE.parent.parent))
XLOCO = os.environ.get("XLOCO_BIN", str(SRC / "build/src/cli/xloco"))
HEAD_ADDR = "tcp://provider.example.org:31234"


def import_validator():
    try:
        import jsonschema  # noqa: F401
        import yaml  # noqa: F401
        return True
    except ImportError:
        return False


if not import_validator():
    system = "/usr/bin/python3"
    if os.environ.get("XLOCO_SDL_REEXEC") != "1" and os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system):
        os.environ["XLOCO_SDL_REEXEC"] = "1"
        os.execv(system, [system, __file__, *sys.argv[1:]])
    print("SKIPPED: python3-jsonschema / python3-yaml are not installed (apt-get install python3-jsonschema python3-yaml)")
    sys.exit(77)

import jsonschema  # noqa: E402
import yaml  # noqa: E402

SCHEMA = yaml.safe_load((HERE / "akash" / "sdl-input.schema.yaml").read_text())
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def schema_errors(doc):
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in VALIDATOR.iter_errors(doc))


def cross_references(doc):
    """What Akash's parser checks beyond the schema: every deployment names a declared service,
    compute profile and placement, the placement prices that service, every params.storage entry
    names a storage volume of the service's profile, and a persistent volume is mounted."""
    errs = []
    services = doc.get("services", {})
    compute = doc.get("profiles", {}).get("compute", {})
    placement = doc.get("profiles", {}).get("placement", {})
    for svc, groups in doc.get("deployment", {}).items():
        if svc not in services:
            errs.append(f"deployment {svc}: no such service")
        for group, d in groups.items():
            if group not in placement:
                errs.append(f"deployment {svc}.{group}: no such placement")
            elif svc not in placement[group].get("pricing", {}):
                errs.append(f"placement {group}: no price for {svc}")
            prof = compute.get(d.get("profile"))
            if prof is None:
                errs.append(f"deployment {svc}.{group}: no compute profile {d.get('profile')}")
                continue
            storage = prof["resources"]["storage"]
            storage = storage if isinstance(storage, list) else [storage]
            names = {s.get("name", "default"): s for s in storage}
            mounts = services.get(svc, {}).get("params", {}).get("storage", {}) or {}
            for name in mounts:
                if name not in names:
                    errs.append(f"service {svc}: params.storage.{name} names no volume of profile {d['profile']}")
            for name, vol in names.items():
                if (vol.get("attributes") or {}).get("persistent") in (True, "true") and name not in mounts:
                    errs.append(f"profile {d['profile']}: persistent volume {name} is not mounted")
    return errs


def env(svc):
    out = {}
    for e in svc.get("env") or []:
        k, _, v = e.partition("=")
        out[k] = v
    return out


def only_service(doc):
    (name, svc), = doc["services"].items()
    return name, svc


def check_head(doc):
    name, svc = only_service(doc)
    check(svc["command"] + svc["args"] == ["xloco", "head"], "head: runs `xloco head`")
    res = doc["profiles"]["compute"][name]["resources"]
    check("gpu" not in res or int(res["gpu"].get("units", 0)) == 0, "head: needs no GPU")
    ports = {e["port"]: e for e in svc["expose"]}
    for port in (7700, 8080):
        e = ports.get(port)
        if check(e is not None, f"head: port {port} exposed"):
            check(any(t.get("global") is True for t in e.get("to", [])), f"head: port {port} is global")
            check(e.get("proto", "tcp").upper() == "TCP", f"head: port {port} is TCP")
    vals = env(svc)
    for k in ("XLOCO_CONFIG", "XLOCO_SET", "XLOCO_BIND", "XLOCO_HTTP", "XLOCO_HTTP_TOKEN", "XLOCO_KEY", "XLOCO_ALLOW"):
        check(k in vals, f"head: env {k}")
    check(vals.get("XLOCO_BIND") == "tcp://0.0.0.0:7700", "head: binds 0.0.0.0:7700")
    # Z85 keys with '$' arrive doubled for Kubernetes, which turns '$$' back into '$'.
    allow = vals.get("XLOCO_ALLOW", "").replace("$$", "$")
    check(re.fullmatch(r"provider-0=.{40},provider-1=.{40}", allow), "head: XLOCO_ALLOW lists both providers' keys")
    check(svc["params"]["storage"]["runs"]["mount"] == "/var/lib/xloco", "head: runs volume at /var/lib/xloco")
    runs = [s for s in res["storage"] if s.get("name") == "runs"]
    check(runs and runs[0]["attributes"].get("persistent") is True, "head: runs volume is persistent")


def check_provider(doc):
    name, svc = only_service(doc)
    check(svc["command"] + svc["args"] == ["xloco", "worker"], "provider: runs `xloco worker`")
    res = doc["profiles"]["compute"][name]["resources"]
    check(int(res["gpu"]["units"]) == 8, "provider: 8 GPUs")
    models = sorted((g["model"], g["ram"]) for g in res["gpu"]["attributes"]["vendor"]["nvidia"])
    check(models == [("a100", "80Gi"), ("h100", "80Gi")], f"provider: h100/a100 80Gi GPUs (got {models})")
    vols = {s.get("name", "default"): s for s in res["storage"]}
    check(vols.get("shm", {}).get("attributes", {}).get("class") == "ram", "provider: shm is RAM-backed")
    check(svc["params"]["storage"]["shm"]["mount"] == "/dev/shm", "provider: shm at /dev/shm")
    check(vols.get("runs", {}).get("attributes", {}).get("persistent") is True, "provider: runs volume is persistent")
    check(all(t.get("global") is not True for e in svc.get("expose", []) for t in e.get("to", [])),
          "provider: exposes nothing globally")
    vals = env(svc)
    for k in ("XLOCO_CONFIG", "XLOCO_SET", "XLOCO_HEAD", "XLOCO_HEAD_PUB", "XLOCO_NAME", "XLOCO_SHARD", "XLOCO_KEY", "XLOCO_NPROC"):
        check(k in vals, f"provider: env {k}")
    check(vals.get("XLOCO_HEAD") == HEAD_ADDR, "provider: XLOCO_HEAD is the head's forwarded address")
    check(vals.get("XLOCO_NPROC") == "8", "provider: one rank per GPU")
    check(vals.get("XLOCO_SHARD") == "0", "provider: the shard is pinned")
    check("run.device=auto" in vals.get("XLOCO_SET", ""), "provider: run.device=auto")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for n in ("head", "provider-0", "provider-1"):
            subprocess.run([XLOCO, "keygen", str(tmp / "keys" / n)], check=True, stdout=subprocess.DEVNULL)
        render = [sys.executable, str(SRC / "deploy/akash/render.py")]
        subprocess.run(render + ["head", "--keys", str(tmp / "keys"), "--image", "example/xloco:cpu",
                                 "-o", str(tmp / "head.sdl.yaml")], check=True)
        subprocess.run(render + ["provider", "--keys", str(tmp / "keys"), "--name", "provider-0", "--shard", "0",
                                 "--gpus", "8", "--head", HEAD_ADDR, "--image", "example/xloco:cuda",
                                 "-o", str(tmp / "provider-0.sdl.yaml")], check=True)
        # Every {{NAME}} of the templates must be gone. Not a bare '{{': the Z85 alphabet has
        # braces, so a random key holds '{{' in about one render in a hundred.
        names = set()
        for t in ("head.yaml", "provider.yaml"):
            names |= set(re.findall(r"\{\{[A-Z_]+\}\}", (SRC / "deploy/akash" / t).read_text()))
        check(names, "placeholders found in deploy/akash/*.yaml (render.py's PLACEHOLDER)")
        texts = {f: (tmp / f).read_text() for f in ("head.sdl.yaml", "provider-0.sdl.yaml")}
        for f, text in texts.items():
            for n in names:
                check(n not in text, f"{f}: placeholder {n} left unfilled")

        docs = {f: yaml.safe_load(t) for f, t in texts.items()}
        for f, doc in docs.items():
            for e in schema_errors(doc) + cross_references(doc):
                failures.append(f"{f}: {e}")
            print(f"{f}: Akash SDL schema and cross-references checked")
        check_head(docs["head.sdl.yaml"])
        check_provider(docs["provider-0.sdl.yaml"])

        # The check is real: broken files are refused by the schema or the cross-references.
        broken = {
            "GPU models as a map instead of a list":
                re.sub(r"(\n(\s+)nvidia:\n)(?:\s+- model: .*\n\s+ram: .*\n)+", r"\1\2  model: h100\n", texts["provider-0.sdl.yaml"]),
            "port 0": texts["head.sdl.yaml"].replace("- port: 7700", "- port: 0"),
            "unknown service key": texts["head.sdl.yaml"].replace("    image:", "    imagee: x\n    image:", 1),
            "RAM volume marked persistent": texts["provider-0.sdl.yaml"].replace("class: ram\n              persistent: false",
                                                                                 "class: ram\n              persistent: true"),
            "price for another service": texts["head.sdl.yaml"].replace("pricing:\n        head:", "pricing:\n        other:"),
        }
        for what, text in broken.items():
            src = texts["provider-0.sdl.yaml"] if what in ("GPU models as a map instead of a list", "RAM volume marked persistent") \
                else texts["head.sdl.yaml"]
            if not check(text != src, f"negative case '{what}': the edit applied to the rendered file"):
                continue
            doc = yaml.safe_load(text)
            errs = schema_errors(doc) + cross_references(doc)
            check(errs, f"negative case '{what}' was accepted")
            print(f"refused as expected ({what}): {errs[0] if errs else '-'}")

    if failures:
        for f in failures:
            print("FAIL:", f)
        print(f"0 passed, {len(failures)} failed")
        return 1
    print("deploy.akash_sdl: both rendered SDL files valid; 5 broken variants refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
