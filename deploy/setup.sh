#!/usr/bin/env bash
# One idempotent set-up for a Debian 12 machine: `make demo`, `make test`, `.ci/run` and the
# container image all call this, so they cannot drift. It installs only what is missing.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake make pkg-config ccache git
  # the stack
  libtorch-dev libgloo-dev cppzmq-dev libzmq3-dev libsodium-dev libboost-dev libzstd-dev
  nlohmann-json3-dev doctest-dev libcli11-dev libspdlog-dev libbenchmark-dev zlib1g-dev
  # PNG sample grids of image models (xloco sample)
  libpng-dev
  # tokenizers (xloco prepare); the sentencepiece tools are the reference in tests
  libsentencepiece-dev sentencepiece
  # a real BLAS for LibTorch (the reference BLAS is ~30x slower on matmul)
  libopenblas0-pthread
  # data: public-domain text and Fashion-MNIST
  bible-kjv dataset-fashion-mnist
  # reference implementation for benchmarks and the Python checkpoint reader in tests
  python3 python3-venv python3-torch python3-numpy
  # Akash's SDL schema validator in the tests (deploy.akash_sdl)
  python3-jsonschema python3-yaml
  # network tests (namespaces, rate limits)
  iproute2 procps
  # promtool, which lints the head's /metrics in the tests
  prometheus
  # plots of the convergence harness (make experiments)
  gnuplot-nox
)
# The dashboard's test in a real headless browser, and a font for its screenshots: not in the
# images (XLOCO_SETUP_IMAGE=1), where they would add ~300 MB to every pull.
if [ "${XLOCO_SETUP_IMAGE:-0}" != 1 ]; then
  PACKAGES+=(chromium fonts-dejavu-core python3-pip)
fi
PACKAGES+=(${XLOCO_EXTRA_PACKAGES:-})

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# From PyPI, pinned, for the tests only (not in the images): lizard measures function lengths
# (tests/structure_check.py).
PYPI=(lizard==1.24.3)

install_pypi() {
  [ "${XLOCO_SETUP_IMAGE:-0}" != 1 ] || return 0
  # PyTorch 2.x and transformers, pinned, in their own environment (ctest hf.transformers).
  bash "$(dirname "$0")/setup_torch2.sh" ||
    echo "setup: the PyTorch 2.x environment failed: the tests that need it report skipped" >&2
  python3 -c "import lizard" 2>/dev/null && return 0
  echo "setup: installing from PyPI: ${PYPI[*]}"
  local where=()
  [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ] || where=(--user)
  $SUDO python3 -m pip install --quiet --break-system-packages "${where[@]}" "${PYPI[@]}" ||
    echo "setup: could not install ${PYPI[*]}: the tests that need it report themselves skipped" >&2
}

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  install_pypi
  exit 0
fi

if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: run as root (or install sudo) so that they can be installed with apt-get" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_pypi
echo "setup: done"
