#!/usr/bin/env bash
# tools/gpu-build.sh: builds and tests crucible on a GPU machine that has CUDA, NCCL, yaml-cpp,
# doctest and PyTorch but no CAF or ZeroMQ. Expects Debian's .deb files in .deps/debs
# (see docs/building.md) and unpacks them into .deps/prefix. Extra arguments go to ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
shopt -s nullglob
debs=(.deps/debs/*.deb)
if ((${#debs[@]} == 0)); then
  echo "gpu-build: no .deb files in .deps/debs (see docs/building.md)" >&2
  exit 2
fi
mkdir -p .deps/prefix
for f in "${debs[@]}"; do dpkg -x "$f" .deps/prefix; done
PREFIX="$ROOT/.deps/prefix/usr"
export LD_LIBRARY_PATH="$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
# pkg-config's packages (cpp-httplib: crucible serve, serve-policy) from the prefix: their .pc files say /usr.
export PKG_CONFIG_PATH="$PREFIX/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$ROOT/.deps/prefix"
BUILD="${CRUCIBLE_BUILD_DIR:-build-gpu}"
start=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$PREFIX;$PREFIX/lib/x86_64-linux-gnu/cmake;$PREFIX/share/cmake" \
  -DCRUCIBLE_PYTHON="$(command -v python3)" -DCRUCIBLE_CUDA=ON
cmake --build "$BUILD" -j "$(nproc)"
echo "gpu-build: configure + build took $(( $(date +%s) - start )) s"
ctest --test-dir "$BUILD" --output-on-failure -j 4 "$@"
