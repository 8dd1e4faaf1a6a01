#!/usr/bin/env python3
"""tools/bench/allreduce_torch.py: plain torch.distributed NCCL all-reduce of the same bytes that
bench_learner's `allreduce` figure reduces through crucible's communicator, measured the same way
(one process per GPU, spawned here without torchrun; warm-up, barrier, ITERS all-reduces back to
back, then a synchronisation; the slowest rank's time). One JSON object per size on stdout:

  {"figure": "allreduce", "backend": "torch.distributed-nccl", "gpus": N, "bytes": B,
   "time_us": ..., "algbw_gbps": B / time / 1e9, "busbw_gbps": algbw * 2 (N - 1) / N}

usage: allreduce_torch.py [--gpus N] [--sizes-mb 25,100,500,2000] [--iters 20]
The environment passes through unchanged (keep NCCL_NVLS_ENABLE=0 where the machine asks for it).
"""
import argparse
import json
import os
import socket
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world: int, port: int, sizes_mb: list, iters: int, out_queue) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    for mb in sizes_mb:
        nbytes = mb << 20
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        for _ in range(3):  # warm-up: connections, buffers
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        seconds = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device="cuda")
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        if rank == 0:
            s = seconds.item()
            algbw = nbytes / s / 1e9
            out_queue.put({"figure": "allreduce", "backend": "torch.distributed-nccl", "gpus": world,
                           "device": torch.cuda.get_device_name(0), "dtype": "float32", "bytes": nbytes,
                           "time_us": s * 1e6, "algbw_gbps": algbw,
                           "busbw_gbps": algbw * 2.0 * (world - 1) / world,
                           "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
        del buf
    dist.destroy_process_group()


def main() -> int:
    import torch
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Reproduces (docs/PERFORMANCE.md, goals table): "
                                            "the gradient all-reduce, torch.distributed's side\n"
                                            "(tools/bench/gpu_session.sh allreduce runs it beside bench_learner). Environment:\n"
                                            "NCCL_* pass through; NCCL_NVLS_ENABLE is 0 unless set.")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to use (0: all visible)")
    parser.add_argument("--sizes-mb", default="25,100,500,2000", help="buffer sizes in MiB, comma-separated")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    visible = torch.cuda.device_count()
    if visible == 0:
        print("allreduce_torch.py: no CUDA device", file=sys.stderr)
        return 1
    world = min(args.gpus, visible) if args.gpus > 0 else visible
    sizes = [int(s) for s in args.sizes_mb.split(",") if s]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, sizes, args.iters, queue)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    while not queue.empty():
        print(json.dumps(queue.get()), flush=True)
    if failed:
        print(f"allreduce_torch.py: {len(failed)} rank(s) failed (exit codes {failed})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.exit(main())
