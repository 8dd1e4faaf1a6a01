#!/usr/bin/env python3
"""Generates text/unicode_tables.cpp: the Unicode data the tokenizer needs.

    .venv/bin/python tools/gen_unicode_tables.py [--out text/unicode_tables.cpp] [--no-oracle]

What the tokenizer matches and where the data comes from:
  * \\p{L}, \\p{N}, \\s of the pre-tokenizer patterns: general categories L* and N*, and
    White_Space (Zs, Zl, Zp, U+0009..U+000D, U+0085), from Python's `unicodedata`.
  * \w of Rust's `regex` crate (single_word added tokens): Alphabetic, marks, Nd, Pc and
    Join_Control, i.e. categories L*, M*, Nd, Nl, Pc, U+200C, U+200D and the Other_Alphabetic
    symbols (circled and squared Latin letters).
  * NFC: canonical combining classes, full canonical decompositions and the primary
    composites (compositions minus exclusions), from `unicodedata`.

Hugging Face `tokenizers` matches its patterns with Oniguruma, whose Unicode version is newer
than the `unicodedata` of older Pythons (Python 3.11 has Unicode 14.0; tokenizers 0.23 uses
Oniguruma's Unicode 16.0 tables). When `tokenizers` can be imported (the default; --no-oracle
turns it off), the script asks Oniguruma through it which code points it puts in \\p{L}, \\p{N}
and \\s, checks that it agrees with `unicodedata` on every code point `unicodedata` knows, and
adds the letters and numbers assigned since (code points `unicodedata` calls unassigned). Any
disagreement on an assigned code point stops the script. NFC data has no such supplement: the
normalization of characters assigned after Python's Unicode version may differ from
tokenizers' (compositions within the scripts added in Unicode 15 and 16).
"""
import argparse
import sys
import unicodedata

MAX_CP = 0x110000


def ranges(codepoints):
    """Sorted code points -> list of (first, last) runs."""
    out = []
    for cp in sorted(codepoints):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def scalar_values():
    return [cp for cp in range(MAX_CP) if not 0xD800 <= cp <= 0xDFFF]


# Other_Alphabetic code points outside L*, M* and Nl (PropList.txt; unchanged since Unicode 6).
OTHER_ALPHABETIC_SYMBOLS = [(0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189)]


def unicodedata_classes(cps):
    letters, numbers, spaces, words = set(), set(), set(), set()
    for cp in cps:
        cat = unicodedata.category(chr(cp))
        if cat[0] == "L":
            letters.add(cp)
        elif cat[0] == "N":
            numbers.add(cp)
        if cat in ("Zs", "Zl", "Zp") or cp in (0x9, 0xA, 0xB, 0xC, 0xD, 0x85):
            spaces.add(cp)
        if cat[0] in "LM" or cat in ("Nd", "Nl", "Pc") or cp in (0x200C, 0x200D):
            words.add(cp)
    for a, b in OTHER_ALPHABETIC_SYMBOLS:
        words.update(range(a, b + 1))
    return letters, numbers, spaces, words


def oniguruma_classes(cps):
    """The code points in \\p{L}, \\p{N} and \\s according to tokenizers' Oniguruma."""
    from tokenizers import Regex, pre_tokenizers

    def members(pattern):
        # Remove the runs the pattern matches; what is left over is the complement.
        split = pre_tokenizers.Split(Regex(pattern + "+"), "removed")
        out = set(cps)
        chunk = 1 << 16
        for start in range(0, len(cps), chunk):
            text = "".join(chr(cp) for cp in cps[start:start + chunk])
            for piece, _ in split.pre_tokenize_str(text):
                out.difference_update(ord(ch) for ch in piece)
        return out

    import tokenizers
    return tokenizers.__version__, members(r"\p{L}"), members(r"\p{N}"), members(r"\s")


def nfc_data(cps):
    ccc = {}
    decomp = {}
    compositions = []
    for cp in cps:
        ch = chr(cp)
        c = unicodedata.combining(ch)
        if c:
            ccc[cp] = c
        if 0xAC00 <= cp <= 0xD7A3:
            continue  # Hangul syllables are algorithmic
        d = unicodedata.normalize("NFD", ch)
        if d != ch:
            decomp[cp] = [ord(x) for x in d]
        raw = unicodedata.decomposition(ch)
        if raw and not raw.startswith("<"):
            parts = [int(x, 16) for x in raw.split()]
            # A primary composite: a canonical pair that NFC recomposes to this character.
            if len(parts) == 2 and unicodedata.normalize("NFC", chr(parts[0]) + chr(parts[1])) == ch:
                compositions.append((parts[0], parts[1], cp))
    compositions.sort()
    return ccc, decomp, compositions


def emit_ranges(out, name, rs):
    out.append(f"const code_range {name}[] = {{")
    line = " "
    for a, b in rs:
        item = f" {{0x{a:X}, 0x{b:X}}},"
        if len(line) + len(item) > 96:
            out.append(line)
            line = " "
        line += item
    out.append(line)
    out.append("};")
    out.append(f"const std::size_t {name}_count = {len(rs)};")
    out.append("")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="text/unicode_tables.cpp")
    ap.add_argument("--no-oracle", action="store_true",
                    help="do not consult tokenizers' Oniguruma for code points unicodedata lacks")
    args = ap.parse_args()

    cps = scalar_values()
    letters, numbers, spaces, words = unicodedata_classes(cps)
    source = f"Python {sys.version.split()[0]} unicodedata {unicodedata.unidata_version}"
    added_letters = added_numbers = 0
    if not args.no_oracle:
        try:
            version, o_letters, o_numbers, o_spaces = oniguruma_classes(cps)
        except ImportError:
            print("tokenizers not importable: tables from unicodedata only", file=sys.stderr)
        else:
            assigned = {cp for cp in cps if unicodedata.category(chr(cp)) != "Cn"}
            bad = []
            for name, ours, theirs in (("L", letters, o_letters), ("N", numbers, o_numbers),
                                       ("s", spaces, o_spaces)):
                diff = sorted((ours ^ theirs) & assigned)
                bad += [f"{name}: U+{cp:04X}" for cp in diff]
            if bad:
                sys.exit("unicodedata and Oniguruma disagree on assigned code points: " + ", ".join(bad[:50]))
            new_letters = o_letters - assigned
            new_numbers = o_numbers - assigned
            added_letters, added_numbers = len(new_letters), len(new_numbers)
            letters |= new_letters
            words |= new_letters
            numbers |= new_numbers
            spaces |= o_spaces - assigned
            source += (f"; plus {added_letters} letters and {added_numbers} numbers assigned since, "
                       f"from tokenizers {version}'s Oniguruma")

    ccc, decomp, compositions = nfc_data(cps)

    out = [
        "// text/unicode_tables.cpp: GENERATED by tools/gen_unicode_tables.py; do not edit.",
        f"// Source: {source}.",
        "// Data only (the tokenizer's Unicode category and normalisation tables): its length is the tables'.",
        '#include "text/unicode_tables.hpp"',
        "",
        "namespace crucible::policy::unicode_data {",
        "",
        f'const char* const source = "{source}";',
        "",
    ]
    emit_ranges(out, "letter_ranges", ranges(letters))
    emit_ranges(out, "number_ranges", ranges(numbers))
    emit_ranges(out, "space_ranges", ranges(spaces))
    emit_ranges(out, "word_ranges", ranges(words))

    # Combining classes as runs of equal class.
    runs = []
    for cp in sorted(ccc):
        if runs and runs[-1][1] == cp - 1 and runs[-1][2] == ccc[cp]:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, ccc[cp]])
    out.append("const class_range combining_ranges[] = {")
    line = " "
    for a, b, c in runs:
        item = f" {{0x{a:X}, 0x{b:X}, {c}}},"
        if len(line) + len(item) > 96:
            out.append(line)
            line = " "
        line += item
    out += [line, "};", f"const std::size_t combining_ranges_count = {len(runs)};", ""]

    data = []
    entries = []
    for cp in sorted(decomp):
        entries.append((cp, len(data), len(decomp[cp])))
        data += decomp[cp]
    out.append("const char32_t decomposition_data[] = {")
    for i in range(0, len(data), 10):
        out.append("  " + " ".join(f"0x{x:X}," for x in data[i:i + 10]))
    out.append("};")
    out.append("const decomposition decompositions[] = {")
    for i in range(0, len(entries), 4):
        out.append("  " + " ".join(f"{{0x{cp:X}, {off}, {n}}}," for cp, off, n in entries[i:i + 4]))
    out += ["};", f"const std::size_t decompositions_count = {len(entries)};", ""]

    out.append("const composition compositions[] = {")
    for i in range(0, len(compositions), 4):
        out.append("  " + " ".join(f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for a, b, c in compositions[i:i + 4]))
    out += ["};", f"const std::size_t compositions_count = {len(compositions)};", ""]
    out.append("} // namespace crucible::policy::unicode_data")

    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    print(f"{args.out}: {source}; {len(ranges(letters))} letter ranges, {len(decomp)} decompositions, "
          f"{len(compositions)} compositions")


if __name__ == "__main__":
    main()
