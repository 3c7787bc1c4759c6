#!/usr/bin/env bash
# Checks that the includes follow hora's layers (docs/architecture.md):
#   core/        includes nothing from controllers/, ops/, bindings/
#   controllers/ includes core/ only (never ops/ or bindings/)
#   ops/         includes core/ and ops/ only (never controllers/ or bindings/)
# Prints each offending include with its file and line; exit 1 if any.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
bad=0
check() {  # folder, forbidden prefixes...
  local dir="$1"
  shift
  local pat
  pat="^[[:space:]]*#[[:space:]]*include[[:space:]]*\"($(IFS='|'; echo "$*"))/"
  local hits
  hits=$(grep -rnE "$pat" "$dir" --include='*.h' --include='*.cc' --include='*.cu' 2>/dev/null)
  if [ -n "$hits" ]; then
    echo "layering: $dir/ must not include from $*:"
    echo "$hits" | sed 's/^/  /'
    bad=1
  fi
}
check core controllers ops bindings
check controllers ops bindings
check ops controllers bindings
if [ "$bad" = 0 ]; then
  echo "layering: core/, controllers/, ops/ follow the layers"
fi
exit "$bad"
