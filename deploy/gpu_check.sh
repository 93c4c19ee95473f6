#!/usr/bin/env bash
# The GPU check of issue 55: xloco built against LibTorch 2.x (`make build-torch2`), carried to a
# machine with a GPU and PyTorch 2.x (the device tool's lent H100/H200, or your own lease), run
# there beside the same model in PyTorch on the same GPU.
#
#   deploy/gpu_check.sh pack [BUILD] [PACK]
#       here: BUILD's xloco (stripped), its SentencePiece module, the shared libraries it needs
#       that are not LibTorch's, CUDA's or the C library's (ZeroMQ, libsodium, zstd, spdlog, fmt,
#       SentencePiece, PNG, ...) and the KJV text into PACK (default BUILD/gpu-pack), under the
#       device tool's 64 MiB.
#   deploy/gpu_check.sh run PACK OUT [--device cuda|cpu] [--quick]
#       there (or here with --device cpu, to check the script end to end): `xloco train` in bf16
#       and fp32, a K = 2 `xloco local` in bf16, and PyTorch (python3 with torch) on the same
#       model in bf16 and fp32: tokens/s, MFU against the measured bf16 matmul rate, peak GPU
#       memory, eval loss after the same budget. Writes OUT/gpu_check.json and OUT/gpu_check.md;
#       each run's log is in OUT/logs. Under 8 minutes on one H100.
#
# With the device tool, from the repository root (PACK must be carried):
#   bash deploy/gpu_check.sh pack build-torch2
#   run(command="bash deploy/gpu_check.sh run build-torch2/gpu-pack $OUT", carry=["build-torch2/gpu-pack"])
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

# What the GPU machine has already: LibTorch's and CUDA's libraries (from its torch install), and
# the C/C++ runtime. libstdc++ goes into lib-fallback, used only where the machine's is older.
skip_lib() {
  case "$1" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|libgcc_s*) return 0 ;;
    libresolv*|libutil.so*|libnsl*|libanl*) return 0 ;;  # glibc's own, tied to its libc
    libtorch*|libc10*|libcaffe2*|libshm*|libgomp*) return 0 ;;
    libcuda*|libcublas*|libcudnn*|libnccl*|libcusparse*|libcufft*|libcurand*|libcusolver*) return 0 ;;
    libnvrtc*|libnvshmem*|libcufile*|libnvToolsExt*|libnvJitLink*|libcupti*) return 0 ;;
  esac
  return 1
}

pack() {
  local build=${1:-build-torch2}
  local out=${2:-$build/gpu-pack}
  local xloco=$build/src/cli/xloco
  [ -x "$xloco" ] || { echo "gpu_check: no $xloco (make build-torch2 first)" >&2; exit 2; }
  if ! ldd "$xloco" | grep -q 'libc10_cuda.so'; then
    echo "gpu_check: $xloco is not linked against a CUDA LibTorch (make build-torch2)" >&2
    exit 2
  fi
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib" "$out/lib-fallback" "$out/data"
  strip -o "$out/bin/xloco" "$xloco"
  strip -o "$out/bin/libxloco_spm.so" "$build/src/cli/libxloco_spm.so"
  local f name path
  for f in "$out/bin/xloco" "$out/bin/libxloco_spm.so"; do
    while read -r name _ path _; do
      [ -n "${path:-}" ] && [ -f "$path" ] || continue
      skip_lib "$name" && continue
      if [[ $name == libstdc++* ]]; then
        cp -L "$path" "$out/lib-fallback/$name"
      else
        cp -L "$path" "$out/lib/$name"
      fi
    done < <(ldd "$f" | grep '=>')
  done
  strip --strip-unneeded "$out"/lib/*.so* "$out"/lib-fallback/*.so* 2>/dev/null || true
  # The KJV text (what `bible` gives, which the GPU machine does not have).
  if command -v bible >/dev/null; then
    bible -f Gen1:1-Rev22:21 > "$out/data/kjv.txt"
  else
    echo "gpu_check: no /usr/bin/bible (apt-get install bible-kjv): no KJV text packed" >&2
    exit 2
  fi
  (cd "$out" && find . -type f | sort | xargs ls -l) > "$out/manifest.txt"
  local bytes
  bytes=$(du -sb "$out" | cut -f1)
  echo "gpu_check: packed $out: $(find "$out" -type f | wc -l) files, $((bytes / 1024 / 1024)) MiB" \
       "(the device tool carries 64 MiB)"
  [ "$bytes" -lt $((60 * 1024 * 1024)) ] || { echo "gpu_check: the pack is too large" >&2; exit 1; }
}

run() {
  local pack=$1 out=$2
  shift 2
  pack=$(cd "$pack" && pwd)
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  local py=${PYTHON:-python3}
  local torch_lib
  torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') || {
    echo "gpu_check: $py has no torch" >&2; exit 2; }
  export LD_LIBRARY_PATH="$pack/lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! "$pack/bin/xloco" --version >/dev/null 2>&1; then
    # The machine's libstdc++ is older than Debian 12's: take the packed one.
    export LD_LIBRARY_PATH="$pack/lib-fallback:$LD_LIBRARY_PATH"
  fi
  "$pack/bin/xloco" --version >/dev/null || { "$pack/bin/xloco" --version; exit 2; }
  "$py" "$here/gpu_check.py" --xloco "$pack/bin/xloco" --text "$pack/data/kjv.txt" --root "$root" \
    --out "$out" "$@"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; [ $# -ge 2 ] || { echo "usage: $0 run PACK OUT [--device cuda|cpu] [--quick]" >&2; exit 2; }
       run "$@" ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac
