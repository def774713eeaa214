"""Writes PyTorch reference training runs that weft's trainer must reproduce.

Run by hand (needs torch and safetensors; CI never runs it) from the repository root:

    python3 tools/reference/make_train_fixtures.py

It writes one folder per case under crates/weft-train/tests/fixtures/, named {model}_{optim}
(gpt_adamw, gpt_adam, gpt_sgd, mlp_*, convnet_*) plus gpt_nobias_adamw, each holding

    init.safetensors     the initial weights (float32, PyTorch parameter names, see below)
    batches.safetensors  `inputs` and `targets`, shape [S, B, ...]; step i uses batch i mod S
    expected.json        {"losses": [...], "lrs": [...], "grad_norms": [... or null],
                          "torch_version": "..."}, one entry per step
    run.toml             the weft config of the run, paths relative to the folder

Re-run it after changing a case here and commit the regenerated files together with the script.
The output is deterministic: every run (same torch version) writes byte-identical files.

What is reproduced, step by step (everything float32 on the CPU, dropout 0, one thread):

    lr = schedule(it)                          # set into every parameter group
    optimizer.zero_grad()
    loss = mean cross-entropy of model(batch[it % S])
    loss.backward()
    grad_norm = clip_grad_norm_(all params, grad_clip)   # only when grad_clip is set
    optimizer.step()

"losses" holds loss.item() of that forward (before the update), "lrs" the lr used by that step and
"grad_norms" the total L2 norm of all gradients before clipping (null when there is no clipping).

Parameter groups (nanoGPT's configure_optimizers): parameters with dim >= 2 get the weight decay,
the others (biases, LayerNorm weights) none; the tied GPT weight is one parameter. The same split
is used for all optimizers: AdamW (decoupled decay), Adam (torch's weight_decay, i.e. L2 added to
the gradient) and SGD (momentum, dampening 0, nesterov, torch's weight_decay).

Schedules: "constant" (lr every step) or "cosine", nanoGPT's get_lr(it):

    it < warmup_steps:  lr * (it + 1) / (warmup_steps + 1)
    it > decay_steps:   min_lr
    otherwise:          min_lr + 0.5 * (1 + cos(pi * (it - warmup_steps) / (decay_steps - warmup_steps)))
                                * (lr - min_lr)

computed in float64 (Python floats) from the values written in run.toml.

Models (state_dict names are the contract with weft):

  gpt      nanoGPT's layout: transformer.wte.weight [V, C], transformer.wpe.weight [block_size, C],
           transformer.h.{i}.ln_1.{weight,bias}, .attn.c_attn.{weight [3C, C], bias} (q, k, v fused
           in that order along the output dim), .attn.c_proj, .ln_2, .mlp.c_fc [4C, C],
           .mlp.c_proj [C, 4C], transformer.ln_f, and lm_head.weight tied to transformer.wte.weight.
           Pre-norm blocks, exact erf GELU, causal scaled_dot_product_attention with scale
           1/sqrt(head_dim), LayerNorm eps 1e-5. With bias = false there are no Linear or LayerNorm
           biases at all. init.safetensors holds the tied weight under both names
           (transformer.wte.weight and lm_head.weight, equal copies).
           nanoGPT init: normal(0, 0.02) for Linear and Embedding weights, zero biases,
           normal(0, 0.02 / sqrt(2 * n_layer)) for every c_proj weight.
  mlp      layers.{i}.{weight,bias} for the i-th nn.Linear, the activation between Linears and none
           after the last; inputs float32 [B, in_features]. PyTorch default init.
  convnet  per stage i: convs.{i}.{weight [c_out, c_in, 3, 3], bias}, Conv2d(k=3, padding=1), ReLU,
           MaxPool2d(2); then flatten (NCHW order) and fc.{weight, bias}. Inputs float32
           [B, in_channels, image_size, image_size]. PyTorch default init.

Targets are int64 class ids (for gpt: token ids, the inputs shifted by one within a token stream
drawn from a fixed random Markov chain, so that the loss has something to learn).
"""

import json
import math
import os
import shutil

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

FIXTURES = os.path.normpath(
    os.path.join(
        os.path.dirname(os.path.abspath(__file__)),
        "..",
        "..",
        "crates",
        "weft-train",
        "tests",
        "fixtures",
    )
)

STEPS = 40
NUM_BATCHES = 8  # S: distinct batches, cycled
SEED = 1337  # model init seed (also written to run.toml's [train] seed)


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg["n_embd"] % cfg["n_head"] == 0
        self.c_attn = nn.Linear(cfg["n_embd"], 3 * cfg["n_embd"], bias=cfg["bias"])
        self.c_proj = nn.Linear(cfg["n_embd"], cfg["n_embd"], bias=cfg["bias"])
        self.n_head = cfg["n_head"]
        self.n_embd = cfg["n_embd"]

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hd = C // self.n_head
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg["n_embd"], 4 * cfg["n_embd"], bias=cfg["bias"])
        self.c_proj = nn.Linear(4 * cfg["n_embd"], cfg["n_embd"], bias=cfg["bias"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))  # exact erf GELU


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg["n_embd"], eps=1e-5, bias=cfg["bias"])
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg["n_embd"], eps=1e-5, bias=cfg["bias"])
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """nanoGPT's model; cfg keys: vocab_size, block_size, n_layer, n_head, n_embd, bias, dropout."""

    def __init__(self, cfg):
        super().__init__()
        assert cfg["dropout"] == 0.0
        self.cfg = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg["vocab_size"], cfg["n_embd"]),
                wpe=nn.Embedding(cfg["block_size"], cfg["n_embd"]),
                h=nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])]),
                ln_f=nn.LayerNorm(cfg["n_embd"], eps=1e-5, bias=cfg["bias"]),
            )
        )
        self.lm_head = nn.Linear(cfg["n_embd"], cfg["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying (one Parameter)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg["n_layer"]))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def init_tensors(self):
        """The weights to save: unique tensors plus lm_head.weight as a separate copy."""
        sd = {k: v.detach().clone().contiguous() for k, v in self.state_dict().items()}
        sd["lm_head.weight"] = self.transformer.wte.weight.detach().clone().contiguous()
        return sd


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh}


class MLPClassifier(nn.Module):
    """cfg keys: in_features, hidden (list), out_features, activation."""

    def __init__(self, cfg):
        super().__init__()
        sizes = [cfg["in_features"]] + list(cfg["hidden"]) + [cfg["out_features"]]
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])])
        self.act = ACTIVATIONS[cfg["activation"]]

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = self.act(x)
        return x

    def loss(self, x, targets):
        return F.cross_entropy(self(x), targets)

    def init_tensors(self):
        return {k: v.detach().clone().contiguous() for k, v in self.state_dict().items()}


class ConvNet(nn.Module):
    """cfg keys: in_channels, image_size, channels (list), num_classes."""

    def __init__(self, cfg):
        super().__init__()
        chans = [cfg["in_channels"]] + list(cfg["channels"])
        self.convs = nn.ModuleList(
            [nn.Conv2d(a, b, kernel_size=3, padding=1) for a, b in zip(chans[:-1], chans[1:])]
        )
        side = cfg["image_size"] // (2 ** len(cfg["channels"]))
        assert side * 2 ** len(cfg["channels"]) == cfg["image_size"]
        self.fc = nn.Linear(chans[-1] * side * side, cfg["num_classes"])

    def forward(self, x):
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        return self.fc(x.flatten(1))

    def loss(self, x, targets):
        return F.cross_entropy(self(x), targets)

    def init_tensors(self):
        return {k: v.detach().clone().contiguous() for k, v in self.state_dict().items()}


MODELS = {"gpt": GPT, "mlp": MLPClassifier, "convnet": ConvNet}


# ---------------------------------------------------------------------------------------------
# Optimizer, schedule
# ---------------------------------------------------------------------------------------------


def param_groups(model, weight_decay):
    """nanoGPT's split: dim >= 2 decays, the rest not; named_parameters() dedups tied weights."""
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    nodecay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": nodecay, "weight_decay": 0.0},
    ]


def make_optimizer(model, opt):
    groups = param_groups(model, opt["weight_decay"])
    kind = opt["kind"]
    if kind == "adamw":
        return torch.optim.AdamW(
            groups, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"], foreach=False, fused=False
        )
    if kind == "adam":
        return torch.optim.Adam(
            groups, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"], foreach=False, fused=False
        )
    if kind == "sgd":
        return torch.optim.SGD(
            groups, lr=opt["lr"], momentum=opt["momentum"], dampening=0.0, nesterov=opt["nesterov"],
            foreach=False, fused=False,
        )
    raise ValueError(kind)


def lr_at(it, opt, sched):
    lr = opt["lr"]
    if sched["kind"] == "constant":
        return lr
    assert sched["kind"] == "cosine"
    warmup, decay, min_lr = sched["warmup_steps"], sched["decay_steps"], sched["min_lr"]
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    ratio = (it - warmup) / (decay - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (lr - min_lr)


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def gpt_batches(cfg, batch, seed):
    """Token streams from a fixed random Markov chain (3 likely successors per token)."""
    g = torch.Generator().manual_seed(seed)
    V, T = cfg["vocab_size"], cfg["block_size"]
    logits = torch.randn(V, V, generator=g) * 0.5
    succ = torch.randint(0, V, (V, 3), generator=g)
    for v in range(V):
        logits[v, succ[v]] += 4.0
    probs = torch.softmax(logits, dim=1)
    n_seq = NUM_BATCHES * batch
    seqs = torch.empty(n_seq, T + 1, dtype=torch.int64)
    seqs[:, 0] = torch.randint(0, V, (n_seq,), generator=g)
    for t in range(1, T + 1):
        seqs[:, t] = torch.multinomial(probs[seqs[:, t - 1]], 1, generator=g).squeeze(1)
    inputs = seqs[:, :-1].reshape(NUM_BATCHES, batch, T).contiguous()
    targets = seqs[:, 1:].reshape(NUM_BATCHES, batch, T).contiguous()
    return inputs, targets


def mlp_batches(cfg, batch, seed):
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(NUM_BATCHES, batch, cfg["in_features"], generator=g)
    # Labels from a fixed random linear map plus noise, so that there is something to learn.
    w = torch.randn(cfg["in_features"], cfg["out_features"], generator=g)
    scores = inputs @ w + 0.5 * torch.randn(NUM_BATCHES, batch, cfg["out_features"], generator=g)
    targets = scores.argmax(-1).to(torch.int64)
    return inputs.contiguous(), targets.contiguous()


def convnet_batches(cfg, batch, seed):
    g = torch.Generator().manual_seed(seed)
    n = cfg["image_size"]
    inputs = torch.randn(NUM_BATCHES, batch, cfg["in_channels"], n, n, generator=g)
    targets = torch.randint(0, cfg["num_classes"], (NUM_BATCHES, batch), generator=g)
    return inputs.contiguous(), targets.contiguous()


BATCHES = {"gpt": gpt_batches, "mlp": mlp_batches, "convnet": convnet_batches}


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

GPT_CFG = dict(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=True, dropout=0.0)
MLP_CFG = dict(in_features=20, hidden=[32, 16], out_features=5, activation="gelu")
CONVNET_CFG = dict(in_channels=1, image_size=8, channels=[4, 8], num_classes=10)

MODEL_SETUPS = {
    # name: (kind, cfg, batch size, data seed)
    "gpt": ("gpt", GPT_CFG, 4, 1),
    "mlp": ("mlp", MLP_CFG, 8, 2),
    "convnet": ("convnet", CONVNET_CFG, 4, 3),
}


def optim_setup(kind, model_kind):
    """(optim, schedule) dicts, in run.toml's key order."""
    if kind == "adamw":
        lr, min_lr = (3e-3, 3e-4) if model_kind == "gpt" else (1e-3, 1e-4)
        opt = dict(kind="adamw", lr=lr, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, grad_clip=1.0)
        sched = dict(kind="cosine", warmup_steps=5, decay_steps=30, min_lr=min_lr)
    elif kind == "adam":
        opt = dict(kind="adam", lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01)
        sched = dict(kind="constant")
    elif kind == "sgd":
        opt = dict(kind="sgd", lr=0.05, weight_decay=5e-4, momentum=0.9, nesterov=True, grad_clip=5.0)
        sched = dict(kind="constant")
    else:
        raise ValueError(kind)
    return opt, sched


def cases():
    out = []
    for model_name in ("gpt", "mlp", "convnet"):
        for optim in ("adamw", "adam", "sgd"):
            kind, cfg, batch, data_seed = MODEL_SETUPS[model_name]
            out.append((f"{model_name}_{optim}", kind, dict(cfg), batch, data_seed, optim))
    nobias = dict(GPT_CFG, bias=False)
    out.append(("gpt_nobias_adamw", "gpt", nobias, 4, 1, "adamw"))
    return out


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        # Shortest round-trip form (reads back as the same f64), exponent without padding: 1e-8.
        s = repr(v)
        if "e" in s:
            mantissa, exp = s.split("e")
            s = f"{mantissa}e{int(exp)}"
        return s
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(type(v))


def run_toml(kind, cfg, opt, sched):
    lines = ["[model]", f"kind = {toml_value(kind)}"]
    lines += [f"{k} = {toml_value(v)}" for k, v in cfg.items()]
    lines += ["", "[init]", 'from = "init.safetensors"']
    lines += ["", "[data]", 'kind = "batches"', 'path = "batches.safetensors"']
    lines += ["", "[optim]"] + [f"{k} = {toml_value(v)}" for k, v in opt.items()]
    lines += ["", "[schedule]"] + [f"{k} = {toml_value(v)}" for k, v in sched.items()]
    lines += ["", "[train]", f"steps = {STEPS}", f"seed = {SEED}", "log_every = 1"]
    return "\n".join(lines) + "\n"


def run_case(name, kind, cfg, batch, data_seed, optim):
    torch.manual_seed(SEED)
    model = MODELS[kind](cfg)
    model.train()
    init = model.init_tensors()
    inputs, targets = BATCHES[kind](cfg, batch, data_seed)
    opt_cfg, sched = optim_setup(optim, kind)
    optimizer = make_optimizer(model, opt_cfg)
    clip = opt_cfg.get("grad_clip")
    params = [p for p in model.parameters()]

    losses, lrs, norms = [], [], []
    for it in range(STEPS):
        lr = lr_at(it, opt_cfg, sched)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        b = it % NUM_BATCHES
        loss = model.loss(inputs[b], targets[b])
        loss.backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=False)
            norms.append(float(norm.item()))
        else:
            norms.append(None)
        optimizer.step()
        losses.append(float(loss.item()))
        lrs.append(float(lr))

    folder = os.path.join(FIXTURES, name)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    save_file(dict(sorted(init.items())), os.path.join(folder, "init.safetensors"))
    save_file({"inputs": inputs, "targets": targets}, os.path.join(folder, "batches.safetensors"))
    doc = {
        "losses": losses,
        "lrs": lrs,
        "grad_norms": norms,
        "torch_version": torch.__version__.split("+")[0],
    }
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    with open(os.path.join(folder, "run.toml"), "w") as f:
        f.write(run_toml(kind, cfg, opt_cfg, sched))
    n_params = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    return losses, n_params, size


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    total = 0
    print(f"torch {torch.__version__}, writing to {FIXTURES}")
    print(f"{'case':<18} {'params':>7} {'bytes':>7}  loss[0]    loss[9]    loss[19]   loss[39]")
    for name, kind, cfg, batch, data_seed, optim in cases():
        losses, n_params, size = run_case(name, kind, cfg, batch, data_seed, optim)
        total += size
        print(
            f"{name:<18} {n_params:>7} {size:>7}  {losses[0]:<10.6f} {losses[9]:<10.6f} "
            f"{losses[19]:<10.6f} {losses[39]:<10.6f}"
        )
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
