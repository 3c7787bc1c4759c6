#!/usr/bin/env bash
# Builds a wheel of the hora Python package that carries libhora: hora/lib/
# holds libhora.so.0, the GPU plugin libhora_cuda.so when the build has it, and
# (unless --no-bundle-deps) the shared libraries libhora needs beyond glibc and
# the GCC runtime (Gloo and what it links: hiredis, ibverbs, libnl; OpenSSL's
# libcrypto), with
# RUNPATH=$ORIGIN so they are found there, and their Debian copyright files
# under hora/lib/licenses/. hora/_lib.py loads hora/lib/libhora.so.0 before
# any other copy (HORA_LIBRARY still comes first). The GPU plugin keeps its own
# RUNPATH: CUDA and NCCL come from the machine that runs it.
#
# The tag is py3-none-<platform> (e.g. py3-none-linux_x86_64): pure Python over
# ctypes, so any Python 3, but only this platform, and libraries built against
# this machine's glibc and libstdc++ (Debian 12's here; not a manylinux wheel).
#
# Usage: scripts/build_wheel.sh [--build-dir DIR] [--out DIR] [--no-bundle-deps] [--keep-debug]
#   --build-dir DIR    a built tree (default: build/; needs target hora, e.g. scripts/build.sh)
#   --out DIR          where the .whl goes (default: dist/)
#   --no-bundle-deps   carry libhora and the plugin only: the installing machine
#                      then needs Debian's libgloo0 and libssl3 (and what they pull in)
#   --keep-debug       do not strip debug information (libhora is ~40 MB with it)
# Needs /usr/bin/python3 (HORA_PYTHON overrides) with pip, setuptools and wheel,
# and patchelf to bundle: scripts/install_deps.sh --python installs them. Offline:
# nothing is downloaded (pip wheel --no-index --no-build-isolation).
# Installing it: python3 -m pip install dist/hora-*.whl (docs/install.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"
OUT="$ROOT/dist"
BUNDLE=1
STRIP=1
PY="${HORA_PYTHON:-/usr/bin/python3}"
die() {
  echo "build_wheel.sh: $*" >&2
  exit 1
}
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$(cd "${2:?--build-dir needs a directory}" && pwd)"; shift 2 ;;
    --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
    --no-bundle-deps) BUNDLE=0; shift ;;
    --keep-debug) STRIP=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

LIB="$BUILD/bindings/c/libhora.so.0"
[ -e "$LIB" ] || die "no $LIB: build libhora first (scripts/build.sh, or ninja -C $BUILD hora)"
for m in pip setuptools wheel; do "$PY" -c "import $m" 2>/dev/null ||
    die "$PY lacks $m (scripts/install_deps.sh --python installs python3-pip, python3-setuptools, python3-wheel)"
done
if [ $BUNDLE -eq 1 ]; then
  command -v patchelf >/dev/null ||
    die "bundling libhora's dependencies needs patchelf (scripts/install_deps.sh --python), or pass --no-bundle-deps"
fi
if [ $STRIP -eq 1 ]; then
  command -v strip >/dev/null || die "no strip (binutils): install it or pass --keep-debug"
fi

STAGE="$(mktemp -d /tmp/hora-wheel.XXXXXX)"
trap 'rm -rf "$STAGE"' EXIT
# The package sources, without build leftovers.
tar -C "$ROOT/bindings/python" --exclude=__pycache__ --exclude='*.pyc' --exclude=build \
  --exclude='*.egg-info' --exclude=lib -cf - pyproject.toml README.md hora | tar -C "$STAGE" -xf -
DEST="$STAGE/hora/lib"
mkdir -p "$DEST"

copy_lib() {  # copy_lib SRC NAME: a regular file hora/lib/NAME, stripped of debug info
  cp -L "$1" "$DEST/$2"
  chmod 0755 "$DEST/$2"
  [ $STRIP -eq 0 ] || strip --strip-debug "$DEST/$2"
}
copy_lib "$LIB" libhora.so.0
echo "hora/lib/libhora.so.0        <- $(readlink -f "$LIB")"
PLUGIN="$BUILD/ops/cuda/libhora_cuda.so"
if [ -e "$PLUGIN" ]; then
  copy_lib "$PLUGIN" libhora_cuda.so
  echo "hora/lib/libhora_cuda.so     <- $PLUGIN (GPU plugin; CUDA and NCCL from the installing machine)"
else
  echo "(no GPU plugin in $BUILD: a CPU-only wheel)"
fi

if [ $BUNDLE -eq 1 ]; then
  # Everything ldd resolves for libhora except glibc, the GCC runtime and the
  # loader, which every Linux the wheel can run on has (as manylinux counts them).
  base='^(linux-vdso|linux-gate|ld-linux|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s)\.so'
  missing="$(ldd "$LIB" | awk '/not found/ { print $1 }')"
  [ -z "$missing" ] || die "libhora's dependencies not found on this machine: $missing"
  mkdir -p "$DEST/licenses"
  {
    echo "Shared libraries bundled with libhora by scripts/build_wheel.sh, from this machine:"
    while read -r name path; do
      [[ "$name" =~ $base ]] && continue
      copy_lib "$path" "$name"
      patchelf --set-rpath '$ORIGIN' "$DEST/$name"
      real="$(readlink -f "$path")"
      pkg="$(dpkg -S "$real" 2>/dev/null | head -n1 | cut -d: -f1 || true)"
      [ -n "$pkg" ] || pkg="$(dpkg -S "${real#/usr}" 2>/dev/null | head -n1 | cut -d: -f1 || true)"
      if [ -n "$pkg" ]; then
        ver="$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)"
        src="/usr/share/doc/$pkg/copyright"
        [ -f "$src" ] && cp "$src" "$DEST/licenses/$pkg.copyright"
        echo "$name: $real (Debian package $pkg $ver)"
      else
        echo "$name: $real (no Debian package owns it)"
      fi
      echo "hora/lib/$name <- $real${pkg:+ ($pkg)}" >&2
    done < <(ldd "$LIB" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
  } >"$DEST/BUNDLED.txt"
  patchelf --set-rpath '$ORIGIN' "$DEST/libhora.so.0"
fi

# A platform tag for a package whose only binaries are loaded by ctypes.
PLAT="$("$PY" -c 'import sysconfig; print(sysconfig.get_platform().replace("-", "_").replace(".", "_"))')"
cat >"$STAGE/setup.cfg" <<EOF
[bdist_wheel]
python_tag = py3
plat_name = $PLAT
EOF
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
VERSION="$(sed -nE 's/^version = "([^"]+)".*/\1/p' "$STAGE/pyproject.toml")"
WHEEL="$OUT/hora-$VERSION-py3-none-$PLAT.whl"
rm -f "$WHEEL"
"$PY" -m pip wheel --no-deps --no-index --no-build-isolation --disable-pip-version-check -q \
  -w "$OUT" "$STAGE" >"$STAGE/pip.log" 2>&1 || { cat "$STAGE/pip.log" >&2; die "pip wheel failed"; }
[ -f "$WHEEL" ] || { ls -l "$OUT" >&2; die "pip wheel did not write $WHEEL"; }
echo "wrote $WHEEL ($(du -h "$WHEEL" | cut -f1))"
