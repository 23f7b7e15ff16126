#!/usr/bin/env bash
# Fetch GemLite's source so it can travel to the GPU machine, which has no network.
#
# GemLite is pure Python over Triton (numpy, tqdm, triton >= 3.6, all on the device
# image), so its sdist's gemlite/ folder is all `import gemlite` needs there. It lands in
# .carry/gemlite_src/ (excluded through .git/info/exclude, so it is never committed and
# travels only when a device run names it in `carry`). On the device:
#     PYTHONPATH=.carry/gemlite_src:. python -m lowvm.bench ...
# Run from anywhere, on a machine that can reach PyPI.
set -euo pipefail

VERSION="${GEMLITE_VERSION:-0.6.0.post2}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.carry/gemlite_src"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

python3 -m pip download --quiet --no-deps --no-binary :all: "gemlite==$VERSION" -d "$TMP"
SDIST="$(ls "$TMP"/gemlite-*.tar.gz)"
tar -xzf "$SDIST" -C "$TMP"
SRC="$TMP/gemlite-$VERSION/gemlite"
[ -f "$SRC/__init__.py" ] || { echo "error: $SDIST has no gemlite/ package folder" >&2; exit 1; }

rm -rf "$DEST/gemlite"
mkdir -p "$DEST"
cp -r "$SRC" "$DEST/gemlite"
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +

EXCLUDE="$(git -C "$ROOT" rev-parse --git-path info/exclude)"
case "$EXCLUDE" in /*) ;; *) EXCLUDE="$ROOT/$EXCLUDE" ;; esac
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF '/.carry/' "$EXCLUDE" 2>/dev/null || echo '/.carry/' >> "$EXCLUDE"

echo "gemlite $VERSION -> $DEST/gemlite ($(du -sh "$DEST/gemlite" | cut -f1))"
