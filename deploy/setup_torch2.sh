#!/usr/bin/env bash
# The PyTorch 2.x environment beside Debian's LibTorch 1.13 (issue 55): a virtual environment
# with the pinned packages of deploy/requirements-torch2.txt from PyPI. `make setup` (so `make
# test`) calls it for ctest hf.transformers; `make build-torch2` builds xloco against its torch.
# Idempotent: a stamp holds the hash of the requirements it was made from.
#
#   deploy/setup_torch2.sh [VENV]       (default: .venv-torch2 in the source tree)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-${XLOCO_TORCH2_VENV:-$here/../.venv-torch2}}
req=$here/requirements-torch2.txt
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -f "$venv/.xloco-stamp" ] && [ "$(cat "$venv/.xloco-stamp")" = "$want" ]; then
  echo "setup_torch2: $venv is up to date"
  exit 0
fi
# torch's CUDA build loads libcudart.so.13 and the toolkit's other libraries at import.
if ! ldconfig -p | grep 'libcudart.so.13' >/dev/null; then
  echo "setup_torch2: no CUDA 13 runtime on this machine (libcudart.so.13 is not in ldconfig's" \
       "cache): the PyTorch 2.x environment is not made; the tests that need it report skipped" >&2
  exit 0
fi
py=${PYTHON:-python3}
echo "setup_torch2: making $venv from $req (about 1.5 GB)"
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/pip" install --quiet --no-deps --disable-pip-version-check -r "$req"
"$venv/bin/python" -c "import torch, transformers; print('setup_torch2: torch', torch.__version__, '| transformers', transformers.__version__)"
echo "$want" > "$venv/.xloco-stamp"
