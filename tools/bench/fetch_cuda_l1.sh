#!/usr/bin/env bash
# tools/bench/fetch_cuda_l1.sh [DEST]: CUDA-L1's released kernels (optimized_cuda_code/{a100,3090,
# l40,h20,h100}.json of github.com/deepreinforce-ai/CUDA-L1, MIT) at the commit the figures in
# docs/evaluator.md were taken from, into DEST (default data/cuda-l1, ignored by git). The a100,
# l40, 3090 and h20 releases are the development set; h100 is kept aside for acceptance. The
# goals table of docs/PERFORMANCE.md reads them for its rows on CUDA-L1's released kernels
# (tools/bench/gpu_session.sh cuda_l1, static_screen_survey.py) and on timing precision (the
# dev6 pairs, tools/bench/pick_pairs.py). Needs git and the network; no environment variables.
set -euo pipefail
[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { sed -n 2,8p "$0" | sed 's/^# \{0,1\}//'; exit 0; }
COMMIT=51e8356bf844101cab2aeeca4bdff47ebb1953b8
DEST="${1:-data/cuda-l1}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
git -C "$tmp" init -q
git -C "$tmp" fetch -q --depth 1 https://github.com/deepreinforce-ai/CUDA-L1.git "$COMMIT"
mkdir -p "$DEST"
for r in a100 3090 l40 h20 h100; do
  git -C "$tmp" show "FETCH_HEAD:optimized_cuda_code/$r.json" > "$DEST/$r.json"
done
echo "CUDA-L1 $COMMIT: $(cd "$DEST" && wc -l a100.json 3090.json l40.json h20.json h100.json | tail -1) lines in $DEST"
