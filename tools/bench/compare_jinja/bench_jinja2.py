"""tools/bench/compare_jinja/bench_jinja2.py: jinja2's side of compare_jinja's timing. Compiles and
renders the same templates and chats the way transformers does (its own compiled environment,
chat_template_utils._cached_compile_jinja_template, then render with messages, tools, documents,
add_generation_prompt and the special tokens), and prints median microseconds in compare_jinja's
table format. The row jinja2+tf times transformers' whole render_jinja_template call (its template
cache hit, so no parse), which adds its conversions of the messages.

usage: bench_jinja2.py BENCH_IN.json REPS   (BENCH_IN is written by compare_jinja)
"""
import datetime as _dt
import json
import sys
import time

from transformers.utils import chat_template_utils as ctu


def median_us(reps, f):
    f()
    s = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        s.append(time.perf_counter() - t0)
    s.sort()
    return 1e6 * s[len(s) // 2]


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    reps = int(sys.argv[2])
    for case in cases:
        ts = case["now"]

        class fixed_datetime(_dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return _dt.datetime.fromtimestamp(ts, tz)

        ctu.datetime = fixed_datetime
        templ, msgs, special = case["template"], case["messages"], case["special"]
        parse = median_us(reps, lambda: ctu._cached_compile_jinja_template(templ))
        compiled = ctu._compile_jinja_template(templ)
        out = []

        def render():
            out.append(compiled.render(messages=msgs, tools=None, documents=None, add_generation_prompt=True, **special))

        render_us = median_us(reps, render)

        def full():
            ctu.render_jinja_template(conversations=[msgs], chat_template=templ, add_generation_prompt=True, **special)

        full_us = median_us(reps, full)
        print("%-16s %-9s %10.1f %10.1f %12d" % (case["label"], "jinja2", parse, render_us, len(out[-1].encode("utf-8"))))
        print("%-16s %-9s %10s %10.1f %12s" % (case["label"], "jinja2+tf", "-", full_us, "-"))


if __name__ == "__main__":
    main()
