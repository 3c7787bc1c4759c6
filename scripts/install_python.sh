#!/usr/bin/env bash
# Makes the hora Python package (bindings/python/hora) importable by Debian's
# /usr/bin/python3: installs python3-torch/numpy/pytest if missing, builds
# libhora, and writes a .pth file pointing at this checkout (an editable
# install: edits and rebuilds are picked up without reinstalling). The package
# finds libhora in build/ of this checkout, or wherever HORA_LIBRARY points.
#
# Usage: scripts/install_python.sh              install (needs root for dist-packages)
#        scripts/install_python.sh --uninstall  remove the .pth file
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=/usr/bin/python3
SITE="$($PY -c 'import site; print(site.getsitepackages()[0])')"  # /usr/local/lib/python3.X/dist-packages
PTH="$SITE/hora.pth"
if [ "${1:-}" = "--uninstall" ]; then
  rm -f "$PTH"
  echo "hora: removed $PTH"
  exit 0
fi
"$ROOT/scripts/install_deps.sh" --python
"$ROOT/scripts/build.sh" "$ROOT/build" >/dev/null
mkdir -p "$SITE"
echo "$ROOT/bindings/python" > "$PTH"
echo "hora: wrote $PTH -> $ROOT/bindings/python"
cd /
$PY -c 'import hora.torch as hvd, hora; print("hora: import hora.torch ok; libhora at", hora.library_info()["path"])'
