"""Writes transformers' LlamaForCausalLM reference runs that weft's llama must reproduce.

Run by hand (needs torch, transformers and safetensors; CI never runs it) from the repository
root:

    python3 tools/reference/make_llama_fixtures.py [CASE...]   # every case when none is named

Three tiny configs:

    gqa    n_head 4, n_kv_head 2 (grouped-query attention), separate lm_head, rope_theta 500
    tied   n_head 4, n_kv_head 4 (multi-head), lm_head tied to the token embedding, rope_theta
           default (10000)
    qwen3  transformers' Qwen3ForCausalLM: n_head 4 of head_dim 12 (where n_embd / n_head is 8),
           n_kv_head 2, RMSNorms on each query and key head (weft's qk_norm), separate lm_head
    pad    tied's model with pad_token_id 39 (weft's padding_idx), the id the batch holds most
           often: transformers' embedding zeroes that row at init and gives its lookups no
           gradient (the tied head's still reaches it); the grads fixture only

For each (pad: the second file only) it writes

  crates/weft-train/tests/fixtures/llama_{gqa,tied,qwen3}_adamw/   a 40-step training run in the
      layout of make_train_fixtures.py (init.safetensors, batches.safetensors, expected.json,
      run.toml): the same step loop, AdamW parameter groups (dim >= 2 decays), clipping, cosine
      schedule and Markov-chain token data. A tied model's init.safetensors holds the shared
      weight under both names (model.embed_tokens.weight and lm_head.weight, equal copies).
  crates/weft-models/tests/fixtures/llama_{gqa,tied,qwen3}_grads.safetensors   one forward and
      backward: `param.{name}` (the weights, RMSNorm weights drawn around 1 so that they
      matter), `inputs`, `targets` ([B, T] int64), `logits` ([B, T, V]), `loss` ([1]) and
      `grad.{name}` for every parameter (a tied model's weight once, as
      model.embed_tokens.weight); plus llama_{gqa,tied,qwen3}_grads.json with the config.

Everything float32 on the CPU, one thread, attn_implementation "eager". The model is transformers'
own LlamaForCausalLM (Qwen3ForCausalLM for qwen3); its state_dict names are the contract with weft.
"""

import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_train_fixtures as base  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
UNIT = os.path.join(ROOT, "crates", "weft-models", "tests", "fixtures")

# weft's [model] keys, in run.toml order
CASES = {
    "gqa": dict(
        vocab_size=65, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
        intermediate_size=64, rope_theta=500.0, norm_eps=1e-5, tie_embeddings=False,
    ),
    "tied": dict(
        vocab_size=65, block_size=16, n_layer=2, n_head=4, n_kv_head=4, n_embd=32,
        intermediate_size=48, rope_theta=10000.0, norm_eps=1e-6, tie_embeddings=True,
    ),
    "qwen3": dict(
        vocab_size=65, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
        intermediate_size=48, rope_theta=1000.0, norm_eps=1e-6, tie_embeddings=False,
        head_dim=12, qk_norm=True,
    ),
    "pad": dict(
        vocab_size=65, block_size=16, n_layer=2, n_head=4, n_kv_head=4, n_embd=32,
        intermediate_size=48, rope_theta=10000.0, norm_eps=1e-6, tie_embeddings=True,
        padding_idx=39,
    ),
}

# cases with a unit fixture but no training run
UNIT_ONLY = {"pad"}


class Llama(torch.nn.Module):
    """transformers' LlamaForCausalLM (Qwen3ForCausalLM where the config has `qk_norm`) behind
    the interface make_train_fixtures.py drives."""

    def __init__(self, cfg):
        super().__init__()
        qwen3 = cfg.get("qk_norm", False)
        extra = {} if qwen3 else {"mlp_bias": False}
        if "head_dim" in cfg:
            extra["head_dim"] = cfg["head_dim"]
        if "padding_idx" in cfg:
            extra["pad_token_id"] = cfg["padding_idx"]
        hf = (Qwen3Config if qwen3 else LlamaConfig)(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["n_embd"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["n_layer"],
            num_attention_heads=cfg["n_head"],
            num_key_value_heads=cfg["n_kv_head"],
            max_position_embeddings=cfg["block_size"],
            rms_norm_eps=cfg["norm_eps"],
            rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
            tie_word_embeddings=cfg["tie_embeddings"],
            attention_bias=False,
            initializer_range=0.02,
            attn_implementation="eager",
            **extra,
        )
        self.hf = (Qwen3ForCausalLM if qwen3 else LlamaForCausalLM)(hf).float()
        inv = self.hf.model.rotary_emb.inv_freq
        want = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, inv.numel() * 2, 2, dtype=torch.float) / (inv.numel() * 2)))
        assert torch.equal(inv, want), "rope_theta did not reach the model"
        self.tied = cfg["tie_embeddings"]

    def forward(self, idx):
        return self.hf(input_ids=idx).logits

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def named_parameters(self, *args, **kwargs):
        for name, p in self.hf.named_parameters(*args, **kwargs):
            yield name, p

    def state(self):
        sd = {k: v.detach().clone().contiguous() for k, v in self.hf.state_dict().items()}
        if self.tied:
            sd["lm_head.weight"] = self.hf.model.embed_tokens.weight.detach().clone().contiguous()
        return sd

    def init_tensors(self):
        return self.state()


def unit_fixture(name, cfg):
    torch.manual_seed(base.SEED + 1)
    model = Llama(cfg)
    with torch.no_grad():
        for n, p in model.hf.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
    inputs, targets = base.gpt_batches(cfg, 3, 7)
    inputs, targets = inputs[0], targets[0]
    if "padding_idx" in cfg:
        assert (inputs == cfg["padding_idx"]).any(), "the padding id is not in the batch"
        assert torch.all(model.hf.model.embed_tokens.weight[cfg["padding_idx"]] == 0)
    logits = model(inputs)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
    loss.backward()
    out = {f"param.{k}": v.detach().clone().contiguous() for k, v in model.hf.named_parameters()}
    out.update({f"grad.{k}": v.grad.detach().clone().contiguous() for k, v in model.hf.named_parameters()})
    out["inputs"] = inputs.contiguous()
    out["targets"] = targets.contiguous()
    out["logits"] = logits.detach().contiguous()
    out["loss"] = loss.detach().reshape(1)
    os.makedirs(UNIT, exist_ok=True)
    save_file(dict(sorted(out.items())), os.path.join(UNIT, f"llama_{name}_grads.safetensors"))
    with open(os.path.join(UNIT, f"llama_{name}_grads.json"), "w") as f:
        json.dump({"model": cfg, "torch_version": torch.__version__.split("+")[0]}, f, indent=1)
        f.write("\n")
    return loss.item()


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    base.MODELS["llama"] = Llama
    base.BATCHES["llama"] = base.gpt_batches
    print(f"torch {torch.__version__}")
    names = sys.argv[1:] or list(CASES)
    for name in names:
        cfg = CASES[name]
        loss = unit_fixture(name, cfg)
        print(f"llama_{name}_grads  loss {loss:.6f}")
        if name in UNIT_ONLY:
            continue
        # the gpt setup's optimizer values (lr 3e-3 cosine to 3e-4, clip 1.0)
        opt, sched = base.optim_setup("adamw", "gpt")
        orig = base.optim_setup
        base.optim_setup = lambda kind, model_kind, o=opt, s=sched: (o, s)
        try:
            losses, n_params, size = base.run_case(f"llama_{name}_adamw", "llama", dict(cfg), 4, 1, "adamw")
        finally:
            base.optim_setup = orig
        print(
            f"llama_{name}_adamw  params {n_params} bytes {size}  "
            f"loss[0] {losses[0]:.6f} loss[39] {losses[39]:.6f}"
        )


if __name__ == "__main__":
    main()
