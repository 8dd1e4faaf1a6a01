"""tools/bench/compare_bpe/hf_to_gguf_vocab.py: converts a byte-level BPE tokenizer.json into the
vocabulary-only GGUF file that llama.cpp's tokenizer reads. It writes the same keys that llama.cpp's
convert_hf_to_gguf.py writes for a BPE vocabulary (tokenizer.ggml.model "gpt2", the pre-tokenizer
name, tokens, token types, merges, BOS/EOS ids, add_bos_token). It takes the architecture fields
from TEMPLATE.gguf, llama.cpp's models/ggml-vocab-gpt-2.gguf, because a vocab_only load still
reads them.

Pre-tokenizer names: the Qwen2 regex gives "qwen2", the Llama 3 regex gives "llama-bpe" (which sets
ignore_merges in llama.cpp), and a ByteLevel pre-tokenizer with its own regex gives "gpt-2".
Special added tokens become CONTROL tokens and other added tokens USER_DEFINED. Those are the
token types convert_hf_to_gguf.py gives them.

usage: PYTHONPATH=LLAMA_CPP/gguf-py hf_to_gguf_vocab.py TOKENIZER.json TEMPLATE.gguf OUT.gguf
"""
import json
import sys

import gguf

QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def pre_name(pre):
    if pre["type"] == "ByteLevel":
        return "gpt-2"
    if pre["type"] == "Sequence":
        for p in pre["pretokenizers"]:
            if p["type"] == "Split":
                regex = p["pattern"]["Regex"]
                if regex == QWEN2:
                    return "qwen2"
                if regex == LLAMA3:
                    return "llama-bpe"
    sys.exit("no llama.cpp pre-tokenizer for " + json.dumps(pre)[:200])


def main():
    src, template, out = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(src, encoding="utf-8") as f:
        data = json.load(f)
    model = data["model"]
    n = 1 + max(list(model["vocab"].values()) + [t["id"] for t in data["added_tokens"]])
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for t, i in model["vocab"].items():
        tokens[i], types[i] = t, gguf.TokenType.NORMAL
    for t in data["added_tokens"]:
        tokens[t["id"]] = t["content"]
        types[t["id"]] = gguf.TokenType.CONTROL if t["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]

    tmpl = gguf.GGUFReader(template)
    arch = tmpl.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(out, arch)
    for key, field in tmpl.fields.items():
        if key.startswith(arch + ".") and field.types:
            kind = field.types[0]
            if kind == gguf.GGUFValueType.UINT32:
                w.add_uint32(key, field.contents())
            elif kind == gguf.GGUFValueType.FLOAT32:
                w.add_float32(key, field.contents())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_name(data["pre_tokenizer"]))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    # BOS: the first special token of a TemplateProcessing post-processor, if any.
    bos = None
    procs = [data["post_processor"]] if data.get("post_processor") else []
    if procs and procs[0]["type"] == "Sequence":
        procs = procs[0]["processors"]
    for p in procs:
        if p["type"] == "TemplateProcessing" and "SpecialToken" in p["single"][0]:
            bos = p["special_tokens"][p["single"][0]["SpecialToken"]["id"]]["ids"][0]
    specials = [t for t in data["added_tokens"] if t["special"]]
    if bos is not None:
        w.add_bos_token_id(bos)
    w.add_add_bos_token(bos is not None)
    if specials:
        w.add_eos_token_id(specials[0]["id"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out}: {n} tokens, {len(merges)} merges, pre {pre_name(data['pre_tokenizer'])}, bos {bos}")


if __name__ == "__main__":
    main()
