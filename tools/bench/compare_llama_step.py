"""Training-step time of a small llama, weft against PyTorch eager (transformers'
LlamaForCausalLM), on the CPU, on the same weights and batches.

Build first (`cargo build --release`), then from the repository root, with a Python that has torch,
transformers and safetensors:

    python3 tools/bench/compare_llama_step.py [--threads 2] [--repeat 3] [--steps 20]
                                              [--weft target/release/weft] [--precision bf16]
                                              [--arch qwen3]

Model: vocab 512, block_size (T) 256, 4 layers, n_embd 256, 8 heads, 4 key/value heads
(grouped-query attention), intermediate size 688, untied, float32; batch 8. AdamW (lr 1e-3, betas
(0.9, 0.95), weight decay 0.1 on parameters with dim >= 2), gradient clipping to 1.0, constant lr.
transformers runs with attn_implementation "sdpa" (its default; not compiled). With
`--precision bf16` the forward and loss run under `torch.autocast("cpu", dtype=torch.bfloat16)`
and weft's run under `train.precision = "bf16"` (f32 parameters and optimizer on both sides).
With `--arch qwen3` the model is transformers' Qwen3ForCausalLM of the same sizes but heads of 64
(`head_dim`, where n_embd / n_head is 32) with an RMSNorm on each query and key head (weft's
`head_dim = 64`, `qk_norm = true`).

Each repeat runs this script's --torch side in a fresh process (3 warm-up steps, then --steps
timed steps: zero_grad, forward, loss, backward, clipping, optimizer step, loss.item()), which
also writes the initial weights and batches, and `weft train` from those weights on those batches
(3 + --steps steps, the first 3 dropped), alternating which goes first. Prints the median over
repeats of each side's median step time.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

CFG = dict(
    vocab_size=512, block_size=256, n_layer=4, n_head=8, n_kv_head=4, n_embd=256,
    intermediate_size=688, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False,
)
BATCH = 8
WARMUP = 3
N_BATCHES = 4
SEED = 1337

TOML = """[model]
kind = "llama"
{model}

[init]
from = "init.safetensors"

[data]
kind = "batches"
path = "batches.safetensors"

[optim]
kind = "adamw"
lr = 0.001
betas = [0.9, 0.95]
eps = 1e-8
weight_decay = 0.1
grad_clip = 1.0

[train]
steps = {steps}
seed = 1337
log_every = 1
metrics = "metrics.jsonl"
"""


QWEN3 = dict(head_dim=64, qk_norm=True)


def torch_side(workdir, threads, steps, precision="f32", arch="llama"):
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    qwen3 = arch == "qwen3"
    extra = {"head_dim": QWEN3["head_dim"]} if qwen3 else {}
    hf = (Qwen3Config if qwen3 else LlamaConfig)(
        vocab_size=CFG["vocab_size"], hidden_size=CFG["n_embd"], intermediate_size=CFG["intermediate_size"],
        num_hidden_layers=CFG["n_layer"], num_attention_heads=CFG["n_head"],
        num_key_value_heads=CFG["n_kv_head"], max_position_embeddings=CFG["block_size"],
        rms_norm_eps=CFG["norm_eps"], rope_parameters={"rope_type": "default", "rope_theta": CFG["rope_theta"]},
        tie_word_embeddings=False, attn_implementation="sdpa", **extra,
    )
    model = (Qwen3ForCausalLM if qwen3 else LlamaForCausalLM)(hf).float()
    model.train()
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
              os.path.join(workdir, "init.safetensors"))
    g = torch.Generator().manual_seed(SEED + 1)
    stream = torch.randint(0, CFG["vocab_size"], (N_BATCHES, BATCH, CFG["block_size"] + 1), generator=g)
    inputs, targets = stream[..., :-1].contiguous(), stream[..., 1:].contiguous()
    save_file({"inputs": inputs, "targets": targets}, os.path.join(workdir, "batches.safetensors"))
    params = [p for p in model.parameters()]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False, fused=False)

    def step(it):
        opt.zero_grad(set_to_none=True)
        b = it % N_BATCHES
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(input_ids=inputs[b]).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets[b].view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    for it in range(WARMUP):
        step(it)
    times = []
    for it in range(WARMUP, WARMUP + steps):
        t0 = time.perf_counter()
        step(it)
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"median_ms": statistics.median(times), "torch_version": torch.__version__}))


def torch_step(workdir, threads, steps, precision, arch):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-side", workdir, "--threads", str(threads),
           "--steps", str(steps), "--precision", precision, "--arch", arch]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["median_ms"]


def weft_step(weft, workdir, threads):
    env = dict(os.environ, WEFT_NUM_THREADS=str(threads))
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    subprocess.run([weft, "train", "--quiet", "--config", os.path.join(workdir, "llama_step.toml")],
                   check=True, env=env)
    times = [json.loads(line)["step_ms"] for line in open(metrics)]
    return statistics.median(times[WARMUP:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--weft", default=os.path.join(ROOT, "target", "release", "weft"))
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--arch", choices=["llama", "qwen3"], default="llama")
    ap.add_argument("--torch-side", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_side:
        torch_side(args.torch_side, args.threads, args.steps, args.precision, args.arch)
        return
    work = tempfile.mkdtemp(prefix="weft-llama-step-")
    cfg = dict(CFG, **QWEN3) if args.arch == "qwen3" else CFG
    model = "\n".join(f"{k} = {json.dumps(v)}" for k, v in cfg.items())
    with open(os.path.join(work, "llama_step.toml"), "w") as f:
        f.write(TOML.format(model=model, steps=WARMUP + args.steps))
        if args.precision == "bf16":
            f.write('precision = "bf16"\n')
    torch_ms, weft_ms = [], []
    # the torch side writes the weights and batches weft reads: even repeats (the first among
    # them) run it first
    for r in range(args.repeat):
        if r % 2 == 0:
            torch_ms.append(torch_step(work, args.threads, args.steps, args.precision, args.arch))
            weft_ms.append(weft_step(args.weft, work, args.threads))
        else:
            weft_ms.append(weft_step(args.weft, work, args.threads))
            torch_ms.append(torch_step(work, args.threads, args.steps, args.precision, args.arch))
        print(f"[{r + 1}/{args.repeat}] torch {torch_ms[-1]:.1f} ms, weft {weft_ms[-1]:.1f} ms", file=sys.stderr)
    t, w = statistics.median(torch_ms), statistics.median(weft_ms)
    print("| threads | torch eager median ms | weft median ms | weft / torch |")
    print("|---:|---:|---:|---:|")
    print(f"| {args.threads} | {t:.1f} | {w:.1f} | {w / t:.2f} |")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
