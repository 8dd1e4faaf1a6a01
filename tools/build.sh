#!/usr/bin/env bash
# tools/build.sh [TARGET...]: configures (once) and builds crucible in build/ with Ninja and ccache.
# CRUCIBLE_BUILD_TYPE=RelWithDebInfo keeps debug information (default Release: -O2, none).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${CRUCIBLE_BUILD_DIR:-build}"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE="${CRUCIBLE_BUILD_TYPE:-Release}"
fi
if (($#)); then
  cmake --build "$BUILD" --target "$@"
else
  cmake --build "$BUILD"
fi
