"""tests/unit/jinja/jinja_parity.py: renders Jinja templates the way transformers'
apply_chat_template does (its own compiled environment: ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception and strftime_now), so the
C++ interpreter in jinja/ can be compared with it byte for byte.

usage: jinja_parity.py CASES.json OUT.json
CASES: a list of {"template": str, "now": epoch seconds, and either "context_json": str (a JSON
object: the variables) or "chat": {"messages": [...], "special": {...}, "add_generation_prompt": bool}}.
OUT: a list of {"ok": true, "text": str} or {"ok": false, "error": str}, one per case.
"""
import datetime as _dt
import json
import sys

from transformers.utils import chat_template_utils as ctu


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    results = []
    for case in cases:
        ts = case.get("now", 0)

        class fixed_datetime(_dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return _dt.datetime.fromtimestamp(ts, tz)

        # strftime_now reads the module's `datetime` when called.
        ctu.datetime = fixed_datetime
        try:
            if "chat" in case:
                chat = case["chat"]
                rendered, _ = ctu.render_jinja_template(
                    conversations=[chat["messages"]],
                    chat_template=case["template"],
                    add_generation_prompt=chat["add_generation_prompt"],
                    **chat["special"],
                )
                text = rendered[0]
            else:
                template = ctu._compile_jinja_template(case["template"])
                text = template.render(**json.loads(case["context_json"]))
            results.append({"ok": True, "text": text})
        except Exception as e:  # every failure is data for the comparison
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
