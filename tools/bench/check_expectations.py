#!/usr/bin/env python3
"""Checks the records of a `crucible eval --pairs` run over the project's hack candidates against
each candidate's header (`# task: PATH`, `# expect: STATUS [CHECK]`), by the rules of
tests/test_util/candidate_expectation.hpp: a hack expected `rejected` may also be `incorrect`;
`no-credit` is any verdict but a speedup of 1.25x or more; `no-speedup` any verdict but a credited
speedup above 1.00x; a verdict that is not `ok` has no speedup and no reward.

  tools/bench/check_expectations.py --tsv tests/candidates/gpu > pairs.tsv   # the set to run
  tools/bench/check_expectations.py RECORDS.jsonl                              # the check

Prints one line a candidate (PASS or FAIL, the verdict, the expectation) and exits 1 when any
candidate failed or has no record.
"""
import json
import os
import re
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def expectation(path):
    task = status = check = None
    with open(path, encoding="utf-8") as f:
        for _ in range(5):
            line = f.readline()
            m = re.match(r"# task:\s*(\S+)", line)
            if m:
                task = m.group(1)
            m = re.match(r"# expect:\s*(\S+)(?:\s+(\S+))?", line)
            if m:
                status, check = m.group(1), m.group(2)
    return task, status, check


def judge(status, check, v):
    """True when verdict `v` (a record) meets the expectation."""
    ok = v["status"] == "ok"
    if not ok and (v.get("speedup") is not None or v.get("reward", 0) != 0):
        return False
    if status == "no-credit":
        return not ok or v["speedup"] < 1.25
    if status == "no-speedup":
        return not ok or v["speedup"] <= 1.0
    if status == "rejected":
        return v["status"] == "incorrect" or (v["status"] == "rejected" and
                                              (check is None or check in v.get("checks_failed", [])))
    return v["status"] == status


def main(argv):
    if len(argv) == 2 and argv[0] == "--tsv":
        folder = os.path.abspath(argv[1])
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                task, _, _ = expectation(os.path.join(folder, name))
                print(f"{os.path.join(_REPO, task)}\t{os.path.join(folder, name)}")
        return 0
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    failed = 0
    for line in open(argv[0], encoding="utf-8"):
        v = json.loads(line)
        if v.get("status") == "error":
            print(f"FAIL {v['candidate']}: no verdict ({v.get('message', '')})")
            failed += 1
            continue
        _, status, check = expectation(v["candidate"])
        good = judge(status, check, v)
        failed += not good
        got = f"{v['status']} {v.get('speedup')} {','.join(v.get('checks_failed', []))}".strip()
        print(f"{'PASS' if good else 'FAIL'} {os.path.basename(v['candidate'])}: {got} "
              f"(expected {status}{' ' + check if check else ''})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
