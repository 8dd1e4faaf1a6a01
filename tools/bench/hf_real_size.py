#!/usr/bin/env python3
"""Hugging Face transformers doing the work of one crucible RL step on a real-size policy, on one
device: the transformers side of issue 43's side-by-side (docs/PERFORMANCE.md). The model is a
`crucible init-model` directory (qwen2.5-coder-1.5b-instruct or -7b-instruct: published shapes,
random weights). Prints one JSON object (and writes it to --out).

Figures (--figures, comma-separated):
  generate    model.generate of one random prompt of --prompt-tokens ids repeated --batch times,
              sampling at temperature 1 (top-k, top-p and repetition penalty off), exactly
              --new-tokens per row (min_new_tokens = max_new_tokens, no eos), bf16, KV cache on, SDPA
              attention. tokens_per_s = batch x new / wall seconds of the whole call (prefill
              included); prefill_s is a generate() of one new token; decode_tokens_per_s counts
              batch x (new - 1) tokens over the rest. Peak memory: torch.cuda.max_memory_allocated
              and max_memory_reserved since the figure began (the weights included).
  train       one GRPO learner update: --train-sequences sequences of prompt + new tokens (random
              ids; on-policy, so the clipped ratio is 1 and old log-probs are the detached current
              ones), micro-batches of one sequence, gradients summed over them, then clipping to
              norm 1 and AdamW. Weights are bf16; the optimiser works on float32 master copies with
              float32 AdamW state and float32 gradients accumulated after each micro-batch (the
              scheme crucible's learner uses; a float32 parameter, as PEFT's autocast adapters are,
              is its own master), with torch.optim.AdamW(fused=True) on CUDA. The loss needs the
              log-probs of the completion tokens only: the final hidden states of the completion
              positions are projected to the vocabulary --logprob-chunk tokens at a time, each
              chunk's log-softmax under torch.utils.checkpoint (its [chunk, vocab] logits are made
              again in the backward), so no [tokens, vocab] tensor exists. --grad-checkpointing:
              model.gradient_checkpointing_enable() (activation_checkpointing_enable() where
              transformers has it; non-reentrant, every decoder layer). --lora: rank 16, alpha 32 on
              q/k/v/o_proj, with PEFT when it is installed, else adapters written here the way
              crucible's are (A uniform in +-1/sqrt(in), B zero, scale alpha/rank, in the weights'
              dtype); the base is frozen. tokens = sequences x (prompt + new - 1), the tokens an
              update trains on; MFU = 6 x parameters x tokens/s / the bf16 matmul rate (the best of
              5 rounds of 20 torch.mm of 8192^3 on the device), as tools/bench/bench_learner.cpp
              reports it (under LoRA the same formula, though frozen weights get no gradient GEMM).
  checkpoint  save_pretrained (safetensors, max_shard_size 5GB) of the bf16 model into
              --checkpoint-dir, then from_pretrained of it onto the device; seconds and GB/s
              (10^9 bytes of the safetensors files). The read follows the write, so the files come
              from the page cache.
A figure that runs out of device memory records {"error": "out of memory", the peak} and the
figures after it still run.

  python3 tools/bench/hf_real_size.py --model DIR --figures generate,train,checkpoint --batch 8 \\
      --prompt-tokens 4096 --new-tokens 2048 --train-sequences 8 [--lora] [--grad-checkpointing] \\
      --out hf.json
"""
import argparse
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): real-size policies "
                                        "(issue 43), transformers' side: peak memory, rollout tokens/s, learner "
                                        "tokens/s and MFU, checkpoint write and read rates. No environment "
                                        "variables.")
    ap.add_argument("--model", required=True, help="a model directory (crucible init-model's output)")
    ap.add_argument("--figures", default="generate,train,checkpoint")
    ap.add_argument("--device", default="cuda:0", help="cuda:N or cpu (cpu: to check the script runs)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batch", type=int, default=8, help="generate: completions of the one prompt")
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=2048)
    ap.add_argument("--train-sequences", type=int, default=8, help="train: sequences in one update")
    ap.add_argument("--train-steps", type=int, default=2, help="train: timed updates (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1, help="train: untimed updates first")
    ap.add_argument("--logprob-chunk", type=int, default=1024, help="train: tokens per vocabulary projection")
    ap.add_argument("--lora", action="store_true", help="train: LoRA rank 16, alpha 32 on q/k/v/o_proj")
    ap.add_argument("--lora-impl", default="auto", choices=["auto", "peft", "manual"],
                    help="train: PEFT when installed (auto), or adapters written here")
    ap.add_argument("--grad-checkpointing", action="store_true", help="train: model.gradient_checkpointing_enable()")
    ap.add_argument("--state-checkpoint", action="store_true",
                    help="train: after the updates, write and read the whole training state as the Trainer does "
                         "(model, optimizer.pt with the optimiser's state and float32 masters)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--checkpoint-dir", default="", help="checkpoint: where to save (default: a temporary "
                                                          "directory under TMPDIR, removed afterwards)")
    ap.add_argument("--matmul-size", type=int, default=0, help="matmul peak: n of n^3 (default 8192 on CUDA, "
                                                              "512 on the CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="also write the JSON object here")
    args = ap.parse_args()

    figures = [f for f in args.figures.split(",") if f]
    for f in figures:
        if f not in ("generate", "train", "checkpoint"):
            sys.exit(f"hf_real_size: --figures: unknown figure '{f}' (generate, train, checkpoint)")
    if args.new_tokens < 2 or args.prompt_tokens < 1 or args.batch < 1 or args.train_sequences < 1:
        sys.exit("hf_real_size: --prompt-tokens >= 1, --new-tokens >= 2, --batch >= 1, --train-sequences >= 1")

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    torch.manual_seed(args.seed)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def reset_peak():
        if cuda:
            sync()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    def peak():
        if not cuda:
            return {"peak_allocated_bytes": None, "peak_reserved_bytes": None}
        sync()
        return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(device)}

    def load(path):
        sync()
        t0 = time.perf_counter()
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device)
        sync()
        return m, time.perf_counter() - t0

    result = {
        "kind": "hf_real_size", "model": os.path.abspath(args.model), "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "dtype": args.dtype,
        "attention": "sdpa", "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
    }
    reset_peak()
    model, load_s = load(args.model)
    model.eval()
    config = model.config
    params = model.num_parameters()  # tied weights counted once
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    result.update({"parameters": params, "weight_bytes": weight_bytes, "vocab_size": config.vocab_size,
                   "layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
                   "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
                   "first_load_s": load_s})
    if args.prompt_tokens + args.new_tokens > config.max_position_embeddings:
        sys.exit(f"hf_real_size: {args.prompt_tokens} + {args.new_tokens} tokens exceed the model's "
                 f"max_position_embeddings {config.max_position_embeddings}")
    gen = torch.Generator().manual_seed(args.seed)
    vocab = config.vocab_size

    def run_figure(name, fn):
        # Running out of memory is a result too: the figure records it with the peak reached, and
        # the figures after it still run.
        try:
            result[name] = fn()
        except torch.OutOfMemoryError as e:
            result[name] = {"error": "out of memory", "message": str(e).splitlines()[0], **peak()}
            if cuda:
                torch.cuda.empty_cache()
        print(json.dumps({"figure": name, **result[name]}), file=sys.stderr, flush=True)

    if "generate" in figures:
        run_figure("generate", lambda: figure_generate(torch, model, args, vocab, gen, device, sync, reset_peak, peak))

    if "checkpoint" in figures:
        root = args.checkpoint_dir or tempfile.mkdtemp(prefix="hf_real_size_")
        try:
            run_figure("checkpoint", lambda: figure_checkpoint(torch, model, root, load, reset_peak, peak, sync))
        finally:
            if not args.checkpoint_dir:
                shutil.rmtree(root, ignore_errors=True)

    if "train" in figures:
        n = args.matmul_size or (8192 if cuda else 512)
        peak_rate = matmul_rate(torch, device, dtype, n, sync)
        result["matmul"] = {"m_n_k": n, "dtype": args.dtype, "tflops": peak_rate / 1e12}
        run_figure("train", lambda: figure_train(torch, model, args, vocab, gen, device, sync, reset_peak, peak,
                                                 params, peak_rate))

    text = json.dumps(result)
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def figure_generate(torch, model, args, vocab, gen, device, sync, reset_peak, peak):
    prompt = torch.randint(0, vocab, (1, args.prompt_tokens), generator=gen)
    ids = prompt.repeat(args.batch, 1).to(device)
    mask = torch.ones_like(ids)
    # Pure sampling at temperature 1, as the engine samples: no top-k (transformers' default 50),
    # no top-p, no repetition penalty, no eos (every row makes exactly the tokens asked for).
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
                    eos_token_id=None, pad_token_id=0, use_cache=True)

    def run(new):
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                 **sampling)
        sync()
        return time.perf_counter() - t0, out

    run(min(8, args.new_tokens))  # warm-up: kernels, allocator
    prefill = min(run(1)[0] for _ in range(2))
    reset_peak()
    total, out = run(args.new_tokens)
    if tuple(out.shape) != (args.batch, args.prompt_tokens + args.new_tokens):
        sys.exit(f"hf_real_size: generate made {tuple(out.shape)}, expected "
                 f"{(args.batch, args.prompt_tokens + args.new_tokens)}")
    decode = max(total - prefill, 1e-9)
    return {"batch": args.batch, "seconds": total, "generated_tokens": args.batch * args.new_tokens,
            "tokens_per_s": args.batch * args.new_tokens / total, "prefill_s": prefill,
            "decode_tokens_per_s": args.batch * (args.new_tokens - 1) / decode,
            "sampling": "temperature 1, top_k 0, top_p 1, KV cache (DynamicCache); every row's copy of the "
                        "prompt is prefilled (generate shares no prefix)", **peak()}


def evict(path):
    """Writes back and drops path's files from the page cache, so the next read comes from disk."""
    for dirpath, _, names in os.walk(path):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def figure_checkpoint(torch, model, root, load, reset_peak, peak, sync):
    path = os.path.join(root, "model")
    sync()
    t0 = time.perf_counter()
    model.save_pretrained(path, safe_serialization=True, max_shard_size="5GB")
    if hasattr(os, "sync"):
        os.sync()  # the files on disk, not only in the page cache
    write_s = time.perf_counter() - t0
    files = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    nbytes = sum(os.path.getsize(os.path.join(path, f)) for f in files)
    reset_peak()
    evict(path)
    loaded, read_s = load(path)
    del loaded
    return {"bytes": nbytes, "files": len(files), "write_s": write_s, "write_gb_per_s": nbytes / write_s / 1e9,
            "read_s": read_s, "read_gb_per_s": nbytes / read_s / 1e9,
            "read_note": "from_pretrained(dtype=bfloat16, sdpa).to(device) from a cold page cache (the files "
                         "written back and dropped with posix_fadvise DONTNEED first)",
            "write_note": "save_pretrained(safe_serialization=True, max_shard_size='5GB') then os.sync()"}


def figure_state_checkpoint(torch, model, opt, masters, trainable, device, sync):
    """The whole training state the way transformers' Trainer checkpoints it: save_pretrained of the
    model, torch.save of the optimiser's state_dict (and the float32 masters where the model is not
    float32) into optimizer.pt, os.sync; then, from a cold page cache, the weights read back into
    the model (safetensors.torch.load_file onto the device) and optimizer.pt loaded into the
    optimiser (torch.load, load_state_dict)."""
    from safetensors.torch import load_file
    root = tempfile.mkdtemp(prefix="hf_real_size_state_")
    try:
        sync()
        t0 = time.perf_counter()
        model.save_pretrained(root, safe_serialization=True, max_shard_size="5GB")
        own = [m for m, p in zip(masters, trainable) if m is not p]
        torch.save({"optimizer": opt.state_dict(), "masters": own}, os.path.join(root, "optimizer.pt"))
        os.sync()
        write_s = time.perf_counter() - t0
        nbytes = sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root))
        evict(root)
        sync()
        t0 = time.perf_counter()
        state = {}
        for f in sorted(os.listdir(root)):
            if f.endswith(".safetensors"):
                state.update(load_file(os.path.join(root, f), device=str(device)))
        model.load_state_dict(state, strict=False)
        saved = torch.load(os.path.join(root, "optimizer.pt"), map_location=device, weights_only=True)
        opt.load_state_dict(saved["optimizer"])
        with torch.no_grad():
            for m, s in zip(own, saved["masters"]):
                m.copy_(s)
        sync()
        read_s = time.perf_counter() - t0
        return {"bytes": nbytes, "write_s": write_s, "write_gb_per_s": nbytes / write_s / 1e9, "read_s": read_s,
                "read_gb_per_s": nbytes / read_s / 1e9,
                "how": "save_pretrained + torch.save(optimizer state_dict, float32 masters) + os.sync; read from a "
                       "cold page cache: safetensors load_file onto the device, load_state_dict, torch.load"}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def matmul_rate(torch, device, dtype, n, sync):
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.mm(a, b)
    sync()
    best = 0.0
    reps = 20 if device.type == "cuda" else 3
    for _ in range(5):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                torch.mm(a, b, out=c)
            stop.record()
            stop.synchronize()
            s = start.elapsed_time(stop) / 1000.0 / reps
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b, out=c)
            s = (time.perf_counter() - t0) / reps
        best = max(best, 2.0 * n ** 3 / s)
    del a, b, c
    return best


def add_lora(torch, model, args):
    """Adapters on q/k/v/o_proj, rank 16, alpha 32, the base frozen. Returns (model, how)."""
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    use_peft = args.lora_impl == "peft" or (args.lora_impl == "auto" and importlib.util.find_spec("peft"))
    if use_peft:
        import peft
        cfg = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets, bias="none",
                              task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, cfg)
        dtypes = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad})
        return model, f"peft {peft.__version__} (LoraConfig r=16, alpha=32, q/k/v/o_proj; adapter dtypes {dtypes})"

    nn = torch.nn
    F = torch.nn.functional

    class LoRALinear(nn.Module):
        # y = base(x) + (x A^T) B^T * alpha / r, as crucible's ProjectionImpl with an adapter.
        def __init__(self, base, rank, alpha):
            super().__init__()
            self.base = base
            w = base.weight
            bound = 1.0 / math.sqrt(w.shape[1])
            self.lora_A = nn.Parameter(torch.empty(rank, w.shape[1]).uniform_(-bound, bound).to(w.device, w.dtype))
            self.lora_B = nn.Parameter(torch.zeros(w.shape[0], rank, device=w.device, dtype=w.dtype))
            self.scale = alpha / rank

        def forward(self, x):
            return self.base(x) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale

    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        attn = layer.self_attn
        for name in targets:
            setattr(attn, name, LoRALinear(getattr(attn, name), 16, 32.0))
    return model, "manual (rank 16, alpha 32, q/k/v/o_proj; A uniform +-1/sqrt(in), B zero, adapters in the " \
                  "weights' dtype: peft not installed or --lora-impl manual)"


def figure_train(torch, model, args, vocab, gen, device, sync, reset_peak, peak, params, peak_rate):
    from torch.utils.checkpoint import checkpoint
    F = torch.nn.functional
    reset_peak()
    lora_how = None
    if args.lora:
        model, lora_how = add_lora(torch, model, args)
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    model.config.use_cache = False
    checkpointing = None
    if args.grad_checkpointing:
        # transformers 5 renamed gradient_checkpointing_enable (the old name still works, deprecated).
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            checkpointing = "model.activation_checkpointing_enable(activation_checkpointing_kwargs=" \
                            "{'use_reentrant': False}): every decoder layer"
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            checkpointing = "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})"
    model.train()

    trainable = [p for p in model.parameters() if p.requires_grad]
    # float32 masters of non-float32 parameters; a float32 parameter is its own (as in crucible's adamw).
    masters = [p if p.dtype == torch.float32 else p.detach().float().clone().requires_grad_(True) for p in trainable]
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(masters, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=cuda, foreach=False if not cuda else None)
    trained = sum(p.numel() for p in trainable)
    copies = sum(1 for p, m in zip(trainable, masters) if m is not p)
    if copies == len(trainable):
        precision = "float32 master copies of the bf16 weights (float32 state and gradients, summed after each " \
                    "micro-batch)"
    elif copies == 0:
        precision = "the float32 trainable parameters themselves (their gradients summed over micro-batches in " \
                    "float32)"
    else:
        precision = f"float32 masters of {copies} of {len(trainable)} trainable tensors, the float32 others as they are"

    W = base.get_output_embeddings().weight
    body = base.model  # the decoder: embeddings, layers, final norm

    def chunk_log_probs(h, w, t):
        logits = F.linear(h, w).float()
        return logits.log_softmax(-1).gather(1, t.unsqueeze(1)).squeeze(1)

    def completion_log_probs(ids):
        hidden = body(input_ids=ids[:, :-1], use_cache=False).last_hidden_state[0]
        h = hidden[args.prompt_tokens - 1:]  # positions whose next token is a completion token
        t = ids[0, args.prompt_tokens:]
        parts = [checkpoint(chunk_log_probs, h[s:s + args.logprob_chunk], W, t[s:s + args.logprob_chunk],
                            use_reentrant=False) for s in range(0, h.shape[0], args.logprob_chunk)]
        return torch.cat(parts)

    seqs = torch.randint(0, vocab, (args.train_sequences, args.prompt_tokens + args.new_tokens), generator=gen)
    adv = torch.randn(args.train_sequences, generator=gen)
    adv = (adv - adv.mean()) / (adv.std() + 1e-6)
    total_tokens = args.train_sequences * args.new_tokens

    def update():
        for m in masters:
            m.grad = None
        loss_sum = 0.0
        for i in range(args.train_sequences):
            ids = seqs[i:i + 1].to(device)
            logp = completion_log_probs(ids)
            ratio = torch.exp(logp - logp.detach())
            a = float(adv[i])
            # GRPO's clipped surrogate at ratio 1 (on-policy), token mean over the whole update.
            loss = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a).sum() / total_tokens
            loss.backward()
            loss_sum += float(loss.detach())
            for p, m in zip(trainable, masters):
                if m is p or p.grad is None:
                    continue
                g = p.grad.float()
                m.grad = g if m.grad is None else m.grad.add_(g)
                p.grad = None
        norm = torch.nn.utils.clip_grad_norm_(masters, 1.0)
        opt.step()
        with torch.no_grad():
            for p, m in zip(trainable, masters):
                if m is not p:
                    p.copy_(m)
        return loss_sum, float(norm)

    for _ in range(args.warmup):
        update()
    times = []
    for _ in range(args.train_steps):
        sync()
        t0 = time.perf_counter()
        loss, norm = update()
        sync()
        times.append(time.perf_counter() - t0)
    step_s = sum(times) / len(times)
    tokens = args.train_sequences * (args.prompt_tokens + args.new_tokens - 1)
    tps = tokens / step_s
    state_checkpoint = None
    if args.state_checkpoint:
        state_checkpoint = figure_state_checkpoint(torch, model, opt, masters, trainable, device, sync)
    return {"sequences": args.train_sequences, "tokens_per_update": tokens, "micro_batch_sequences": 1,
            "step_seconds": times, "mean_step_s": step_s, "tokens_per_s": tps,
            "mfu": 6.0 * params * tps / peak_rate, "parameters": params, "trained_parameters": trained,
            "lora": lora_how, "grad_checkpointing": checkpointing, "logprob_chunk": args.logprob_chunk,
            "loss": loss, "grad_norm": norm, "state_checkpoint": state_checkpoint,
            "optimizer": ("torch.optim.AdamW(fused=True)" if cuda else "torch.optim.AdamW(foreach=False)") +
                         " on " + precision + "; grad norm clipped to 1",
            "log_probs": "completion positions only: final hidden states projected logprob_chunk tokens at a "
                         "time, each chunk's log_softmax under torch.utils.checkpoint (no [tokens, vocab] "
                         "tensor kept)",
            **peak()}


if __name__ == "__main__":
    main()
