"""PyTorch's side of the data-parallel scaling benchmark (tools/bench/dp_scaling.py): the same GPT
as weft's built-in run (vocab 128, block 64, 4 layers, 4 heads, n_embd 128, global batch 16,
AdamW with clipping to 1.0), trained on `--nproc` processes with one thread each over gloo, as
DistributedDataParallel (`--mode ddp`, the default) or FullyShardedDataParallel with full
sharding (`--mode fsdp`, ZeRO stage 3's counterpart). The global batch is split evenly.

    python3 tools/bench/torch_dp_scaling.py --nproc 2 [--mode ddp] [--steps 40] [--json]

Each rank runs 5 warm-up steps, then --steps timed steps (zero_grad, forward, loss, backward,
clip_grad_norm_, optimizer.step, loss.item()); the median step time of the slowest rank is
reported (with --nproc 1 and ddp, the model is not wrapped at all).
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from make_train_fixtures import GPT, param_groups  # noqa: E402

CFG = dict(vocab_size=128, block_size=64, n_layer=4, n_head=4, n_embd=128, bias=True, dropout=0.0)
GLOBAL_BATCH = 16
WARMUP = 5


def worker(rank, world, port, mode, steps, out):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1337)
    model = GPT(CFG)
    if mode == "fsdp":
        # FSDP2: each block is a unit, the root holds the embeddings and the final norm
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    inner = model.module if hasattr(model, "module") and mode == "ddp" else model
    optimizer = torch.optim.AdamW(param_groups(inner, 0.1), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                                  foreach=False, fused=False)
    g = torch.Generator().manual_seed(7)
    per_rank = GLOBAL_BATCH // world
    stream = torch.randint(0, CFG["vocab_size"], (8, GLOBAL_BATCH, CFG["block_size"] + 1), generator=g)
    inputs = stream[:, rank * per_rank:(rank + 1) * per_rank, :-1].contiguous()
    targets = stream[:, rank * per_rank:(rank + 1) * per_rank, 1:].contiguous()

    def step(it):
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs[it % 8])
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets[it % 8].view(-1))
        loss.backward()
        # on FSDP2's sharded (DTensor) gradients this computes the global norm
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    for it in range(WARMUP):
        step(it)
    times = []
    for it in range(WARMUP, WARMUP + steps):
        t0 = time.perf_counter()
        step(it)
        times.append((time.perf_counter() - t0) * 1e3)
    out[rank] = statistics.median(times)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = mp.Manager().dict()
    mp.spawn(worker, args=(args.nproc, free_port(), args.mode, args.steps, out), nprocs=args.nproc)
    slowest = max(out.values())
    if args.json:
        print(json.dumps({"impl": "torch", "mode": args.mode, "nproc": args.nproc, "median_ms": slowest,
                          "torch_version": torch.__version__.split("+")[0]}))
    else:
        print(f"torch {args.mode} nproc={args.nproc}: {slowest:.1f} ms/step (slowest rank's median)")


if __name__ == "__main__":
    main()
