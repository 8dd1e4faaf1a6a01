#!/usr/bin/env bash
# tools/bench/lent_machine.sh [COMMAND [ARG...]]: the set-up of a lent GPU machine, kept apart from
# the measurements. Such a machine has CUDA, NCCL, yaml-cpp, doctest and PyTorch, but no CAF,
# ZeroMQ, SQLite headers or pyzmq, and cannot download; it copies the working tree in and brings
# back what a command writes under $OUT. So Debian's packages come along in .deps/debs and wheels
# in .whl (docs/building.md, "On a lent GPU machine"). This script unpacks the packages into
# .deps/prefix, installs the wheels where an import fails, configures BUILD (default build-gpu)
# against the prefix, then runs COMMAND with BUILD, OUT (default ./gpu-out) and the library path
# exported: a figure script of tools/bench then runs as on any GPU machine, e.g.
#
#   tools/bench/lent_machine.sh tools/bench/decode.sh
#
# Sourced (tools/bench/gpu_session.sh does), it exports the environment and defines lent_setup,
# lent_configure and lent_build, and runs nothing.
set -uo pipefail

LENT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LENT_PREFIX="$LENT_ROOT/.deps/prefix/usr"
export OUT="${OUT:-$LENT_ROOT/gpu-out}"
export LD_LIBRARY_PATH="$LENT_PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
# The lent machines keep NVLink multicast off (NCCL's NVLS, torch's symmetric memory, NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

lent_setup() { # Debian's .debs (CAF, ZeroMQ, cpp-httplib) unpacked; pyzmq and transformers from .whl where missing
  local f
  mkdir -p "$OUT" "$LENT_ROOT/.deps/prefix"
  for f in "$LENT_ROOT"/.deps/debs/*.deb; do dpkg -x "$f" "$LENT_ROOT/.deps/prefix"; done
  # The machine cannot download, so wheels carried in .whl/ are installed when an import fails.
  python3 -c 'import zmq, transformers' 2>/dev/null || { ls "$LENT_ROOT"/.whl/*.whl >/dev/null 2>&1 &&
    python3 -m pip install -q --no-index --no-deps --break-system-packages "$LENT_ROOT"/.whl/*.whl; }
}

lent_configure() { # SRC BUILD LOG: BUILD configured against the prefix, once
  # pkg-config's packages (cpp-httplib) from the prefix too: their .pc files say /usr.
  export PKG_CONFIG_PATH="$LENT_PREFIX/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export PKG_CONFIG_SYSROOT_DIR="$LENT_ROOT/.deps/prefix"
  [[ -f $2/build.ninja ]] || cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCRUCIBLE_TESTS=ON \
    -DCMAKE_PREFIX_PATH="$LENT_PREFIX;$LENT_PREFIX/lib/x86_64-linux-gnu/cmake;$LENT_PREFIX/share/cmake" \
    -DCRUCIBLE_PYTHON="$(command -v python3)" -DCRUCIBLE_CUDA=ON > "$3" 2>&1
}

lent_build() { # TARGET...: set up, configure and build in BUILD; then the device's name, memory, driver and clock
  local start
  lent_setup
  lent_configure "$LENT_ROOT" "$BUILD" "$OUT/configure.log" || { tail -30 "$OUT/configure.log"; exit 1; }
  start=$(date +%s)
  cmake --build "$BUILD" -j "$(nproc)" --target "$@" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  echo "lent_machine: build took $(( $(date +%s) - start )) s"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
}

# Run, not sourced: set up, configure BUILD, then COMMAND.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  case "${1:-}" in
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
  esac
  export BUILD="${BUILD:-$LENT_ROOT/build-gpu}"
  lent_setup
  lent_configure "$LENT_ROOT" "$BUILD" "$OUT/configure.log" || { tail -30 "$OUT/configure.log"; exit 1; }
  (($#)) || exit 0
  cd "$LENT_ROOT" || exit 2
  exec "$@"
fi
