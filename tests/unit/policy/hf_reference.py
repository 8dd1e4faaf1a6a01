#!/usr/bin/env python3
"""Hugging Face transformers as the reference for crucible's model (tests/unit/policy/test_model.cpp).

  hf_reference.py make OUT_DIR
      Builds tiny random Llama and Qwen2 models (seeded), saves each with save_pretrained into
      OUT_DIR/<variant>/ and writes OUT_DIR/<variant>/reference.safetensors: logits of a fixed
      input and greedy generations of 64 tokens for prompts of different lengths. The untied
      qwen2_yarn is also saved in shards of at most 20 kB, as transformers shards a published
      checkpoint (model-0000K-of-0000N.safetensors and model.safetensors.index.json), into
      OUT_DIR/qwen2_yarn_sharded/.

  hf_reference.py check MODEL_DIR...
      Loads each crucible-written MODEL_DIR with transformers (no missing or unexpected keys
      allowed), runs MODEL_DIR/crucible_inputs.safetensors' input_ids and compares with its
      logits. Where MODEL_DIR/crucible_expect.json exists, also loads the tokenizer and the
      generation config the way a published checkpoint's are loaded, and compares the chat
      template's rendering, its ids and the eos ids with what crucible expects. Prints one line
      per directory; exits 1 if any differs (logits by more than 1e-4).
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

TOLERANCE = 1e-4
NEW_TOKENS = 64
PROMPT_LENGTHS = (5, 11, 3)
LOGITS_SHAPE = (2, 64)

COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
              # Wider than the usual 0.02 so that random models have clear argmaxes: greedy
              # parity should not hinge on near-ties decided by rounding.
              initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)

VARIANTS = {
    # Qwen2 always has q/k/v biases; tied embeddings as in the small Qwen2.5 models.
    "qwen2_tied": ("qwen2", dict(tie_word_embeddings=True, max_position_embeddings=256,
                                 rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    "qwen2_yarn": ("qwen2", dict(tie_word_embeddings=False, max_position_embeddings=256,
                                 rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                      original_max_position_embeddings=64))),
    "llama_llama3": ("llama", dict(tie_word_embeddings=False, max_position_embeddings=256,
                                   rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                                        low_freq_factor=1.0, high_freq_factor=4.0,
                                                        original_max_position_embeddings=32))),
    "llama_bias_linear": ("llama", dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                                        max_position_embeddings=256,
                                        rope_parameters=dict(rope_type="linear", rope_theta=500.0, factor=2.0))),
    # max_position_embeddings below the sequences' lengths, so the NTK rescaling takes effect.
    "llama_dynamic": ("llama", dict(tie_word_embeddings=True, max_position_embeddings=48,
                                    rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))),
}

# Variants also saved in shards (of this max_shard_size), to be loaded as transformers writes them.
SHARDED = {"qwen2_yarn": "20KB"}


def build(family, extra, seed):
    torch.manual_seed(seed)
    if family == "qwen2":
        config = transformers.Qwen2Config(**COMMON, **extra)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**COMMON, **extra)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        # Random norms and biases too, so that loading them wrongly cannot go unnoticed.
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def make(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for seed, (variant, (family, extra)) in enumerate(sorted(VARIANTS.items())):
        model = build(family, extra, 1000 + seed)
        path = os.path.join(out_dir, variant)
        model.save_pretrained(path, safe_serialization=True)
        if variant in SHARDED:
            model.save_pretrained(path + "_sharded", safe_serialization=True, max_shard_size=SHARDED[variant])
        gen = torch.Generator().manual_seed(seed)
        tensors = {}
        ids = torch.randint(0, COMMON["vocab_size"], LOGITS_SHAPE, generator=gen)
        with torch.no_grad():
            tensors["logits_input_ids"] = ids
            tensors["logits"] = model(input_ids=ids).logits.float().contiguous()
            for i, n in enumerate(PROMPT_LENGTHS):
                prompt = torch.randint(0, COMMON["vocab_size"], (1, n), generator=gen)
                # A fresh model per generation: dynamic RoPE keeps state between calls.
                fresh = build(family, extra, 1000 + seed)
                out = fresh.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                     max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, eos_token_id=None,
                                     pad_token_id=0)
                tensors[f"prompt_{i}"] = prompt[0].contiguous()
                tensors[f"greedy_{i}"] = out[0, n:].contiguous()
        save_file(tensors, os.path.join(path, "reference.safetensors"))
    with open(os.path.join(out_dir, "variants.json"), "w") as f:
        json.dump(sorted(VARIANTS), f)


def check(dirs):
    worst = 0.0
    ok = True
    for path in dirs:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, output_loading_info=True)
        problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        inputs = load_file(os.path.join(path, "crucible_inputs.safetensors"))
        with torch.no_grad():
            logits = model.eval()(input_ids=inputs["input_ids"]).logits.float()
        diff = (logits - inputs["logits"]).abs().max().item()
        worst = max(worst, diff)
        expect_path = os.path.join(path, "crucible_expect.json")
        if os.path.exists(expect_path):
            problems.update(check_chat_files(path, expect_path))
        good = not problems and diff <= TOLERANCE
        ok = ok and good
        print(f"{path}: max_abs_diff={diff:.3g} {'ok' if good else 'FAIL'} {problems if problems else ''}")
    print(f"worst max_abs_diff={worst:.3g}")
    return 0 if ok else 1


def check_chat_files(path, expect_path):
    """The tokenizer and generation files of MODEL_DIR against crucible_expect.json."""
    with open(expect_path) as f:
        expect = json.load(f)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    eos = transformers.GenerationConfig.from_pretrained(path).eos_token_id
    found = {"chat_text": text, "chat_ids": ids, "eos_token_id": eos, "eos_token": tokenizer.eos_token}
    return {key: (found[key], expect[key]) for key in expect if found[key] != expect[key]}


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2])
        return 0
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        return check(sys.argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    sys.exit(main())
