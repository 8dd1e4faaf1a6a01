"""Greedy continuation of a prompt by Hugging Face transformers, for test_cli: loads a model
directory written by `crucible init-model` with AutoModelForCausalLM and AutoTokenizer (float32 on
the CPU) and prints {"prompt_token_ids": [...], "token_ids": [...], "logprobs": [...]} (the new
tokens only, each with log softmax(logits) of the token).

  python hf_generate.py MODEL_DIR PROMPT MAX_NEW_TOKENS
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    model_dir, prompt, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             do_sample=False, pad_token_id=model.config.eos_token_id, output_logits=True,
                             return_dict_in_generate=True)
    tokens = out.sequences[0, ids.shape[1]:]
    logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, tokens)]
    print(json.dumps({"prompt_token_ids": ids[0].tolist(), "token_ids": tokens.tolist(), "logprobs": logprobs}))


if __name__ == "__main__":
    main()
