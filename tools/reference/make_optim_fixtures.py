"""Writes PyTorch reference trajectories for weft-nn's optimizers, gradient clipping and schedules.

Run by hand (needs torch; CI never runs it) from the repository root:

    python3 tools/reference/make_optim_fixtures.py

It writes crates/weft-nn/tests/fixtures/optim.json, which crates/weft-nn/tests/optim.rs reads.
Re-run it after changing a case here and commit the regenerated JSON together with the script.

Format:

    {"generator", "torch_version",
     "params": {name: tensor},            initial float32 parameters: "weight" [3, 4], "bias" [4],
                                          "embed" [16, 8]
     "grads": [{name: tensor}, ...],      6 float32 gradients, one dict per step
     "cases": [case, ...],
     "schedules": [schedule, ...]}

A tensor is {"shape": [...], "bits": [...]}: each value, flat in row-major order, as the hex of its
IEEE bit pattern in its own dtype (8 digits for float32, 16 for float64), so that the Rust side reads
the exact values whatever its JSON float parser does (serde_json's default parser can be 1 ulp off).

A case is

    {"name", "optimizer": "sgd" | "adam", "dtype": "f32" | "f64",
     "config": {"momentum", "dampening", "nesterov"} or {"betas", "eps", "decoupled"},
     "groups": [{"params": [name, ...], "weight_decay"}],
     "schedule": {"warmup", "decay", "lr", "min_lr"},   get_lr's settings for the step learning rates
     "clip": max_norm or null,            clip_grad_norm_(all params, max_norm) before each step
     "no_grad": [[step, name], ...],      parameters whose .grad is None at that step
     "steps": [{"lr", "grad": step index into "grads", "total_norm" (or null),
                "params": {name: tensor}}]}

where "params" are the parameters after that step. Learning rates come from nanoGPT's get_lr (the
cosine schedule with warmup); long cases cycle through the 6 gradients. f64 cases start from the
same values widened to float64 and compute in float64.

A schedule is {"warmup", "decay", "lr", "min_lr", "its": [...], "values": [get_lr(it) for it in its]}.

Optimizers run with foreach=False (PyTorch's single-tensor code path, the one weft's fused loop
reproduces operation by operation); torch.set_num_threads(1). "embed" has 128 elements so that
ATen's vectorized loops run on it; the two small tensors go through their scalar tails. On x86 builds
with AVX2 or AVX-512 both use fused multiply-adds for add-with-alpha, lerp and addcmul, as weft does.

What is not bit-exact: PyTorch's sqrt on x86 is not correctly rounded (about 20% of its float32
and 1.4% of its float64 results are 1 ulp off; weft's is IEEE sqrt), so some Adam elements differ in
the last bit (relative ~1e-7 in float32); and PyTorch computes clipping norms in the gradients' dtype
with its own summation order (weft sums in f64). SGD agrees bit for bit.
"""

import json
import math
import os

import torch

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "..",
    "crates",
    "weft-nn",
    "tests",
    "fixtures",
    "optim.json",
)

NUM_GRADS = 6
# Gradient scales per step: some total norms fall below 1.0, some above, so clipping at 1.0 both
# triggers and not.
GRAD_SCALES = [0.05, 2.0, 0.3, 1.5, 0.1, 3.0]


def get_lr(it, warmup, decay, lr, min_lr):
    """nanoGPT's get_lr, verbatim (train.py)."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    decay_ratio = (it - warmup) / (decay - warmup)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (lr - min_lr)


def tensor_json(t):
    shape = list(t.shape)
    t = t.detach().reshape(-1)
    if t.dtype == torch.float32:
        bits = ["%08x" % (v & 0xFFFFFFFF) for v in t.view(torch.int32).tolist()]
    else:
        bits = ["%016x" % (v & 0xFFFFFFFFFFFFFFFF) for v in t.view(torch.int64).tolist()]
    return {"shape": shape, "bits": bits}


def initial_params():
    g = torch.Generator().manual_seed(1234)
    return {
        "weight": torch.randn(3, 4, generator=g, dtype=torch.float32) * 0.5,
        "bias": torch.randn(4, generator=g, dtype=torch.float32) * 0.1,
        "embed": torch.randn(16, 8, generator=g, dtype=torch.float32) * 0.5,
    }


def gradients():
    g = torch.Generator().manual_seed(5678)
    out = []
    for s in range(NUM_GRADS):
        out.append(
            {
                "weight": torch.randn(3, 4, generator=g, dtype=torch.float32) * GRAD_SCALES[s],
                "bias": torch.randn(4, generator=g, dtype=torch.float32) * GRAD_SCALES[s],
                "embed": torch.randn(16, 8, generator=g, dtype=torch.float32) * GRAD_SCALES[s] * 0.25,
            }
        )
    return out


def run_case(name, optimizer, config, groups, schedule, steps=NUM_GRADS, dtype="f32", clip=None, no_grad=()):
    torch_dtype = torch.float32 if dtype == "f32" else torch.float64
    params = {n: t.clone().to(torch_dtype).requires_grad_(True) for n, t in initial_params().items()}
    grads = gradients()
    torch_groups = [{"params": [params[n] for n in grp["params"]], "weight_decay": grp["weight_decay"]} for grp in groups]
    if optimizer == "sgd":
        opt = torch.optim.SGD(
            torch_groups,
            lr=0.0,
            momentum=config["momentum"],
            dampening=config["dampening"],
            nesterov=config["nesterov"],
            foreach=False,
        )
    else:
        cls = torch.optim.AdamW if config["decoupled"] else torch.optim.Adam
        opt = cls(torch_groups, lr=0.0, betas=tuple(config["betas"]), eps=config["eps"], foreach=False)
    skipped = {(s, n) for s, n in no_grad}
    out_steps = []
    for it in range(steps):
        lr = get_lr(it, **schedule)
        gi = it % NUM_GRADS
        for n, p in params.items():
            p.grad = None if (it, n) in skipped else grads[gi][n].clone().to(torch_dtype)
        total_norm = None
        if clip is not None:
            total_norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), clip, foreach=False))
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.step()
        out_steps.append(
            {
                "lr": lr,
                "grad": gi,
                "total_norm": total_norm,
                "params": {n: tensor_json(p) for n, p in params.items()},
            }
        )
    return {
        "name": name,
        "optimizer": optimizer,
        "dtype": dtype,
        "config": config,
        "groups": groups,
        "schedule": schedule,
        "clip": clip,
        "no_grad": [list(x) for x in no_grad],
        "steps": out_steps,
    }


SGD_SCHEDULE = {"warmup": 2, "decay": 4, "lr": 0.1, "min_lr": 0.01}
ADAM_SCHEDULE = {"warmup": 2, "decay": 4, "lr": 1e-2, "min_lr": 1e-3}
LONG_SCHEDULE = {"warmup": 10, "decay": 50, "lr": 3e-3, "min_lr": 3e-4}
ONE_GROUP = [{"params": ["weight", "bias", "embed"], "weight_decay": 0.0}]


def decay_groups(wd):
    """nanoGPT's split: matrices decay, biases do not."""
    return [{"params": ["weight", "embed"], "weight_decay": wd}, {"params": ["bias"], "weight_decay": 0.0}]


def sgd(momentum=0.0, dampening=0.0, nesterov=False):
    return {"momentum": momentum, "dampening": dampening, "nesterov": nesterov}


def adam(betas=(0.9, 0.999), eps=1e-8, decoupled=False):
    return {"betas": list(betas), "eps": eps, "decoupled": decoupled}


def cases():
    return [
        run_case("sgd/plain", "sgd", sgd(), ONE_GROUP, SGD_SCHEDULE),
        run_case("sgd/momentum_dampening", "sgd", sgd(0.9, 0.1), ONE_GROUP, SGD_SCHEDULE),
        run_case("sgd/nesterov_weight_decay", "sgd", sgd(0.9, 0.0, True), decay_groups(0.01), SGD_SCHEDULE),
        run_case(
            "sgd/momentum_missing_grads",
            "sgd",
            sgd(0.5, 0.2),
            [{"params": ["weight", "bias", "embed"], "weight_decay": 0.05}],
            SGD_SCHEDULE,
            no_grad=[(0, "bias"), (3, "weight")],
        ),
        run_case("sgd/nesterov_weight_decay_f64", "sgd", sgd(0.9, 0.0, True), decay_groups(0.01), SGD_SCHEDULE, dtype="f64"),
        run_case("adam/plain", "adam", adam(), ONE_GROUP, ADAM_SCHEDULE),
        run_case(
            "adam/l2_weight_decay",
            "adam",
            adam(),
            [{"params": ["weight", "bias", "embed"], "weight_decay": 0.01}],
            ADAM_SCHEDULE,
        ),
        # The bias misses two gradients, so its step count (and bias correction) lags the weight's.
        run_case(
            "adam/missing_grads",
            "adam",
            adam(eps=1e-6),
            decay_groups(0.02),
            ADAM_SCHEDULE,
            no_grad=[(1, "bias"), (2, "bias"), (4, "weight"), (0, "embed")],
        ),
        # beta1 = 0.3: PyTorch's lerp takes its other branch (weight 1 - beta1 >= 0.5).
        run_case("adam/small_beta1", "adam", adam(betas=(0.3, 0.9)), ONE_GROUP, ADAM_SCHEDULE),
        run_case("adamw/weight_decay", "adam", adam((0.9, 0.95), decoupled=True), decay_groups(0.1), ADAM_SCHEDULE),
        run_case(
            "adamw/clip",
            "adam",
            adam((0.9, 0.95), decoupled=True),
            decay_groups(0.1),
            ADAM_SCHEDULE,
            clip=1.0,
        ),
        run_case(
            "adamw/clip_long",
            "adam",
            adam((0.9, 0.95), decoupled=True),
            decay_groups(0.1),
            LONG_SCHEDULE,
            steps=60,
            clip=1.0,
        ),
        run_case(
            "adamw/clip_f64",
            "adam",
            adam((0.9, 0.95), decoupled=True),
            decay_groups(0.1),
            ADAM_SCHEDULE,
            dtype="f64",
            clip=1.0,
        ),
    ]


def schedules():
    settings = [
        {"warmup": 0, "decay": 10, "lr": 6e-4, "min_lr": 6e-5},
        {"warmup": 3, "decay": 10, "lr": 6e-4, "min_lr": 6e-5},
        {"warmup": 5, "decay": 6, "lr": 1.0, "min_lr": 0.0},
        {"warmup": 2000, "decay": 600000, "lr": 6e-4, "min_lr": 6e-5},
    ]
    out = []
    for s in settings:
        its = list(range(15)) if s["decay"] < 100 else [0, 1, 1999, 2000, 2001, 300000, 599999, 600000, 600001]
        out.append({**s, "its": its, "values": [get_lr(it, **s) for it in its]})
    return out


def main():
    torch.set_num_threads(1)
    doc = {
        "generator": "tools/reference/make_optim_fixtures.py",
        "torch_version": torch.__version__.split("+")[0],
        "params": {n: tensor_json(t) for n, t in initial_params().items()},
        "grads": [{n: tensor_json(t) for n, t in g.items()} for g in gradients()],
        "cases": cases(),
        "schedules": schedules(),
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(doc['cases'])} cases to {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
