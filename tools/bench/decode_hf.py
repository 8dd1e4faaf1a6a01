#!/usr/bin/env python3
"""Decode throughput of Hugging Face transformers' `generate` on a model directory: the
reference side of tools/bench/decode_compare.py, measured the way bench_decode measures ours.

Each batch size B gets B random prompts of exactly --prompt tokens (uniform ids, fixed seed) and
generates exactly --new tokens per row: greedy (do_sample=False), no eos (generation config's
eos_token_id set to None). Prefill time is a generate() of one new token; decode time is that of
--new tokens minus it, so decode tokens/s counts B x (new - 1) tokens, as bench_decode does.
One JSON object per line on stdout.

  python3 tools/bench/decode_hf.py --model DIR --device cuda:0 --batches 1,16,64 --prompt 512 --new 512
"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "decode throughput, transformers' side\n"
                                        "(decode_compare.py runs it). No environment variables.")
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=512)
    ap.add_argument("--dtype", default="", help="bfloat16 (default on CUDA) or float32 (default on the CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cache", default="dynamic", choices=["dynamic", "static"],
                    help="transformers' KV cache: dynamic (generate's default) or static")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype_name = args.dtype or ("bfloat16" if cuda else "float32")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    gc = model.generation_config
    gc.eos_token_id = None  # every row generates exactly --new tokens
    gc.pad_token_id = 0
    gc.do_sample = False
    gc.temperature = gc.top_p = gc.top_k = None
    vocab = model.config.vocab_size

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def generate(ids, new):
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, cache_implementation=args.cache)
        sync()
        return time.perf_counter() - t0, out

    print(json.dumps({"kind": "hf_setup", "transformers": transformers.__version__, "torch": torch.__version__,
                      "device": args.device, "dtype": dtype_name, "cache": args.cache,
                      "attention": getattr(model.config, "_attn_implementation", None)}), flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    for batch in [int(b) for b in args.batches.split(",")]:
        ids = torch.randint(0, vocab, (batch, args.prompt), generator=gen).to(device)
        for _ in range(args.warmup):
            generate(ids, args.new)
        prefill = min(generate(ids, 1)[0] for _ in range(3))
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        total = None
        for _ in range(args.repeats):
            t, out = generate(ids, args.new)
            if out.shape != (batch, args.prompt + args.new):
                sys.exit(f"decode_hf: batch {batch}: output shape {tuple(out.shape)}, expected "
                         f"{(batch, args.prompt + args.new)}")
            total = t if total is None else min(total, t)
        decode = max(total - prefill, 1e-9)
        print(json.dumps({
            "kind": "hf_decode", "batch": batch, "prompt": args.prompt, "new": args.new,
            "prefill_s": prefill, "decode_s": decode, "total_s": total,
            "decode_tokens_per_s": batch * (args.new - 1) / decode,
            "total_tokens_per_s": batch * args.new / total,
            "peak_bytes": torch.cuda.max_memory_allocated(device) - base if cuda else None,
        }), flush=True)


if __name__ == "__main__":
    main()
