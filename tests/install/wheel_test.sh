#!/usr/bin/env bash
# The wheel that carries libhora (scripts/build_wheel.sh), installed the way a
# user would, offline, and used from outside the source tree with neither
# HORA_LIBRARY nor PYTHONPATH nor LD_LIBRARY_PATH set:
#   1. the wheel: tag py3-none-<platform> (not "any"), hora/lib/libhora.so.0
#      and its bundled dependencies, RUNPATH=$ORIGIN;
#   2. a bare venv (no site packages, so no numpy): pip install --no-deps,
#      `import hora` works and reports the bundled libhora; hora.numpy fails
#      naming numpy;
#   3. a venv with Debian's numpy (and torch) visible (--system-site-packages):
#      pip install --no-index of the wheel (its numpy requirement met by
#      Debian's), `import hora; import hora.numpy` loads the bundled libhora
#      (every dependency of it resolved inside hora/lib), then a 2-rank
#      allreduce through hora.numpy (and hora.torch when torch is there), sums
#      checked element by element.
# Needs: BUILD_DIR (a built tree). Exit 77: no python3 venv/pip/setuptools/wheel
# or patchelf, or (after part 2) no numpy; scripts/install_deps.sh --python
# installs them. About 20 s.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
: "${BUILD_DIR:?set BUILD_DIR to a built hora tree}"
PY="${HORA_PYTHON:-/usr/bin/python3}"
skip() {
  echo "SKIPPED: $* (scripts/install_deps.sh --python installs it)"
  exit 77
}
[ -x "$PY" ] || skip "no $PY"
for m in venv ensurepip pip setuptools wheel; do
  "$PY" -c "import $m" 2>/dev/null || skip "$PY has no module $m"
done
command -v patchelf >/dev/null || skip "no patchelf"
TMP="$(mktemp -d /tmp/hora-wheel-test.XXXXXX)"
trap 'for j in $(jobs -p); do kill -TERM "$j" 2>/dev/null; done; rm -rf "$TMP"' EXIT
step() { echo "== $*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
t_start=$SECONDS

step "scripts/build_wheel.sh --build-dir $BUILD_DIR"
"$ROOT/scripts/build_wheel.sh" --build-dir "$BUILD_DIR" --out "$TMP/dist" >"$TMP/build.log" 2>&1 ||
  { cat "$TMP/build.log"; fail "build_wheel.sh"; }
cat "$TMP/build.log"
WHEELS=("$TMP"/dist/hora-*.whl)
[ ${#WHEELS[@]} -eq 1 ] && [ -f "${WHEELS[0]}" ] || fail "expected one wheel in $TMP/dist: ${WHEELS[*]}"
WHEEL="${WHEELS[0]}"
case "$(basename "$WHEEL")" in
  *-py3-none-any.whl) fail "$(basename "$WHEEL") is tagged for any platform, but it carries libhora" ;;
  *-py3-none-linux_*.whl) ;;
  *) fail "unexpected wheel name $(basename "$WHEEL")" ;;
esac
HAVE_PLUGIN=0
[ -e "$BUILD_DIR/ops/cuda/libhora_cuda.so" ] && HAVE_PLUGIN=1
"$PY" - "$WHEEL" "$HAVE_PLUGIN" <<'EOF' || fail "wheel contents"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["hora/__init__.py", "hora/numpy.py", "hora/torch/__init__.py", "hora/_lib.py",
        "hora/lib/libhora.so.0", "hora/lib/BUNDLED.txt"]
if sys.argv[2] == "1":  # the build has the GPU plugin: the wheel carries it
    need.append("hora/lib/libhora_cuda.so")
missing = [n for n in need if n not in names]
if missing:
    sys.exit("missing from the wheel: %s" % missing)
print("wheel holds:", sorted(n for n in names if n.startswith("hora/lib/lib")))
EOF

# Everything below runs from a directory outside the source tree, with no
# variable that could lead Python or the loader back to it.
cd "$TMP"
unset HORA_LIBRARY PYTHONPATH LD_LIBRARY_PATH PYTHONHOME HORA_GPU_PLUGIN
for v in $(compgen -e | grep -E '^(HORA_|OMPI_|PMI_|PMIX_|SLURM_)'); do unset "$v"; done
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID

step "bare venv (no site packages, no numpy): $TMP/bare"
"$PY" -m venv "$TMP/bare" >"$TMP/venv.log" 2>&1 || { cat "$TMP/venv.log"; fail "python3 -m venv"; }
BPY="$TMP/bare/bin/python"
"$BPY" -m pip install --no-index --no-deps --disable-pip-version-check -q "$WHEEL" >"$TMP/pip.log" 2>&1 ||
  { cat "$TMP/pip.log"; fail "pip install --no-deps into the bare venv"; }
"$BPY" - <<'EOF' || fail "import hora in the bare venv"
import os
import hora
path = hora.library_info()["path"]
print("bare venv: hora %s, libhora %s" % (hora.__version__, path))
assert os.path.realpath(path).startswith(os.path.realpath(os.path.dirname(hora.__file__))), path
try:
    import hora.numpy  # noqa: F401
except ImportError as e:
    assert "numpy" in str(e), e
    print("bare venv: hora.numpy needs numpy:", e)
else:
    raise AssertionError("hora.numpy imported without numpy")
EOF

# Debian's numpy (python3-numpy) meets the wheel's requirement offline.
"$PY" -c "import numpy" 2>/dev/null ||
  skip "only the bare venv was tested: $PY has no numpy for the allreduce part"

step "venv with the system's site packages: $TMP/venv"
"$PY" -m venv --system-site-packages "$TMP/venv" >"$TMP/venv.log" 2>&1 || { cat "$TMP/venv.log"; fail "python3 -m venv"; }
VPY="$TMP/venv/bin/python"
"$VPY" -m pip install --no-index --no-build-isolation --disable-pip-version-check -q "$WHEEL" \
  >"$TMP/pip.log" 2>&1 || { cat "$TMP/pip.log"; fail "pip install --no-index $(basename "$WHEEL")"; }
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
[ -f "$SITE/hora/lib/libhora.so.0" ] || fail "no $SITE/hora/lib/libhora.so.0 after pip install"
ldd "$SITE/hora/lib/libhora.so.0" >"$TMP/ldd.txt"
if grep -q "not found" "$TMP/ldd.txt"; then cat "$TMP/ldd.txt"; fail "libhora's dependencies not all found"; fi
while read -r name path; do
  [[ "$name" =~ ^(libc|libm|libstdc\+\+|libgcc_s|ld-linux|libdl|libpthread|librt)\. ]] && continue
  case "$path" in
    "$SITE"/hora/lib/*) ;;
    *) fail "$name resolves to $path, not to the wheel's copy in $SITE/hora/lib" ;;
  esac
done < <(awk '$2 == "=>" { print $1, $3 }' "$TMP/ldd.txt")

"$VPY" - "$SITE" <<'EOF' || fail "import hora; import hora.numpy from the venv"
import os, sys
import hora
import hora.numpy
path = hora.library_info()["path"]
want = os.path.join(sys.argv[1], "hora", "lib", "libhora.so.0")
print("hora %s from %s, libhora %s" % (hora.__version__, os.path.dirname(hora.__file__), path))
assert os.path.realpath(path) == os.path.realpath(want), "loaded %s, expected the bundled %s" % (path, want)
assert hora.__file__.startswith(sys.argv[1]), "hora imported from %s, not the venv" % hora.__file__
EOF

cat >"$TMP/allreduce.py" <<'EOF'
# Two ranks (HORA_RANK/HORA_SIZE set by the test): allreduce through hora.numpy,
# and through hora.torch when torch is importable; every element checked.
import sys
import numpy as np
import hora.numpy as hn
hn.init()
r, n = hn.rank(), hn.size()
assert n == 2, n
x = np.arange(1000, dtype=np.float32) * (r + 1)
got = hn.allreduce(x, op=hn.Sum, name="wheel.np")
want = np.arange(1000, dtype=np.float32) * 3
assert np.array_equal(got, want), (got[:5], want[:5])
line = "rank %d: numpy allreduce ok" % r
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    import hora.torch as hvd
    t = torch.full((257,), float(r + 1), dtype=torch.float64)
    s = hvd.allreduce(t, op=hvd.Sum, name="wheel.torch")
    assert torch.equal(s, torch.full((257,), 3.0, dtype=torch.float64)), s[:5]
    line += ", torch allreduce ok"
hn.shutdown()
print(line, flush=True)
EOF
step "2-rank allreduce from the venv"
export HORA_SIZE=2 HORA_STORE_ADDR=127.0.0.1 HORA_STORE_PORT=$((20000 + RANDOM % 20000))
export HORA_SECRET="wheel-test-$RANDOM$RANDOM"
pids=()
for r in 0 1; do
  HORA_RANK=$r timeout 120 "$VPY" "$TMP/allreduce.py" >"$TMP/rank$r.out" 2>"$TMP/rank$r.err" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
for r in 0 1; do
  cat "$TMP/rank$r.out"
  grep -q "^rank $r: numpy allreduce ok" "$TMP/rank$r.out" || { cat "$TMP/rank$r.err"; fail "rank $r (exit $rc)"; }
done
[ $rc -eq 0 ] || fail "a rank exited $rc"

echo "OK in $((SECONDS - t_start)) s"
