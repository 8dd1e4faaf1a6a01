#!/usr/bin/env python3
"""Decode throughput of crucible's engine beside Hugging Face transformers' `generate`, on the
same randomly initialised weights: the decode figure of docs/PERFORMANCE.md.

1. If --model holds no model yet, trains a small tokenizer on this repository's docs
   (`crucible tokenizer train`) and writes a random model of --preset with it
   (`crucible init-model`; the 0.5b preset gets Qwen2.5's padded vocabulary of 151936 rows).
2. Runs bench_decode (ours: prefill and decode timed separately, KV cache memory, the device's
   copy bandwidth and the bandwidth bound; by default each batch twice on the same weights, with
   the fused decoding kernels and with LibTorch ops only), then tools/bench/decode_hf.py
   (transformers) with the same batch sizes, prompt and new-token lengths, greedy on both sides.
3. Prints a table and writes every record to --out (JSON).

  python3 tools/bench/decode_compare.py --build build-gpu --device cuda:0 --out gpu-out/decode.json
  python3 tools/bench/decode_compare.py --build build --device cpu --preset tiny \\
      --batches 1,2 --prompt 16 --new 16        # proves the pipeline on a CPU; not a figure
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run(cmd, what):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        sys.stderr.write(p.stdout)
        raise SystemExit(f"decode_compare: {what} failed with exit code {p.returncode}")
    return p.stdout


def ensure_model(args, crucible):
    if os.path.exists(os.path.join(args.model, "config.json")):
        return
    with tempfile.TemporaryDirectory(prefix="crucible-tok-") as tok:
        run([crucible, "tokenizer", "train", "--corpus", os.path.join(ROOT, "docs"), "--corpus",
             os.path.join(ROOT, "README.md"), "--vocab", "2048", "--out", tok], "tokenizer train")
        cmd = [crucible, "init-model", "--family", args.family, "--preset", args.preset, "--tokenizer", tok,
               "--out", args.model, "--seed", "0", "--json"]
        vocab = args.vocab_size or (151936 if args.preset == "0.5b" else 0)
        if vocab:
            cmd += ["--vocab-size", str(vocab)]
        print(run(cmd, "init-model").strip(), file=sys.stderr)


def mib(n):
    return "-" if n is None else f"{n / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                        "decode throughput (tools/bench/gpu_session.sh decode\n"
                                        "runs it). No environment variables.")
    ap.add_argument("--build", default=os.path.join(ROOT, "build-gpu"), help="build directory with crucible and bench_decode")
    ap.add_argument("--model", default="", help="model directory (made with init-model when absent; "
                                                "default: /tmp/crucible-decode-PRESET)")
    ap.add_argument("--preset", default="0.5b")
    ap.add_argument("--family", default="qwen2")
    ap.add_argument("--vocab-size", type=int, default=0, help="embedding rows (default: 151936 for 0.5b, else the tokenizer's)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=512)
    ap.add_argument("--no-graphs", action="store_true", help="our engine without CUDA graphs")
    ap.add_argument("--fused", default="both", choices=["on", "off", "both"],
                    help="our engine with the fused decoding kernels, with LibTorch ops only, or both (default)")
    ap.add_argument("--kernels", default="",
                    help="variants of our engine, e.g. small,fused,libtorch (bench_decode --kernels; overrides --fused): "
                         "small = fused kernels with the small-batch projections at up to 4 rows (the default engine: at 1), "
                         "small_rounds = the same with a long k's weights loaded in two rounds, "
                         "small_split = the same with the attention always split and combined (no wide kernel), "
                         "small_late = the same with every read after waiting for the previous kernel, "
                         "small_launch_late = the same with each kernel launching the next after its wait, not as it begins, "
                         "small_gate_up_warps = the same with the one-row gate/up projection a unit a warp, "
                         "small_attention_whole = the same with the one-row attention in one wide block a head, "
                         "not in splits that the o projection merges, small_merge2 = that merge of at most two splits, "
                         "small_merge_w16 = sixteen warps to each block of that split attention, not eight, "
                         "small_serial_staging = the o and down projections loading and storing their inputs one at a time, "
                         "small_sample_after = the greedy sampling after each step's CUDA graph, not in it, "
                         "small_head_gemm = a one-row greedy step's output matrix a GEMM and its sampling two kernels, "
                         "fused = fused kernels with cuBLAS projections, libtorch = LibTorch ops only")
    ap.add_argument("--sync-interval", type=int, default=16, help="decoding steps between copies of tokens to the host")
    ap.add_argument("--fused-max-rows", type=int, default=None,
                    help="largest batch the fused kernels serve (default: engine_options::fused_max_rows)")
    ap.add_argument("--copy-bytes", type=int, default=0, help="bandwidth probe size (default 1 GiB; 64 MiB on the CPU)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="passes over our variants, each starting one later; each variant's median pass is shown "
                         "(bench_decode --rounds: the first variant in a process measures faster)")
    ap.add_argument("--skip-hf", action="store_true", help="measure only our engine")
    ap.add_argument("--out", default="", help="write every record here as JSON")
    args = ap.parse_args()
    args.model = args.model or f"/tmp/crucible-decode-{args.preset}"
    crucible = os.path.join(args.build, "tools", "crucible")
    bench = os.path.join(args.build, "tools", "bench", "bench_decode")
    cuda = args.device != "cpu"

    ensure_model(args, crucible)
    common = ["--device", args.device, "--batches", args.batches, "--prompt", str(args.prompt), "--new", str(args.new)]
    copy_bytes = args.copy_bytes or (2**30 if cuda else 2**26)
    variants = ["--kernels", args.kernels] if args.kernels else ["--fused", args.fused]
    ours = json_lines(run([bench, "--model", args.model, "--copy-bytes", str(copy_bytes)] + variants
                          + ["--sync-interval", str(args.sync_interval), "--rounds", str(args.rounds)] + common
                          + (["--no-graphs"] if args.no_graphs else [])
                          + (["--fused-max-rows", str(args.fused_max_rows)] if args.fused_max_rows is not None else []),
                          "bench_decode"))
    hf, hf_error = [], None
    if not args.skip_hf:
        try:
            hf = json_lines(run([sys.executable, os.path.join(HERE, "decode_hf.py"), "--model", args.model] + common,
                                "decode_hf.py (transformers)"))
        except SystemExit as e:  # still print our side
            hf_error = str(e)

    setup = next(r for r in ours if r["kind"] == "setup")
    bandwidth = next(r for r in ours if r["kind"] == "bandwidth")
    hf_by_batch = {r["batch"]: r for r in hf if r["kind"] == "hf_decode"}
    rows = [r for r in ours if r["kind"] == "decode"]
    def variant(r):
        return r.get("kernels") or ("small" if r.get("fused", False) else "libtorch")
    names = []  # variants in the order measured
    for r in rows:
        if variant(r) not in names:
            names.append(variant(r))
    by_variant = {n: {r["batch"]: r for r in rows if variant(r) == n} for n in names}
    batches = sorted({r["batch"] for r in rows})
    print(f"\nmodel {args.model}: {setup['family']}, {setup['parameters'] / 1e6:.1f}M parameters, {setup['dtype']}, "
          f"on {setup['device']} ({setup['device_name']}), CUDA graphs {'on' if setup['cuda_graphs'] else 'off'}, "
          f"tokens copied to the host every {setup.get('sync_interval', 1)} steps")
    print(f"copy bandwidth {bandwidth['gb_per_s']:.0f} GB/s ({bandwidth['copy_bytes'] / 2**20:.0f} MiB copied); "
          f"prompt {args.prompt}, {args.new} new tokens, greedy; decode tokens/s = B x (new - 1) / decode time\n")
    head = (f"{'batch':>5} {'kernels':>11} {'tok/s':>9} {'ms/step':>8} {'HF tok/s':>9} {'ratio':>6} {'bound tok/s':>12} "
            f"{'of bound':>8} {'KV MiB':>8} {'analytic':>8} {'peak MiB':>9} {'HF peak':>8}")
    print(head)
    print("-" * len(head))
    for batch in batches:
        h = hf_by_batch.get(batch)
        for name in names:
            r = by_variant[name].get(batch)
            if r is None:
                continue
            if name != "libtorch" and r.get("fused_steps", 0) == 0:
                name += "*"
            ratio = f"{r['decode_tokens_per_s'] / h['decode_tokens_per_s']:.2f}" if h else "-"
            print(f"{batch:>5} {name:>11} {r['decode_tokens_per_s']:>9.1f} {r.get('ms_per_step', float('nan')):>8.3f} "
                  f"{h['decode_tokens_per_s'] if h else float('nan'):>9.1f} {ratio:>6} {r['bound_tokens_per_s']:>12.1f} "
                  f"{r['bandwidth_fraction']:>8.1%} {mib(r['kv_cache_bytes']):>8} {mib(r['kv_analytic_bytes']):>8} "
                  f"{mib(r['peak_bytes']):>9} {mib(h['peak_bytes']) if h else '-':>8}")
    print("\nkernels: small = the engine's fused decoding kernels with the small-batch projections (up to 4"
          "\nrows; the engine's default at 1 row), fused = the fused kernels with cuBLAS projections, libtorch = LibTorch ops only"
          "\n(the reference); * = fused kernels asked for but not run (the CPU, or a model they do not take)."
          "\nKV MiB: the engine's cache (rows x slots, slots rounded up to a multiple of 256); analytic:"
          "\n2 x layers x kv_heads x head_dim x (prompt + new) x batch x bytes; peak: the allocator's peak"
          "\nabove the loaded weights during the calls (cache, prefill scratch, activations, graph pools).")
    for r in ours:
        if r["kind"] == "profile":
            print(f"profile, batch {r['batch']}, {variant(r)}: "
                  f"{r.get('device_events_per_step', float('nan')):.1f} device events per decoding step ({r['trace']})")
    # The goals count the engine as configured by default: the fused kernels where measured.
    best = {b: next((by_variant[n][b] for n in names if b in by_variant[n]), None) for b in batches}
    goals = []
    if 64 in best and 64 in hf_by_batch:
        ratio = best[64]["decode_tokens_per_s"] / hf_by_batch[64]["decode_tokens_per_s"]
        goals.append(f"batch 64: {ratio:.2f}x transformers (goal >= 3x: {'met' if ratio >= 3 else 'NOT met'})")
    if 1 in best:
        frac = best[1]["bandwidth_fraction"]
        goals.append(f"batch 1: {frac:.1%} of the bandwidth bound (goal >= 50%: {'met' if frac >= 0.5 else 'NOT met'})")
    if goals:
        print("\n" + "\n".join(goals))
    if hf_error:
        print(f"\ntransformers side missing: {hf_error}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ours": ours, "hf": hf, "hf_error": hf_error, "args": vars(args)}, f, indent=1)
    return 1 if hf_error else 0


if __name__ == "__main__":
    sys.exit(main())
