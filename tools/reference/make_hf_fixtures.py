"""Writes tiny Hugging Face checkpoint folders and the logits transformers computes for them.

Run by hand (needs torch, transformers and safetensors; CI never runs it) from the repository root:

    python3 tools/reference/make_hf_fixtures.py

It writes under crates/weft-models/tests/fixtures/hf/:

    gpt2/        GPT2LMHeadModel (gelu_new, tied head), saved by save_pretrained: config.json,
                 model.safetensors (names as transformers saves them, Conv1D weights [in, out])
    llama_gqa/   LlamaForCausalLM, 4 heads sharing 2 key/value heads, untied head, rope_theta
                 500000, saved in several shards (model.safetensors.index.json)
    llama_tied/  LlamaForCausalLM, plain multi-head attention, tied embeddings, one file
    llama_rope_llama3/  LlamaForCausalLM with Llama 3.1's rope scaling (`rope_parameters`,
                 rope_type "llama3", as transformers 5 saves it), head dim 8 so that its four
                 frequencies fall in all three of the scaling's bands
    llama_rope_linear/  LlamaForCausalLM with linear rope scaling, its config.json rewritten in
                 the older form (top-level `rope_theta`, `rope_scaling` with `type`); the logits are
                 those of the model transformers loads back from that folder
    qwen2/       Qwen2ForCausalLM (biases on q, k and v), grouped-query attention, tied embeddings
    mistral/     MistralForCausalLM without a sliding window (`sliding_window` null)
    qwen3/       Qwen3ForCausalLM (RMSNorms on each query and key head), grouped-query attention,
                 a head_dim (16) that is not hidden_size / num_attention_heads (8), tied embeddings
    llama_head_dim/  LlamaForCausalLM with head_dim 12 where hidden_size / num_attention_heads is 8
                 (Mistral NeMo's kind of config), untied
    mistral_window/  MistralForCausalLM with a sliding window (6) shorter than its positions (32),
                 as Mistral 7B v0.1's (4096 of 32768); its ids are as long as the window
    phi3/        Phi3ForCausalLM: q, k and v in one fused qkv_proj, gate and up in one
                 gate_up_proj, grouped-query attention, a sliding window (8) shorter than its
                 positions (32), as Phi-3-mini-4k's (2047 of 4096); its ids are as long as the
                 window
    expected.json  for each folder: the input ids [2, T] and the logits [2, T, V] (float32,
                 eager attention, CPU), flattened

Weights are random (seeded) and scaled up from the default init so that logits differ clearly.
"""

import json
import os

import torch
import transformers
from transformers import (
    GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3Config,
    Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
)

OUT = "crates/weft-models/tests/fixtures/hf"


def scaled(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".ln_" in name or "ln_f" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model


def logits_of(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    expected = {"transformers_version": transformers.__version__, "torch_version": torch.__version__}
    g = torch.Generator().manual_seed(1)

    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=4,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )
    )
    scaled(gpt2, 2)
    ids = torch.randint(0, 61, (2, 9), generator=g)
    gpt2.save_pretrained(os.path.join(OUT, "gpt2"), safe_serialization=True)
    expected["gpt2"] = {"ids": ids.tolist(), "logits": logits_of(gpt2, ids).flatten().tolist()}

    gqa_cfg = LlamaConfig(
        vocab_size=53, max_position_embeddings=32, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="eager",
    )
    gqa = scaled(LlamaForCausalLM(gqa_cfg), 3)
    ids = torch.randint(0, 53, (2, 11), generator=g)
    gqa.save_pretrained(os.path.join(OUT, "llama_gqa"), safe_serialization=True, max_shard_size="20KB")
    expected["llama_gqa"] = {"ids": ids.tolist(), "logits": logits_of(gqa, ids).flatten().tolist()}

    tied_cfg = LlamaConfig(
        vocab_size=47, max_position_embeddings=16, hidden_size=24, intermediate_size=40,
        num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3,
        rms_norm_eps=1e-5, tie_word_embeddings=True, attn_implementation="eager",
    )
    tied = scaled(LlamaForCausalLM(tied_cfg), 4)
    ids = torch.randint(0, 47, (2, 7), generator=g)
    tied.save_pretrained(os.path.join(OUT, "llama_tied"), safe_serialization=True)
    expected["llama_tied"] = {"ids": ids.tolist(), "logits": logits_of(tied, ids).flatten().tolist()}

    llama3_cfg = LlamaConfig(
        vocab_size=41, max_position_embeddings=128, hidden_size=32, intermediate_size=40,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        rms_norm_eps=1e-5, tie_word_embeddings=True, attn_implementation="eager",
    )
    llama3 = scaled(LlamaForCausalLM(llama3_cfg), 5)
    ids = torch.randint(0, 41, (2, 13), generator=g)
    llama3.save_pretrained(os.path.join(OUT, "llama_rope_llama3"), safe_serialization=True)
    expected["llama_rope_llama3"] = {"ids": ids.tolist(), "logits": logits_of(llama3, ids).flatten().tolist()}

    linear_cfg = LlamaConfig(
        vocab_size=41, max_position_embeddings=64, hidden_size=32, intermediate_size=40,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
        rope_parameters={"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.5},
        rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="eager",
    )
    folder = os.path.join(OUT, "llama_rope_linear")
    scaled(LlamaForCausalLM(linear_cfg), 6).save_pretrained(folder, safe_serialization=True)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        c = json.load(f)
    params = c.pop("rope_parameters")
    c["rope_theta"] = params["rope_theta"]
    c["rope_scaling"] = {"type": "linear", "factor": params["factor"]}
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    linear = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager")
    assert linear.config.rope_parameters["rope_type"] == "linear", linear.config.rope_parameters
    ids = torch.randint(0, 41, (2, 10), generator=g)
    expected["llama_rope_linear"] = {"ids": ids.tolist(), "logits": logits_of(linear, ids).flatten().tolist()}

    # the same sizes (hidden 32, 2 layers, 4 heads, intermediate 40, 32 positions, eager
    # attention) in each architecture that computes a llama
    small = dict(max_position_embeddings=32, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                 num_attention_heads=4, attn_implementation="eager")
    for name, model_cls, config_cls, seed, t, cfg in [
        ("qwen2", Qwen2ForCausalLM, Qwen2Config, 7, 9, dict(
            vocab_size=43, num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            rms_norm_eps=1e-6, tie_word_embeddings=True)),
        ("mistral", MistralForCausalLM, MistralConfig, 8, 8, dict(
            vocab_size=37, num_key_value_heads=1, sliding_window=None, rms_norm_eps=1e-5,
            tie_word_embeddings=False)),
        ("qwen3", Qwen3ForCausalLM, Qwen3Config, 9, 9, dict(
            vocab_size=39, num_key_value_heads=2, head_dim=16,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
            tie_word_embeddings=True)),
        ("llama_head_dim", LlamaForCausalLM, LlamaConfig, 10, 10, dict(
            vocab_size=45, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5, tie_word_embeddings=False)),
        # ids as long as the window
        ("mistral_window", MistralForCausalLM, MistralConfig, 11, 6, dict(
            vocab_size=35, num_key_value_heads=2, sliding_window=6, rms_norm_eps=1e-5,
            tie_word_embeddings=False)),
        # ids as long as the window; Phi3Config's pad_token_id (32000) is outside this vocabulary
        ("phi3", Phi3ForCausalLM, Phi3Config, 12, 8, dict(
            vocab_size=33, num_key_value_heads=2, sliding_window=8, rms_norm_eps=1e-5,
            tie_word_embeddings=False, pad_token_id=None)),
    ]:
        model = scaled(model_cls(config_cls(**small, **cfg)), seed)
        ids = torch.randint(0, cfg["vocab_size"], (2, t), generator=g)
        model.save_pretrained(os.path.join(OUT, name), safe_serialization=True)
        expected[name] = {"ids": ids.tolist(), "logits": logits_of(model, ids).flatten().tolist()}

    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")


if __name__ == "__main__":
    main()
