"""tools/bench/compare_bpe/bench_tokenizers.py: Hugging Face `tokenizers`' side of compare_bpe's
timing, printed in its table format: Tokenizer.from_file (the second call timed), then one encode
of the whole text (add_special_tokens=False) cold, then the median of REPS more, then the median of REPS passes over
the text cut into pieces of whole lines of at most 8 KiB; and whether the ids equal the ones
crucible wrote to IDS_JSON.

usage: bench_tokenizers.py TOKENIZER_DIR TEXT_FILE REPS IDS_JSON
"""
import json
import os
import sys
import time

from tokenizers import Tokenizer


def chunks_of(text):
    """compare_bpe's cut: whole lines, at most 8 KiB of UTF-8 each (a longer line alone)."""
    out, cur, cur_len = [], [], 0
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    for line in lines:
        n = len(line.encode("utf-8"))
        if cur and cur_len + n > 8192:
            out.append("".join(cur))
            cur, cur_len = [], 0
        cur.append(line)
        cur_len += n
    if cur:
        out.append("".join(cur))
    return out


def main():
    directory, text_file, reps, ids_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with open(text_file, encoding="utf-8", newline="") as f:
        text = f.read()
    path = os.path.join(directory, "tokenizer.json")
    Tokenizer.from_file(path)  # as compare_bpe does, the second load is timed
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(path)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special_tokens=False).ids
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        warm.append(time.perf_counter() - t0)
    warm.sort()
    chunks = chunks_of(text)
    chunked = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for c in chunks:
            tok.encode(c, add_special_tokens=False)
        chunked.append(time.perf_counter() - t0)
    chunked.sort()
    with open(ids_file, encoding="utf-8") as f:
        same = json.load(f) == ids
    print("%-28s %-12s %9.1f %11.1f %11.1f %11.1f %9d %s" % (
        os.path.basename(os.path.normpath(directory)), "hf-tokenizers", 1e3 * load, 1e3 * cold,
        1e3 * warm[len(warm) // 2], 1e3 * chunked[len(chunked) // 2], len(ids), "yes" if same else "NO"))


if __name__ == "__main__":
    main()
