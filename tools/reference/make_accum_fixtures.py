"""Writes PyTorch reference runs with gradient accumulation, and learning-rate schedules from
Hugging Face's `transformers`, that weft must reproduce.

Run by hand (needs torch, transformers and safetensors; CI never runs it) from the repository
root:

    python3 tools/reference/make_accum_fixtures.py

It reuses the models, optimizers and data of make_train_fixtures.py (same folder) and writes

  crates/weft-train/tests/fixtures/{gpt,mlp}_adamw_accum{2,4}/
    init.safetensors     the initial weights
    batches.safetensors  `inputs` and `targets`, shape [S, B, ...]: the micro-batches
    merged.safetensors   the same rows as [S / K, K * B, ...]: merged batch i is micro-batches
                         i K .. i K + K - 1, so that a run without accumulation on it sees the
                         same data as the accumulating run
    expected.json        {"losses", "lrs", "grad_norms", "grad_accum", "torch_version"}
    run.toml             the weft config (train.grad_accum = K)

  crates/weft-nn/tests/fixtures/hf_schedules.json
    learning rates of transformers' get_linear_schedule_with_warmup and get_wsd_schedule
    (through torch's LambdaLR), step by step, for a few settings

What is reproduced, step by step (float32 on the CPU, one thread):

    lr = the schedule's rate for step `it` (LambdaLR for "linear" and "wsd")
    optimizer.zero_grad()
    for j in 0..K:
        b = (it * K + j) % S
        loss_j = mean cross-entropy of model(batch[b])
        (loss_j / K).backward()             # gradients summed over the K micro-batches
    grad_norm = clip_grad_norm_(all params, grad_clip)
    optimizer.step()

"losses" holds the mean of the K values loss_j.item(), "lrs" the rate of the step.

Schedules (weft's `[schedule]` with `min_lr = 0`):

    linear (transformers.get_linear_schedule_with_warmup(warmup, decay_steps)):
        it <  warmup:       lr * (it / warmup)
        otherwise:          lr * max(0, (decay_steps - it) / (decay_steps - warmup))
    wsd (transformers.get_wsd_schedule(warmup, decay, num_training_steps=total, decay_type)):
        it <  warmup:       lr * (it / warmup)
        it <  total-decay:  lr
        it <  total:        lr * shape((it - (total - decay)) / decay)
        otherwise:          0
"""

import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import get_linear_schedule_with_warmup, get_wsd_schedule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_train_fixtures as base  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NN_FIXTURES = os.path.join(REPO, "crates", "weft-nn", "tests", "fixtures")

STEPS = base.STEPS  # 40
S = base.NUM_BATCHES  # 8 micro-batches, cycled


def scheduler_for(optimizer, sched):
    """torch LambdaLR of the `[schedule]` dict (None: weft's own cosine/constant, set by hand)."""
    kind = sched["kind"]
    if kind == "linear":
        assert sched["min_lr"] == 0.0
        return get_linear_schedule_with_warmup(optimizer, sched["warmup_steps"], sched["decay_steps"])
    if kind == "wsd":
        assert sched["min_lr"] == 0.0
        shape = {"linear": "linear", "cosine": "cosine", "sqrt": "1-sqrt"}[sched.get("decay_shape", "linear")]
        return get_wsd_schedule(
            optimizer,
            num_warmup_steps=sched["warmup_steps"],
            num_decay_steps=sched["decay_steps"],
            num_training_steps=sched.get("total_steps", STEPS),
            decay_type=shape,
        )
    return None


# name: (model kind, cfg, micro-batch rows, data seed, K, schedule)
CASES = [
    ("gpt_adamw_accum2", "gpt", base.GPT_CFG, 4, 1, 2,
     dict(kind="linear", warmup_steps=5, decay_steps=STEPS, min_lr=0.0)),
    ("gpt_adamw_accum4", "gpt", base.GPT_CFG, 4, 1, 4,
     dict(kind="wsd", warmup_steps=5, decay_steps=10, min_lr=0.0)),
    ("mlp_adamw_accum2", "mlp", base.MLP_CFG, 8, 2, 2, None),
    ("mlp_adamw_accum4", "mlp", base.MLP_CFG, 8, 2, 4, None),
]


def run_case(name, kind, cfg, batch, data_seed, k, sched_override):
    assert S % k == 0
    torch.manual_seed(base.SEED)
    model = base.MODELS[kind](dict(cfg))
    model.train()
    init = model.init_tensors()
    inputs, targets = base.BATCHES[kind](cfg, batch, data_seed)
    opt_cfg, sched = base.optim_setup("adamw", kind)
    if sched_override is not None:
        sched = sched_override
    optimizer = base.make_optimizer(model, opt_cfg)
    scheduler = scheduler_for(optimizer, sched)
    clip = opt_cfg["grad_clip"]
    params = list(model.parameters())

    losses, lrs, norms = [], [], []
    for it in range(STEPS):
        if scheduler is None:
            for group in optimizer.param_groups:
                group["lr"] = base.lr_at(it, opt_cfg, sched)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(k):
            b = (it * k + j) % S
            loss = model.loss(inputs[b], targets[b])
            (loss / k).backward()
            total += float(loss.item())
        norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=False)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(total / k)
        lrs.append(float(lr))
        norms.append(float(norm.item()))

    folder = os.path.join(base.FIXTURES, name)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    save_file(dict(sorted(init.items())), os.path.join(folder, "init.safetensors"))
    save_file({"inputs": inputs, "targets": targets}, os.path.join(folder, "batches.safetensors"))
    merged = {
        "inputs": inputs.reshape(S // k, k * batch, *inputs.shape[2:]).contiguous(),
        "targets": targets.reshape(S // k, k * batch, *targets.shape[2:]).contiguous(),
    }
    save_file(merged, os.path.join(folder, "merged.safetensors"))
    doc = {
        "losses": losses,
        "lrs": lrs,
        "grad_norms": norms,
        "grad_accum": k,
        "torch_version": torch.__version__.split("+")[0],
    }
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    toml = base.run_toml(kind, cfg, opt_cfg, sched)
    toml = toml.replace("log_every = 1\n", f"log_every = 1\ngrad_accum = {k}\n")
    with open(os.path.join(folder, "run.toml"), "w") as f:
        f.write(toml)
    return losses


SCHEDULES = [
    dict(kind="linear", warmup_steps=0, decay_steps=20, min_lr=0.0),
    dict(kind="linear", warmup_steps=7, decay_steps=20, min_lr=0.0),
    dict(kind="linear", warmup_steps=7, decay_steps=7, min_lr=0.0),
    dict(kind="wsd", warmup_steps=3, decay_steps=6, total_steps=20, min_lr=0.0, decay_shape="linear"),
    dict(kind="wsd", warmup_steps=3, decay_steps=6, total_steps=20, min_lr=0.0, decay_shape="cosine"),
    dict(kind="wsd", warmup_steps=0, decay_steps=9, total_steps=20, min_lr=0.0, decay_shape="sqrt"),
    dict(kind="wsd", warmup_steps=4, decay_steps=0, total_steps=20, min_lr=0.0, decay_shape="linear"),
]


def schedules():
    """The rates LambdaLR gives for 25 steps of each of SCHEDULES, peak lr 3e-3."""
    out = []
    for sched in SCHEDULES:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=3e-3)
        s = scheduler_for(opt, dict(sched, total_steps=sched.get("total_steps", STEPS)))
        rates = []
        for _ in range(25):
            rates.append(float(opt.param_groups[0]["lr"]))
            opt.step()
            s.step()
        out.append(dict(sched, lr=3e-3, lrs=rates))
    with open(os.path.join(NN_FIXTURES, "hf_schedules.json"), "w") as f:
        import transformers

        json.dump({"schedules": out, "transformers_version": transformers.__version__}, f, indent=1)
        f.write("\n")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, writing to {base.FIXTURES}")
    for name, kind, cfg, batch, data_seed, k, sched in CASES:
        losses = run_case(name, kind, cfg, batch, data_seed, k, sched)
        print(f"{name:<18} loss[0] {losses[0]:.6f} loss[39] {losses[39]:.6f}")
    schedules()
    print(f"wrote {os.path.join(NN_FIXTURES, 'hf_schedules.json')}")


if __name__ == "__main__":
    main()
