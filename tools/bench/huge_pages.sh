#!/usr/bin/env bash
# tools/bench/huge_pages.sh: evaluator.huge_pages off and on, side by side on the CPU suite
# (docs/PERFORMANCE.md, "Huge pages for the workers"): the references against themselves
# (reference_as_candidate.py; band_check.py --self) and every seed variant but the wrong ones, one
# verdict each with each setting, from crucible in BUILD (default build) to OUT (default
# runs/bench/huge_pages). Prints each setting's identity summary, then a table of the variants'
# measured speedups and reference times with each, and their ratio.
# PYTHON: the interpreter with torch (default .venv/bin/python, else python3).
set -uo pipefail
case "${1:-}" in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUILD="$(realpath -m "${BUILD:-build}")"
OUT="$(realpath -m "${OUT:-$ROOT/runs/bench/huge_pages}")"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
C="$BUILD/tools/crucible"
mkdir -p "$OUT"
CRUCIBLE_BUILD_DIR="$BUILD" tools/build.sh crucible >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "transparent_hugepage: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
"$PYTHON" tools/bench/reference_as_candidate.py env/tasks/cpu "$OUT/self" >/dev/null 2>&1
{
  printf '# task\tcandidate: the CPU suite seed variants but the wrong ones\n'
  for d in env/tasks/cpu/variants/*/; do
    for f in "$d"*.py; do
      [[ $(basename "$f") == wrong_* ]] || printf '%s\t%s\n' "$ROOT/env/tasks/cpu/$(basename "$d").py" "$ROOT/$f"
    done
  done
} > "$OUT/variants.tsv"
for hp in false true; do
  for set in self variants; do
    pairs="$OUT/self/pairs.tsv"
    [[ $set == variants ]] && pairs="$OUT/variants.tsv"
    rm -f "$OUT/${set}_$hp.jsonl"
    s=$(date +%s)
    "$C" eval --pairs "$pairs" --device cpu --no-cache --json --set evaluator.huge_pages=$hp \
      --out "$OUT/${set}_$hp.jsonl" > /dev/null 2> "$OUT/${set}_$hp.err"
    echo "$set huge_pages=$hp rc=$? $(( $(date +%s) - s )) s"
  done
  "$PYTHON" tools/bench/band_check.py "$OUT/self_$hp.jsonl" --self 2>&1 | tail -1
done
"$PYTHON" - "$OUT" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
def load(p):
    d = {}
    for line in open(p):
        v = json.loads(line)
        m = re.search(r"([0-9.]+)x over", v.get("message", ""))
        d[(v["task"].split("/")[-1][:-3], v["candidate"].split("/")[-1])] = (v["status"], m and float(m.group(1)), v.get("ref_ms"))
    return d
for hp in ("false", "true"):
    xs = [s for _, s, _ in load(f"{out}/self_{hp}.jsonl").values() if s]
    print(f"identity huge_pages={hp}: {len(xs)} verdicts, mean {statistics.mean(xs):.3f}x, "
          f"mean |x - 1| {statistics.mean(abs(x - 1) for x in xs):.3f}, most {max(abs(x - 1) for x in xs):.3f}, "
          f"above 1.05x {sum(x > 1.05 for x in xs)}")
a, b = load(f"{out}/variants_false.jsonl"), load(f"{out}/variants_true.jsonl")
print("| task | variant | off: speedup | off: reference ms | on: speedup | on: reference ms | on / off |")
print("|---|---|---|---|---|---|---|")
ratios, refs = [], []
for k in sorted(a):
    x, y = a[k], b.get(k, ("missing", None, None))
    fmt = lambda t: f"{t[1]:.3f}x" if t[1] else t[0]
    r = y[1] / x[1] if x[1] and y[1] else None
    if r:
        ratios.append(r)
    if x[2] and y[2]:
        refs.append(y[2] / x[2])
    print(f"| {k[0]} | {k[1]} | {fmt(x)} | {x[2] or 0:.3f} | {fmt(y)} | {y[2] or 0:.3f} | {r:.3f} |" if r else
          f"| {k[0]} | {k[1]} | {fmt(x)} | | {fmt(y)} | | |")
print(f"variants: {len(ratios)} measured with both, speedup on/off median {statistics.median(ratios):.3f} "
      f"({min(ratios):.3f}-{max(ratios):.3f}); reference time on/off median {statistics.median(refs):.3f} "
      f"({min(refs):.3f}-{max(refs):.3f}); statuses equal {sum(a[k][0] == b.get(k, ('',))[0] for k in a)} of {len(a)}")
PY
