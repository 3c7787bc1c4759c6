#!/usr/bin/env bash
# The long fault-injecting soak (issue 14; docs/reliability.md, "Soak"): builds horarun and
# hora_soak in BUILD (default build/), then runs scripts/soak.py, which prints the summary.
#   scripts/soak.sh --collectives 1000000 --summary soak-summary.md
#   scripts/soak.sh --seconds 3600
# Arguments go to scripts/soak.py (--help lists them); BUILD comes from $HORA_BUILD_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build="${HORA_BUILD_DIR:-build}"
nice -n 19 ninja -C "$build" -j1 horarun hora_soak >/dev/null
exec nice -n 19 /usr/bin/python3 scripts/soak.py --build "$build" "$@"
