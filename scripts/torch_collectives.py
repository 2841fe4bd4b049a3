"""torch.distributed's NCCL on the same payload as `dspine-bench collectives`, for a same-run
comparison (run with torchrun --nproc_per_node N). Same definitions: size = full tensor,
busbw = algbw x 2(n-1)/n (all-reduce) or (n-1)/n (all-gather, reduce-scatter); rank 0's time."""
import argparse
import os

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    n = dist.get_world_size()
    elements = args.bytes // 2 // n * n
    full = torch.zeros(elements, dtype=torch.bfloat16, device="cuda")
    shard = torch.zeros(elements // n, dtype=torch.bfloat16, device="cuda")
    ring = (n - 1) / n
    rows = [
        ("all_reduce", 2 * ring, lambda: dist.all_reduce(full)),
        ("all_gather", ring, lambda: dist.all_gather_into_tensor(full, shard)),
        ("reduce_scatter", ring, lambda: dist.reduce_scatter_tensor(shard, full)),
    ]
    if dist.get_rank() == 0:
        print(f"torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}: "
              f"{n} ranks, {elements * 2 / 2**30:.3f} GiB bf16, {args.iters} iterations")
        print(f"{'collective':15s} {'time ms':>10s} {'algbw GB/s':>12s} {'busbw GB/s':>12s}")
    for name, factor, call in rows:
        for _ in range(args.warmup):
            call()
        dist.barrier()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            call()
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop) / args.iters
        algbw = elements * 2 / (ms * 1e-3) / 1e9
        if dist.get_rank() == 0:
            print(f"{name:15s} {ms:10.3f} {algbw:12.1f} {algbw * factor:12.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
