#!/usr/bin/env bash
# ctest deploy.akash_sdl: renders deploy/akash/head.yaml and provider.yaml with throwaway keys
# and checks them with Akash's own JS SDK (tests/deploy/akash/sdl.test.cjs). The SDK comes from
# npm (pinned in tests/deploy/akash/package-lock.json, installed with --ignore-scripts into the
# build tree). Skipped, with the reason, when node or npm is not installed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=${XLOCO_SOURCE_DIR:-$HERE/../..}
XLOCO=${XLOCO_BIN:-$SRC/build/src/cli/xloco}
WORK=${XLOCO_AKASHJS_DIR:-$PWD/akashjs}
for tool in node npm; do
  command -v $tool >/dev/null || { echo "SKIPPED: $tool is not installed (Node.js runs Akash's SDK)"; exit 77; }
done

mkdir -p "$WORK"
if ! cmp -s "$HERE/akash/package-lock.json" "$WORK/package-lock.json" || [ ! -d "$WORK/node_modules/@akashnetwork/akashjs" ]; then
  cp "$HERE/akash/package.json" "$HERE/akash/package-lock.json" "$WORK/"
  for try in 1 2 3; do
    if (cd "$WORK" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error); then break; fi
    [ $try -lt 3 ] || { echo "npm ci failed 3 times: is the npm registry reachable?"; exit 1; }
    sleep 5
  done
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in head provider-0 provider-1; do "$XLOCO" keygen "$tmp/keys/$n" >/dev/null; done
HEAD_ADDR=tcp://provider.example.org:31234
python3 "$SRC/deploy/akash/render.py" head --keys "$tmp/keys" --image example/xloco:cpu -o "$tmp/head.sdl.yaml"
python3 "$SRC/deploy/akash/render.py" provider --keys "$tmp/keys" --name provider-0 --shard 0 --gpus 8 \
  --head "$HEAD_ADDR" --image example/xloco:cuda -o "$tmp/provider-0.sdl.yaml"
# Every {{NAME}} of the templates must be gone. Not a bare '{{': the Z85 alphabet has braces,
# so a random key holds '{{' in about one render in a hundred.
# The pattern is render.py's PLACEHOLDER; finding none in the templates is itself a failure.
names=$(grep -ohE '\{\{[A-Z_]+\}\}' "$SRC/deploy/akash/head.yaml" "$SRC/deploy/akash/provider.yaml" | sort -u || true)
[ -n "$names" ] || { echo "no {{NAME}} placeholders found in deploy/akash/*.yaml"; exit 1; }
for name in $names; do
  if grep -nF "$name" "$tmp"/*.sdl.yaml; then echo "placeholder $name left unfilled"; exit 1; fi
done
NODE_PATH="$WORK/node_modules" node --test-reporter=spec "$HERE/akash/sdl.test.cjs" \
  "$tmp/head.sdl.yaml" "$tmp/provider-0.sdl.yaml" "$HEAD_ADDR"
