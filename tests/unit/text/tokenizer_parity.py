#!/usr/bin/env python3
"""Hugging Face side of the tokenizer parity tests (tests/unit/text/test_tokenizer_parity.cpp).

    tokenizer_parity.py corpus OUT_FILE
        writes deterministic multilingual text (many scripts, emoji, combining marks) to train on
    tokenizer_parity.py make KIND CORPUS_LIST OUT_DIR
        trains a tokenizer of KIND (gpt2 | llama3) with `tokenizers` on the files listed in
        CORPUS_LIST (one path a line) and saves OUT_DIR/tokenizer.json
    tokenizer_parity.py train CORPUS_LIST VOCAB
        trains the Qwen2-style tokenizer that crucible's trainer makes and prints its vocabulary
        and merges as JSON
    tokenizer_parity.py transformers DIR
        loads DIR with transformers.AutoTokenizer and prints its special-token ids, a rendered
        chat template and the ids of that text
    tokenizer_parity.py synthetic OUT_DIR
        writes OUT_DIR/tokenizer.json shaped like Qwen2.5's (151,643 tokens, 151,387 merges as
        "a b" strings, 22 special tokens, indented), with random merges, for load benchmarks
    tokenizer_parity.py cases TOKENIZER_JSON CORPUS_LIST SEED
        generates test strings and prints, as JSON, what `tokenizers` makes of them: ids with and
        without special tokens, decoded text with and without special tokens, and decoded text of
        random id sequences

Only `tokenizers` is imported (fast), except by `transformers`; no network.
"""
import json
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Text in many scripts, with the cases tokenizers get wrong most often.
SAMPLES = [
    "Grüße aus Köln, façade, naïve café, Ærøskøbing, Łódź, İstanbul, ß ẞ",
    "Τὸ πρῶτον ἀγαθόν· ἡ ψυχή. Ελληνικά κείμενα",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "中文分词测试：你好，世界。深度学习与并行计算。",
    "日本語のテキスト、カタカナとひらがな。東京都",
    "한국어 텍스트와 한글 자모: 한 글 (conjoining jamo)",
    "العربية: مَرْحَبًا بِالْعَالَم، ١٢٣٤٥٦٧٨٩٠",
    "עברית: שָׁלוֹם עוֹלָם",
    "हिन्दी: नमस्ते दुनिया, क़ ख़ ग़ ज़ ड़ ढ़ फ़ य़",
    "ไทย: สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    "Tiếng Việt: Xin chào thế giới, người, được, ở đâu",
    "emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 1️⃣ ❤️ 🤖🧠🔥",
    "math: ∀x∈ℝ, ∑ᵢ xᵢ² ≤ ∞; 𝔸𝕓𝒞 𝟙𝟚𝟛; ½ ¾ ⅔; Ⅻ ⅻ; x²+y³",
    "fullwidth: ＡＢＣ１２３！？　ｈｅｌｌｏ",
    "decomposed: e\u0301 a\u0308 o\u0302\u0323 u\u031b\u0300 n\u0303 A\u030a \u1100\u1161\u11a8",
    "marks out of order: a\u0323\u0302 a\u0302\u0323 q\u0307\u0323 \u0958 \u2126 \u212b \u00c5",
    "contractions: it's IT'S we're THEY'RE I've I'M you'll YOU'LL he'd HE'D it'ſ it'ſt",
    "new letters (Unicode 15/16): \U0001e030\U0001e031 \U00011f04\U00011f05 \u1c89\u1c8a \U00010d50 \U0002ebf0",
    "digits: 0123456789 ٠١٢٣ ०१२३ ๐๑๒ ①②③ ¹²³ 𝟘𝟙",
    "spaces:\u00a0nbsp\u2009thin\u3000ideographic\u200bzwsp\u2028ls\u2029ps\x85nel",
    "CJK ext B: 𠀀𠀁𪚥 and compatibility: 豈 ﬀ ﬁ ﬃ ǅ ǈ",
    "Ge'ez ሰላም ዓለም, Armenian Բարեւ, Georgian გამარჯობა, Tamil வணக்கம், Cherokee ᏣᎳᎩ",
]

WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "\u3000", "\u00a0",
              "\x0b", "\x0c", "\x85", "\u2028", "\u2009", "\u200b", "\x1c", "    "]
WORDS = ["x", "def", "(", ")", "{", "}", "1", "12345", "é", "中", "'s", "'S", "'ll", "return", "::", "->",
         "//", "#", "a_b", "ü", "😀", "!", "?", "=", "==", "_", "0x1F", "3.14", "𝔸", "\u0301"]
RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
          (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x2000, 0x206F),
          (0x2100, 0x22FF), (0x3000, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xFF00, 0xFFEF),
          (0x1F300, 0x1F6FF), (0x1D400, 0x1D7FF), (0x10000, 0x1007F), (0x1E000, 0x1E0FF), (0x20000, 0x2007F)]


def read_corpus(corpus_list):
    with open(corpus_list, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def write_corpus(out):
    rng = random.Random(7)
    lines = []
    for _ in range(3000):
        parts = [rng.choice(SAMPLES) for _ in range(rng.randint(1, 3))]
        lines.append(rng.choice(["", "  ", "\t", "# ", "// "]) + rng.choice([" ", "\n", ", "]).join(parts))
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def train(files, vocab, pre_tokenizer, normalizer, specials):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files, trainer)
    return tok


def make(kind, corpus_list, out_dir):
    files = read_corpus(corpus_list)
    if kind == "gpt2":
        # GPT-2: ByteLevel with its own regex and a prefix space; added tokens of every flavour.
        tok = train(files, 2500, pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), None,
                    ["<|endoftext|>"])
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
        tok.add_tokens([AddedToken("[HOLE]", rstrip=True, normalized=False),
                        AddedToken("crucible", single_word=True),
                        AddedToken("kernel_opt")])
        data = json.loads(tok.to_str())
    elif kind == "llama3":
        # Llama 3: Split with the cl100k pattern, ignore_merges, a BOS template, legacy merges.
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
        pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated"),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok = train(files, 2500, pre, None, specials)
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                          special_tokens=[("<|begin_of_text|>", 0)])])
        data = json.loads(tok.to_str())
        model = data["model"]
        model["ignore_merges"] = True
        # Whole words in the vocabulary that no merge builds: only ignore_merges finds them.
        for extra in ["ĠXYZZYplugh", "qqqqqqqq", "ĠÃ©Ã©"]:
            model["vocab"][extra] = len(model["vocab"])
        model["merges"] = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
        # The added tokens keep their ids; the extra vocabulary comes after them.
        top = max(model["vocab"].values())
        for t in data["added_tokens"]:
            assert t["id"] <= top
    else:
        sys.exit("unknown kind " + kind)
    import os
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    # Check that the edited file still loads.
    Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))


def train_reference(corpus_list, vocab):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), "isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train(read_corpus(corpus_list), vocab, pre, normalizers.NFC(), CHATML)
    data = json.loads(tok.to_str())
    vocab_by_id = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, list) else m.split(" ") for m in data["model"]["merges"]]
    print(json.dumps({"vocab": [k for k, _ in vocab_by_id], "merges": merges}, ensure_ascii=False))


def random_text(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def generate(rng, corpus_files, added):
    texts = ["", " ", "\n", "a", "'", "'s", " 's", "\u0301", "\r\n\r\n", "  \n  \n  x", "x  ", "x\n\n", "𝔸", "é" * 3]
    corpus = []
    for path in corpus_files:
        with open(path, encoding="utf-8") as f:
            corpus.append(f.read())
    # Slices of the corpus: code, prose, and the multilingual text.
    for _ in range(500):
        doc = rng.choice(corpus)
        start = rng.randrange(max(1, len(doc)))
        texts.append(doc[start:start + rng.randint(1, 400)])
    # Whitespace runs mixed with short words.
    for _ in range(250):
        texts.append("".join(rng.choice(WHITESPACE) if rng.random() < 0.5 else rng.choice(WORDS)
                             for _ in range(rng.randint(1, 25))))
    # Non-ASCII: samples cut and mixed.
    for _ in range(250):
        parts = []
        for _ in range(rng.randint(1, 4)):
            s = rng.choice(SAMPLES)
            a = rng.randrange(len(s))
            parts.append(s[a:a + rng.randint(1, 60)])
        texts.append(rng.choice(["", " ", "\n", "\t"]).join(parts))
    # Added and special tokens inside text, whole, doubled, cut short, next to spaces.
    names = [t for t in added] or CHATML
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            name = rng.choice(names)
            if r < 0.5:
                parts.append(name)
            elif r < 0.6:
                parts.append(name[:rng.randint(1, len(name) - 1)] if len(name) > 1 else name)
            else:
                parts.append(rng.choice(WORDS + WHITESPACE + ["user\n", "assistant\n", "x", " kernel_opt ", "crucible"]))
        texts.append("".join(parts))
    texts.append("<|im_start|>system\nYou write CUDA kernels.<|im_end|>\n<|im_start|>user\nFuse relu(x)*2.<|im_end|>\n"
                 "<|im_start|>assistant\n")
    # Random code points from many blocks.
    for _ in range(120):
        texts.append(random_text(rng, rng.randint(1, 40)))
    # Long words and runs (the heap path of BPE, long whitespace).
    texts += [" " * 3000, "\n" * 500 + "x", "a" * 2000, "ab" * 700, "1234567890" * 100, "é" * 600,
              "=" * 1000 + "\n", "\t " * 400, "😀" * 300, "中文" * 400]
    return texts


def cases(tokenizer_json, corpus_list, seed):
    tok = Tokenizer.from_file(tokenizer_json)
    rng = random.Random(int(seed))
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    texts = generate(rng, read_corpus(corpus_list), added)
    out = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "cases": [], "decode_cases": []}
    for text in texts:
        ids = tok.encode(text).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        out["cases"].append({"text": text, "ids": ids, "ids_plain": plain,
                             "decoded": tok.decode(ids, skip_special_tokens=False),
                             "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    # Random id sequences: split UTF-8 sequences, specials, out-of-range ids.
    n = tok.get_vocab_size(with_added_tokens=True)
    for _ in range(300):
        ids = [rng.randrange(n + 5) for _ in range(rng.randint(1, 12))]
        out["decode_cases"].append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                                    "text_skip": tok.decode(ids, skip_special_tokens=True)})
    print(json.dumps(out, ensure_ascii=False))


def transformers_check(directory):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(directory)
    messages = [{"role": "system", "content": "You write fast CUDA kernels."},
                {"role": "user", "content": "Fuse relu(x) * 2 into one kernel.\n\n```python\nx = torch.relu(x) * 2\n```"}]
    chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(chat)["input_ids"]
    print(json.dumps({"class": type(tok).__name__, "eos_id": tok.eos_token_id, "pad_id": tok.pad_token_id,
                      "bos_id": tok.bos_token_id, "vocab_size": len(tok), "chat": chat, "ids": ids,
                      "decoded": tok.decode(ids)}, ensure_ascii=False))


def synthetic(out_dir):
    import os
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = sorted(alphabet)
    seen, merges = set(vocab), []
    rng = random.Random(1)
    while len(vocab) < 151643:
        a = vocab[rng.randrange(min(len(vocab), 20000))]
        b = vocab[rng.randrange(min(len(vocab), 20000))]
        if len(a) + len(b) > 24 or a + b in seen:
            continue
        seen.add(a + b)
        merges.append(a + " " + b)
        vocab.append(a + b)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    data = {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 151643 + i, "content": f"<|special_{i}|>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True} for i in range(22)],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2}, "behavior": "Isolated", "invert": False}, byte_level]},
            "post_processor": byte_level, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                      "vocab": {v: i for i, v in enumerate(vocab)}, "merges": merges}}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "corpus" and len(sys.argv) == 3:
        write_corpus(sys.argv[2])
    elif cmd == "make" and len(sys.argv) == 5:
        make(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "train" and len(sys.argv) == 4:
        train_reference(sys.argv[2], int(sys.argv[3]))
    elif cmd == "transformers" and len(sys.argv) == 3:
        transformers_check(sys.argv[2])
    elif cmd == "synthetic" and len(sys.argv) == 3:
        synthetic(sys.argv[2])
    elif cmd == "cases" and len(sys.argv) == 5:
        cases(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
