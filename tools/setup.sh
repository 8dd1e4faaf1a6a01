#!/usr/bin/env bash
# tools/setup.sh: installs everything crucible needs on a Debian or Ubuntu machine: Debian
# packages with apt-get, Python packages (pinned, tools/requirements.txt) into .venv.
# Idempotent: a second run installs nothing and takes seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  python3 python3-venv python3-dev
  libcaf-dev libzmq3-dev cppzmq-dev libyaml-cpp-dev nlohmann-json3-dev libcpp-httplib-dev doctest-dev libsqlite3-dev sqlite3
  libssl-dev
  libseccomp2
)

SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  SUDO="sudo"
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python: a project virtual environment; reinstalled only when requirements.txt changes.
PYTHON="${CRUCIBLE_PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.crucible-requirements"
want="$(sha256sum tools/requirements.txt | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "setup: installing Python packages from tools/requirements.txt (torch is large: minutes)"
  .venv/bin/python -m pip install -q -r tools/requirements.txt
  echo "$want" > "$stamp"
fi
.venv/bin/python -c "import torch, numpy, zmq, pytest; assert torch.__version__.startswith('2.11.0'), torch.__version__"
echo "setup: ok ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
