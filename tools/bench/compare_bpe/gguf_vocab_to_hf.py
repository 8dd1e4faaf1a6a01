"""tools/bench/compare_bpe/gguf_vocab_to_hf.py: writes the real GPT-2 tokenizer as Hugging Face's
tokenizer.json. It comes from llama.cpp's models/ggml-vocab-gpt-2.gguf (tokens, merges and token
types, as llama.cpp's converter took them from openai-community/gpt2) and has the GPT-2 layout:
ByteLevel pre-tokenizer and decoder, <|endoftext|> as a special added token, merges as "a b"
strings. No network is needed. The file is checked against the ids that `tokenizers` gave
upstream, which are llama.cpp's ggml-vocab-gpt-2.gguf.inp/.out test files: every string must give
the same ids.

usage: PYTHONPATH=LLAMA_CPP/gguf-py gguf_vocab_to_hf.py VOCAB.gguf OUT_DIR
"""
import json
import os
import sys

import gguf
from tokenizers import Tokenizer


def field(reader, key):
    return reader.fields[key].contents()


def main():
    path, out_dir = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(path)
    assert field(r, "tokenizer.ggml.model") == "gpt2" and field(r, "tokenizer.ggml.pre") == "gpt-2", "not GPT-2"
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    control = [i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL]
    data = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": True, "special": True} for i in control],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": list(merges)},
    }
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "tokenizer.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    # The upstream test strings and ids.
    tok = Tokenizer.from_file(out)
    with open(path + ".inp", encoding="utf-8") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")
    with open(path + ".out", encoding="utf-8") as f:
        want = [[int(x) for x in line.split()] for line in f.read().split("\n")]
    texts, want = texts[: len(want)], want[: len(texts)]
    bad = [t for t, w in zip(texts, want) if tok.encode(t, add_special_tokens=False).ids != w]
    print(f"{out}: {len(tokens)} tokens, {len(merges)} merges, {len(control)} special; "
          f"{len(texts) - len(bad)}/{len(texts)} upstream test strings give the upstream ids")
    if bad:
        sys.exit("mismatch on " + repr(bad[:3]))


if __name__ == "__main__":
    main()
