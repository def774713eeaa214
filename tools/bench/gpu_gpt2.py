"""GPT-2 small training steps on one GPU, weft beside PyTorch eager on the same batches: the speed
table of the CUDA backend (docs/cuda.md).

    python3 tools/bench/gpu_gpt2.py --weft PATH/TO/weft [--device cuda] [--steps 20] [--warmup 5]
                                    [--tiny] [--out DIR]

Model (GPT-2 small, as the anchor of the GPU issues): vocab 50304, block 1024, 12 layers, 12 heads,
n_embd 768, bias, no dropout, exact GELU (as weft's gpt), batch 16; AdamW (lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay
0.1 on matrices), clipping to 1.0, constant learning rate. `--tiny` shrinks it (vocab 512, block
64, 2 layers, n_embd 64, batch 4) to check the script itself, on any device.

Batches: 4 distinct batches of uniform random token ids, cycled, written as a safetensors file
(`inputs`, `targets`, int64 [S, B, T]) that weft trains from, so both sides see the same tokens.

Timed: --steps steps after --warmup untimed ones. weft's time per step is the median `step_ms` of
its metrics file after the warm-up (each step ends with a device synchronize). PyTorch's is the
median wall time of zero_grad, forward, loss, backward, clip, step and loss.item(). PyTorch runs
twice when it is importable: f32 with TF32 off (what weft's f32 computes) and bf16 autocast.

MFU uses 6N + 12 L T C FLOPs per token (N: parameters without the position embedding; the
PaLM paper's appendix B count) of 989 TFLOP/s (H100/H200 dense bf16, NVIDIA's datasheet); for
f32 runs it is reported against the same peak, so the columns compare.

Output: a markdown table on stdout and `gpu_gpt2.json` in --out (default: a temp folder).
"""

import argparse
import json
import math
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time

PEAK_FLOPS = 989e12


def config(tiny):
    if tiny:
        return dict(vocab=512, block=64, layers=2, heads=2, embd=64, batch=4)
    return dict(vocab=50304, block=1024, layers=12, heads=12, embd=768, batch=16)


def param_count(c):
    """Parameters without the position embedding (the lm head is tied to the token embedding)."""
    v, l, e = c["vocab"], c["layers"], c["embd"]
    block = 2 * e + (3 * e * e + 3 * e) + (e * e + e) + 2 * e + (4 * e * e + 4 * e) + (4 * e * e + e)
    return v * e + l * block + 2 * e


def flops_per_token(c):
    return 6 * param_count(c) + 12 * c["layers"] * c["block"] * c["embd"]


def write_batches(path, c, count=4, seed=1337):
    """`inputs` and `targets` int64 [count, B, T], targets the inputs shifted by one."""
    rng = random.Random(seed)
    b, t = c["batch"], c["block"]
    inputs, targets = [], []
    for _ in range(count):
        for _ in range(b):
            row = [rng.randrange(c["vocab"]) for _ in range(t + 1)]
            inputs.extend(row[:-1])
            targets.extend(row[1:])
    n = count * b * t
    blob_in = struct.pack(f"<{n}q", *inputs)
    blob_tg = struct.pack(f"<{n}q", *targets)
    header = {
        "inputs": {"dtype": "I64", "shape": [count, b, t], "data_offsets": [0, len(blob_in)]},
        "targets": {"dtype": "I64", "shape": [count, b, t], "data_offsets": [len(blob_in), 2 * len(blob_in)]},
    }
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.write(blob_in)
        f.write(blob_tg)


def weft_config(c, batches, metrics, steps, device):
    return f"""[model]
kind = "gpt"
vocab_size = {c["vocab"]}
block_size = {c["block"]}
n_layer = {c["layers"]}
n_head = {c["heads"]}
n_embd = {c["embd"]}
bias = true
dropout = 0.0

[data]
kind = "batches"
path = {json.dumps(batches)}

[optim]
kind = "adamw"
lr = 0.0006
betas = [0.9, 0.95]
eps = 1e-8
weight_decay = 0.1
grad_clip = 1.0

[train]
steps = {steps}
seed = 1337
log_every = 1
metrics = {json.dumps(metrics)}
device = {json.dumps(device)}
"""


def run_weft(weft, c, out, steps, warmup, device):
    batches = os.path.join(out, "batches.safetensors")
    metrics = os.path.join(out, "weft_metrics.jsonl")
    cfg = os.path.join(out, "weft.toml")
    with open(cfg, "w") as f:
        f.write(weft_config(c, batches, metrics, warmup + steps, device))
    if os.path.exists(metrics):
        os.remove(metrics)
    t0 = time.time()
    r = subprocess.run([weft, "train", "--config", cfg, "--quiet", "--set", "train.overwrite=true"],
                       capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1:] or [f"exit {r.returncode}"]}
    records = [json.loads(line) for line in open(metrics) if line.strip()]
    steps_ms = [rec["step_ms"] for rec in records if "step_ms" in rec]
    first_ms = steps_ms[0] if steps_ms else float("nan")
    timed = steps_ms[warmup:]
    mem = max((rec.get("gpu_mem_bytes", 0) for rec in records), default=0)
    return {"median_ms": statistics.median(timed), "first_step_ms": first_ms, "wall_s": wall,
            "losses": [rec["loss"] for rec in records if "loss" in rec], "gpu_mem_bytes": mem}


def run_torch(c, out, steps, warmup, device, bf16):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1337)
    e, h = c["embd"], c["heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(e), nn.LayerNorm(e)
            self.c_attn, self.c_proj = nn.Linear(e, 3 * e), nn.Linear(e, e)
            self.fc, self.proj = nn.Linear(e, 4 * e), nn.Linear(4 * e, e)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(e, dim=2)
            q, k, v = (z.view(b, t, h, e // h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, e))
            return x + self.proj(F.gelu(self.fc(self.ln_2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(c["vocab"], e), nn.Embedding(c["block"], e)
            self.h = nn.ModuleList(Block() for _ in range(c["layers"]))
            self.ln_f = nn.LayerNorm(e)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    model = Gpt().to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    fused = device.startswith("cuda")
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    g = torch.Generator().manual_seed(1337)
    data = [torch.randint(0, c["vocab"], (c["batch"], c["block"] + 1), generator=g) for _ in range(4)]
    data = [(d[:, :-1].to(device), d[:, 1:].to(device)) for d in data]

    def step(i):
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        step(i)
        times.append((time.perf_counter() - t0) * 1e3)
    mem = torch.cuda.max_memory_allocated() if fused else 0
    return {"median_ms": statistics.median(times[warmup:]), "first_step_ms": times[0], "gpu_mem_bytes": mem,
            "torch_version": torch.__version__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weft", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    c = config(args.tiny)
    out = args.out or tempfile.mkdtemp(prefix="gpu_gpt2-")
    os.makedirs(out, exist_ok=True)
    write_batches(os.path.join(out, "batches.safetensors"), c)
    rows = {"weft f32": run_weft(args.weft, c, out, args.steps, args.warmup, args.device)}
    try:
        import torch  # noqa: F401

        rows["torch eager f32 (TF32 off)"] = run_torch(c, out, args.steps, args.warmup, args.device, False)
        rows["torch eager bf16 autocast"] = run_torch(c, out, args.steps, args.warmup, args.device, True)
    except ImportError:
        print("torch is not importable: weft only", file=sys.stderr)
    tokens = c["batch"] * c["block"]
    print(f"GPT-2 {'tiny' if args.tiny else 'small'} on {args.device}: batch {c['batch']} x {c['block']} tokens, "
          f"{args.steps} timed steps after {args.warmup}")
    print("| | ms/step | tokens/s | MFU | first step ms | peak GPU memory |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | | |")
            continue
        ms = r["median_ms"]
        tps = tokens / (ms / 1e3)
        mfu = tps * flops_per_token(c) / PEAK_FLOPS
        r.update(tokens_per_s=tps, mfu=mfu)
        print(f"| {name} | {ms:.1f} | {tps:,.0f} | {100 * mfu:.1f}% | {r['first_step_ms']:.0f} | "
              f"{r['gpu_mem_bytes'] / 1e9:.1f} GB |")
    with open(os.path.join(out, "gpu_gpt2.json"), "w") as f:
        json.dump({"config": c, "device": args.device, "rows": rows}, f, indent=1)
    if math.isnan(rows["weft f32"].get("median_ms", float("nan"))):
        sys.exit(1)


if __name__ == "__main__":
    main()
