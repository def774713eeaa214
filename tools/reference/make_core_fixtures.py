"""Writes PyTorch reference values for weft-core ops whose semantics are subtle.

Run by hand (needs torch; CI never runs it) from the repository root:

    python3 tools/reference/make_core_fixtures.py

It writes crates/weft-core/tests/fixtures/core_ops.json, which
crates/weft-core/tests/torch_fixtures.rs reads. Re-run it after changing a case here and commit the
regenerated JSON together with the script.

Format: {"torch_version", "cases": [case, ...]}, where each case is

    {"name": "op/variant", "op": "...", "dtype": "f64" | "f32", "params": {...},
     "inputs": {name: tensor}, "upstream": tensor, "output": tensor, "grads": {name: tensor}}

and a tensor is {"shape": [...], "data": [flat row-major values]} (integer ids for index inputs).
"grads" are the gradients of sum(output * upstream) with respect to the named inputs; for a scalar
output (cross-entropy) "upstream" is a 0-d tensor, so that is upstream * dloss/dinput.

Inputs are small and deterministic (torch.manual_seed plus explicit lists). f64 cases are computed
in float64, so the Rust side compares them to ~1e-10 absolute + 1e-9 relative. Cases with dtype
"f32" are computed by PyTorch in float32 from float32 inputs (stored exactly): they exercise weft's
f32 kernels, which use branch-free polynomial exp/tanh/erf approximations and so differ from
PyTorch in the last bits; a tolerance of ~1e-5 relative is expected to pass for them.
"""

import json
import os

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "..",
    "crates",
    "weft-core",
    "tests",
    "fixtures",
    "core_ops.json",
)

CASES = []


def tensor_json(t):
    t = t.detach()
    flat = t.reshape(-1)
    if t.dtype in (torch.int64, torch.int32):
        data = [int(v) for v in flat.tolist()]
    elif t.dtype == torch.float32:
        # The shortest decimal that reads back as the same float32 value.
        data = [float(str(v)) for v in flat.numpy()]
    else:
        # 15 significant digits: far below the test tolerance, and inputs (rounded to 4 decimals
        # by randn()) keep their short exact form.
        data = [float("%.15g" % v) for v in flat.tolist()]
    return {"shape": list(t.shape), "data": data}


def add_case(name, op, dtype, params, inputs, fn, grad_inputs, upstream_seed):
    """Runs fn(**inputs) and records output and gradients of sum(output * upstream).

    inputs: name -> tensor (float inputs listed in grad_inputs get requires_grad).
    """
    leaves = {}
    for k, v in inputs.items():
        v = v.detach().clone()
        if k in grad_inputs:
            v.requires_grad_(True)
        leaves[k] = v
    out = fn(**leaves)
    g = torch.Generator().manual_seed(upstream_seed)
    upstream = torch.randn(out.shape, generator=g, dtype=torch.float64).mul(1e4).round().div(1e4).to(out.dtype)
    (out * upstream).sum().backward()
    grads = {}
    for k in grad_inputs:
        gk = leaves[k].grad
        grads[k] = tensor_json(gk if gk is not None else torch.zeros_like(leaves[k]))
    CASES.append(
        {
            "name": name,
            "op": op,
            "dtype": dtype,
            "params": params,
            "inputs": {k: tensor_json(v) for k, v in inputs.items()},
            "upstream": tensor_json(upstream),
            "output": tensor_json(out),
            "grads": grads,
        }
    )


def randn(*shape, dtype=torch.float64, scale=1.0):
    """Seeded normal values rounded to 4 decimals (short in the JSON, exact in f64 and f32 cases
    alike after the cast), then cast to dtype."""
    return torch.randn(*shape, dtype=torch.float64).mul(scale).mul(1e4).round().div(1e4).to(dtype)


def cross_entropy_cases():
    torch.manual_seed(1)
    logits = randn(7, 5, scale=2.0)
    targets = torch.tensor([3, -100, 0, 4, -100, 1, 3], dtype=torch.int64)
    for ls in (0.0, 0.1):
        add_case(
            f"cross_entropy/ignore_ls{ls}",
            "cross_entropy",
            "f64",
            {"ignore_index": -100, "label_smoothing": ls},
            {"logits": logits, "targets": targets},
            lambda logits, targets, ls=ls: F.cross_entropy(
                logits, targets, ignore_index=-100, label_smoothing=ls, reduction="mean"
            ),
            ["logits"],
            upstream_seed=100,
        )
    # A different ignore index, and no ignored rows.
    targets2 = torch.tensor([0, 2, 2, 4, 1, 0, 3], dtype=torch.int64)
    add_case(
        "cross_entropy/no_ignored_ls0.1",
        "cross_entropy",
        "f64",
        {"ignore_index": -100, "label_smoothing": 0.1},
        {"logits": logits, "targets": targets2},
        lambda logits, targets: F.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.1),
        ["logits"],
        upstream_seed=101,
    )
    targets3 = torch.tensor([0, 2, 2, 4, 1, 0, 3], dtype=torch.int64)
    add_case(
        "cross_entropy/ignore_index2_ls0.1",
        "cross_entropy",
        "f64",
        {"ignore_index": 2, "label_smoothing": 0.1},
        {"logits": logits, "targets": targets3},
        lambda logits, targets: F.cross_entropy(logits, targets, ignore_index=2, label_smoothing=0.1),
        ["logits"],
        upstream_seed=102,
    )
    # float32, wide enough rows for the vectorized kernels.
    torch.manual_seed(2)
    logits32 = randn(10, 37, dtype=torch.float32, scale=3.0)
    t32 = torch.tensor([5, -100, 36, 0, 17, 17, -100, 2, 30, 9], dtype=torch.int64)
    for ls in (0.0, 0.1):
        add_case(
            f"cross_entropy/f32_ignore_ls{ls}",
            "cross_entropy",
            "f32",
            {"ignore_index": -100, "label_smoothing": ls},
            {"logits": logits32, "targets": t32},
            lambda logits, targets, ls=ls: F.cross_entropy(
                logits, targets, ignore_index=-100, label_smoothing=ls
            ),
            ["logits"],
            upstream_seed=103,
        )


UNARY = {
    "gelu": lambda x: F.gelu(x, approximate="none"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def unary_cases():
    # Explicit points across the interesting range (tails, near zero) plus random ones.
    pts = [-9.0, -6.5, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, -0.1, -1e-4, 0.0, 1e-4, 0.1, 0.5, 1.0,
           1.5, 2.0, 3.0, 4.0, 6.5, 9.0]
    torch.manual_seed(3)
    x = torch.cat([torch.tensor(pts, dtype=torch.float64), randn(11, scale=2.0)]).reshape(4, 8)
    for name, fn in UNARY.items():
        add_case(f"unary/{name}", "unary", "f64", {"fn": name}, {"x": x},
                 lambda x, fn=fn: fn(x), ["x"], upstream_seed=200)
    # float32 GELU over 200 points in [-8, 8] (covers the vector loop and its remainder).
    x32 = torch.linspace(-8.0, 8.0, 203, dtype=torch.float64).to(torch.float32)
    for name in ("gelu", "gelu_tanh"):
        add_case(f"unary/f32_{name}", "unary", "f32", {"fn": name}, {"x": x32},
                 lambda x, fn=UNARY[name]: fn(x), ["x"], upstream_seed=201)


def var_cases():
    torch.manual_seed(4)
    x = randn(3, 4, 5, scale=1.5).add(0.7)
    specs = [
        ("dim1_unbiased", [1], 1, False),
        ("dim1_biased", [1], 0, False),
        ("dim-1_unbiased_keepdim", [-1], 1, True),
        ("dims0_2_biased_keepdim", [0, 2], 0, True),
        ("all_unbiased", [], 1, False),
        ("all_biased", [], 0, False),
    ]
    for name, dims, corr, keep in specs:
        def fn(x, dims=dims, corr=corr, keep=keep):
            return torch.var(x, dim=dims if dims else None, correction=corr, keepdim=keep)

        add_case(f"var/{name}", "var", "f64", {"dims": dims, "correction": corr, "keepdim": keep},
                 {"x": x}, fn, ["x"], upstream_seed=300)


def norm_cases():
    torch.manual_seed(5)
    x = randn(2, 3, 7, scale=2.0).add(0.5)
    w = randn(7).add(1.0)
    b = randn(7)
    add_case("layer_norm/affine", "layer_norm", "f64", {"eps": 1e-5},
             {"x": x, "weight": w, "bias": b},
             lambda x, weight, bias: F.layer_norm(x, (7,), weight, bias, eps=1e-5),
             ["x", "weight", "bias"], upstream_seed=400)
    # Small variance rows, where eps matters.
    xs = randn(3, 6, scale=1e-3)
    add_case("layer_norm/small_var_eps", "layer_norm", "f64", {"eps": 1e-5},
             {"x": xs, "weight": w[:6].clone(), "bias": b[:6].clone()},
             lambda x, weight, bias: F.layer_norm(x, (6,), weight, bias, eps=1e-5),
             ["x", "weight", "bias"], upstream_seed=401)
    add_case("rms_norm/weight", "rms_norm", "f64", {"eps": 1e-6},
             {"x": x, "weight": w},
             lambda x, weight: F.rms_norm(x, (7,), weight, eps=1e-6),
             ["x", "weight"], upstream_seed=402)
    add_case("rms_norm/small_eps1e-3", "rms_norm", "f64", {"eps": 1e-3},
             {"x": xs, "weight": w[:6].clone()},
             lambda x, weight: F.rms_norm(x, (6,), weight, eps=1e-3),
             ["x", "weight"], upstream_seed=403)
    # float32 layer norm, rows long enough for the vectorized kernel.
    torch.manual_seed(6)
    x32 = randn(4, 77, dtype=torch.float32, scale=3.0).add(1.0)
    w32 = randn(77, dtype=torch.float32).add(1.0)
    b32 = randn(77, dtype=torch.float32)
    add_case("layer_norm/f32_affine", "layer_norm", "f32", {"eps": 1e-5},
             {"x": x32, "weight": w32, "bias": b32},
             lambda x, weight, bias: F.layer_norm(x, (77,), weight, bias, eps=1e-5),
             ["x", "weight", "bias"], upstream_seed=404)


def softmax_cases():
    torch.manual_seed(7)
    x = randn(2, 3, 4, scale=2.0)
    for log in (False, True):
        name = "log_softmax" if log else "softmax"
        f = F.log_softmax if log else F.softmax
        for dim in (1, 0):
            add_case(f"{name}/dim{dim}", name, "f64", {"dim": dim}, {"x": x},
                     lambda x, f=f, dim=dim: f(x, dim=dim), ["x"], upstream_seed=500)
    torch.manual_seed(8)
    x32 = randn(4, 67, dtype=torch.float32, scale=4.0)
    for log in (False, True):
        name = "log_softmax" if log else "softmax"
        f = F.log_softmax if log else F.softmax
        add_case(f"{name}/f32_last", name, "f32", {"dim": -1}, {"x": x32},
                 lambda x, f=f: f(x, dim=-1), ["x"], upstream_seed=501)
    x32b = randn(2, 19, 5, dtype=torch.float32, scale=4.0)
    add_case("softmax/f32_dim1", "softmax", "f32", {"dim": 1}, {"x": x32b},
             lambda x: F.softmax(x, dim=1), ["x"], upstream_seed=502)


def attention_cases():
    torch.manual_seed(9)
    specs = [
        # name, q shape, k shape, v shape, causal, scale
        ("causal", (2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4), True, None),
        ("causal_dv3", (1, 3, 6, 4), (1, 3, 6, 4), (1, 3, 6, 3), True, None),
        # T < S: PyTorch's is_causal aligns the mask top-left (query i sees keys 0..=i).
        ("causal_t3_s5", (1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4), True, None),
        ("causal_t5_s3", (1, 2, 5, 4), (1, 2, 3, 4), (1, 2, 3, 4), True, None),
        ("full_scale0.3", (2, 4, 4), (2, 6, 4), (2, 6, 2), False, 0.3),
    ]
    for name, qs, ks, vs, causal, scale in specs:
        q, k, v = randn(*qs), randn(*ks), randn(*vs)
        add_case(f"attention/{name}", "attention", "f64", {"causal": causal, "scale": scale},
                 {"q": q, "k": k, "v": v},
                 lambda q, k, v, causal=causal, scale=scale: F.scaled_dot_product_attention(
                     q, k, v, is_causal=causal, scale=scale),
                 ["q", "k", "v"], upstream_seed=600)


def conv_cases():
    torch.manual_seed(10)
    specs = [
        # name, x shape, w shape, stride, padding, dilation, groups, bias
        ("basic_pad1", (2, 2, 5, 4), (3, 2, 3, 3), (1, 1), (1, 1), (1, 1), 1, True),
        ("stride2x1_pad1x2_dil2x1_groups2", (1, 4, 7, 6), (6, 2, 3, 2), (2, 1), (1, 2), (2, 1), 2, True),
        ("stride2_dil2_groups3_nobias", (1, 6, 9, 8), (3, 2, 2, 3), (2, 2), (0, 1), (2, 2), 3, False),
    ]
    for name, xs, ws, stride, padding, dilation, groups, has_bias in specs:
        x, w = randn(*xs), randn(*ws)
        inputs = {"x": x, "weight": w}
        if has_bias:
            inputs["bias"] = randn(ws[0])
        add_case(f"conv2d/{name}", "conv2d", "f64",
                 {"stride": list(stride), "padding": list(padding), "dilation": list(dilation), "groups": groups},
                 inputs,
                 lambda x, weight, bias=None, s=stride, p=padding, d=dilation, g=groups: F.conv2d(
                     x, weight, bias, stride=s, padding=p, dilation=d, groups=g),
                 list(inputs), upstream_seed=700)


def pool_cases():
    torch.manual_seed(11)
    x = randn(1, 2, 7, 6)
    specs = [
        ("k3x2_s2_p1", (3, 2), (2, 2), (1, 1)),
        ("k3_s1_p1_overlap", (3, 3), (1, 1), (1, 1)),
        ("k2_s2_p0", (2, 2), (2, 2), (0, 0)),
    ]
    for name, k, s, p in specs:
        add_case(f"max_pool2d/{name}", "max_pool2d", "f64",
                 {"kernel": list(k), "stride": list(s), "padding": list(p)}, {"x": x},
                 lambda x, k=k, s=s, p=p: F.max_pool2d(x, k, s, p), ["x"], upstream_seed=800)
        add_case(f"avg_pool2d/{name}", "avg_pool2d", "f64",
                 {"kernel": list(k), "stride": list(s), "padding": list(p)}, {"x": x},
                 lambda x, k=k, s=s, p=p: F.avg_pool2d(x, k, s, p), ["x"], upstream_seed=801)


def embedding_cases():
    torch.manual_seed(12)
    w = randn(6, 3)
    ids = torch.tensor([[1, 3, 1, 5], [4, 1, 0, 3]], dtype=torch.int64)
    add_case("embedding/repeated_ids", "embedding", "f64", {}, {"weight": w, "ids": ids},
             lambda weight, ids: F.embedding(ids, weight), ["weight"], upstream_seed=900)


def amax_cases():
    x = torch.tensor(
        [
            [1.0, 3.0, 3.0, -2.0, 3.0],
            [0.5, -1.0, 0.5, 0.25, 0.0],
            [-4.0, -4.0, -4.0, -4.0, -4.0],
            [2.0, 7.0, 1.0, 7.0, 6.0],
        ],
        dtype=torch.float64,
    )
    specs = [
        ("dim1_ties", [1], False),
        ("dim0_ties_keepdim", [0], True),
        ("all_ties", [], False),
    ]
    for name, dims, keep in specs:
        add_case(f"max/{name}", "max", "f64", {"dims": dims, "keepdim": keep}, {"x": x},
                 lambda x, dims=dims, keep=keep: torch.amax(x, dim=dims, keepdim=keep),
                 ["x"], upstream_seed=1000)


def main():
    torch.set_num_threads(1)
    cross_entropy_cases()
    unary_cases()
    var_cases()
    norm_cases()
    softmax_cases()
    attention_cases()
    conv_cases()
    pool_cases()
    embedding_cases()
    amax_cases()
    doc = {
        "generator": "tools/reference/make_core_fixtures.py",
        "torch_version": torch.__version__.split("+")[0],
        "cases": CASES,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(CASES)} cases to {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
