#!/usr/bin/env bash
# cmake --install into a temporary prefix, then: a consumer project built with
# find_package(hora) and one built with pkg-config, both run (a job of one);
# the installed horarun starts without LD_LIBRARY_PATH; and the prefix still
# works after being moved (relocatable config, .pc and RPATH).
# Needs: BUILD_DIR (a built tree). Exit 77: no C compiler or pkg-config.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${BUILD_DIR:?set BUILD_DIR to a built hora tree}"
command -v cc >/dev/null || { echo "SKIPPED: no cc"; exit 77; }
command -v pkg-config >/dev/null || { echo "SKIPPED: no pkg-config"; exit 77; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
unset LD_LIBRARY_PATH HORA_LIBRARY
step() { echo "== $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

step "cmake --install $BUILD_DIR --prefix $TMP/a"
cmake --install "$BUILD_DIR" --prefix "$TMP/a" >"$TMP/install.log" || { cat "$TMP/install.log"; fail "install"; }
LIBDIR="$(dirname "$(find "$TMP/a" -name 'libhora.so.0' | head -n1)")"
[ -n "$LIBDIR" ] || fail "no libhora.so.0 installed"
for f in "$LIBDIR/cmake/hora/horaConfig.cmake" "$LIBDIR/cmake/hora/horaConfigVersion.cmake" \
         "$LIBDIR/pkgconfig/hora.pc" "$TMP/a/include/hora/hora.h" "$TMP/a/bin/horarun"; do
  [ -e "$f" ] || fail "missing after install: $f"
done

consumers() {  # $1: prefix
  local prefix="$1" lib
  lib="$(dirname "$(find "$prefix" -name 'libhora.so.0' | head -n1)")"
  step "find_package(hora) consumer against $prefix"
  rm -rf "$TMP/cm"
  cmake -S "$HERE/consumer" -B "$TMP/cm" -DCMAKE_PREFIX_PATH="$prefix" >"$TMP/cm.log" 2>&1 ||
    { cat "$TMP/cm.log"; fail "configuring the find_package consumer"; }
  cmake --build "$TMP/cm" >>"$TMP/cm.log" 2>&1 || { cat "$TMP/cm.log"; fail "building it"; }
  "$TMP/cm/consumer" | tee "$TMP/out"
  grep -q "size 1" "$TMP/out" || fail "find_package consumer output"
  step "pkg-config consumer against $prefix"
  local flags
  flags="$(PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --cflags --libs hora)" || fail "pkg-config hora"
  echo "pkg-config --cflags --libs hora: $flags"
  # shellcheck disable=SC2086
  cc -o "$TMP/pc_consumer" "$HERE/consumer/main.c" $flags -Wl,-rpath,"$lib" || fail "building the pkg-config consumer"
  "$TMP/pc_consumer" | tee "$TMP/out"
  grep -q "size 1" "$TMP/out" || fail "pkg-config consumer output"
  step "installed horarun finds libhora by its RPATH"
  "$prefix/bin/horarun" -np 1 "$TMP/pc_consumer" >"$TMP/out" 2>&1 || { cat "$TMP/out"; fail "horarun -np 1"; }
  grep -q "size 1" "$TMP/out" || { cat "$TMP/out"; fail "horarun output"; }
}
consumers "$TMP/a"
step "the prefix moved to $TMP/b (relocatable)"
mv "$TMP/a" "$TMP/b"
consumers "$TMP/b"
echo "OK"
