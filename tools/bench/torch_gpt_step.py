"""Times full PyTorch eager training steps of a small GPT on the CPU, the reference for weft's
training-speed target.

Run from anywhere (needs torch and, for --save-batches, safetensors):

    python3 tools/bench/torch_gpt_step.py [--threads N] [--steps N] [--json]
                                          [--save-batches PATH] [--compile]

Model and run (nanoGPT layout and init, from tools/reference/make_train_fixtures.py): vocab 65,
block_size 64, n_layer 4, n_head 4, n_embd 128, bias true, dropout 0, batch 16, float32.
AdamW (lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 on parameters with dim >= 2 only,
foreach=False, fused=False), gradient clipping to norm 1.0, constant lr. Batches: --batches
(default 8) distinct batches of uniform random token ids, cycled; targets are the inputs shifted by
one within a random token stream.

One step, the part that is timed: zero_grad, forward, cross-entropy loss, backward,
clip_grad_norm_, optimizer.step() (loss.item() is read inside the step, so the step has finished
when the clock stops). 5 warm-up steps run first, untimed, then --steps timed steps; the median,
min and max step times in milliseconds are reported.

--save-batches PATH writes the batches used as a safetensors file with `inputs` and `targets`,
int64 [S, B, T], so that weft can train on the very same batches.
--compile wraps the model in torch.compile (default backend); compilation happens during warm-up.

Output: one line of text by default; with --json one JSON object with the keys impl ("torch"),
model, threads, batch, block_size, steps, warmup, compile, median_ms, min_ms, max_ms,
tokens_per_s (batch * block_size / median) and torch_version.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from make_train_fixtures import GPT, param_groups  # noqa: E402

CFG = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, bias=True, dropout=0.0)
BATCH = 16
WARMUP = 5
LR = 1e-3
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
SEED = 1337


def make_batches(n_batches, seed):
    g = torch.Generator().manual_seed(seed)
    T = CFG["block_size"]
    stream = torch.randint(0, CFG["vocab_size"], (n_batches, BATCH, T + 1), generator=g)
    return stream[..., :-1].contiguous(), stream[..., 1:].contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--steps", type=int, default=50, help="timed steps (default 50)")
    ap.add_argument("--batches", type=int, default=8, help="distinct batches, cycled (default 8)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--save-batches", metavar="PATH", help="write the batches as safetensors")
    ap.add_argument("--compile", action="store_true", help="use torch.compile on the model")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    model = GPT(CFG)
    model.train()
    inputs, targets = make_batches(args.batches, SEED + 1)
    if args.save_batches:
        from safetensors.torch import save_file

        os.makedirs(os.path.dirname(os.path.abspath(args.save_batches)), exist_ok=True)
        save_file({"inputs": inputs, "targets": targets}, args.save_batches)

    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS, eps=1e-8, foreach=False, fused=False
    )
    forward = torch.compile(model) if args.compile else model

    def step(it):
        optimizer.zero_grad(set_to_none=True)
        b = it % args.batches
        logits = forward(inputs[b])
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets[b].view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        optimizer.step()
        return loss.item()

    for it in range(WARMUP):
        step(it)
    times = []
    loss = None
    for it in range(WARMUP, WARMUP + args.steps):
        t0 = time.perf_counter()
        loss = step(it)
        times.append((time.perf_counter() - t0) * 1e3)

    median = statistics.median(times)
    result = {
        "impl": "torch",
        "model": "gpt-v65-t64-l4-h4-c128",
        "threads": args.threads,
        "batch": BATCH,
        "block_size": CFG["block_size"],
        "steps": args.steps,
        "warmup": WARMUP,
        "compile": args.compile,
        "median_ms": round(median, 4),
        "min_ms": round(min(times), 4),
        "max_ms": round(max(times), 4),
        "tokens_per_s": round(BATCH * CFG["block_size"] / (median / 1e3), 1),
        "torch_version": torch.__version__.split("+")[0],
    }
    if args.json:
        print(json.dumps(result))
    else:
        n_params = sum(p.numel() for p in params)
        print(
            f"torch gpt step ({n_params} params, batch {BATCH}x{CFG['block_size']}, "
            f"threads {args.threads}{', compiled' if args.compile else ''}): "
            f"median {median:.2f} ms, min {min(times):.2f} ms, max {max(times):.2f} ms "
            f"over {args.steps} steps ({result['tokens_per_s']:.0f} tokens/s); last loss {loss:.4f}"
        )


if __name__ == "__main__":
    main()
