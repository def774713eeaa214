"""`weft export onnx` checked with onnxruntime against PyTorch.

For each of the training fixtures (mlp, convnet, gpt, llama with grouped-query attention), this
trains 3 steps with weft into a checkpoint, exports it with `weft export onnx` (dynamic batch and
sequence axes), and runs the file with onnxruntime on inputs of several batch and sequence sizes.
The reference is PyTorch on the same weights: gpt and llama through transformers, from the folder
`weft checkpoint consolidate --format hf` writes; the mlp and the convnet as the few torch.nn
layers they are, from the consolidated safetensors file. Prints the largest difference of each
run relative to the logits' largest magnitude (the tests' measure; goal 1e-5).

Needs a Python with torch, transformers, safetensors and onnxruntime (PyPI). From the repository
root, after `cargo build -p weft-cli`:

    python3 tools/onnx/check_onnxruntime.py [--weft target/debug/weft]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(ROOT, "crates", "weft-train", "tests", "fixtures")


def run(cmd):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return out.stdout


def train(weft, case, work):
    ckpt = os.path.join(work, case)
    run([weft, "train", "--config", os.path.join(FIXTURES, case, "run.toml"), "--quiet",
         "--set", "train.steps=3", "--set", f"train.checkpoint_dir={json.dumps(ckpt)}",
         "--set", f"train.metrics={json.dumps(os.path.join(work, case + '.jsonl'))}"])
    return ckpt


def worst(got, want):
    import numpy as np
    scale = max(1.0, float(np.abs(want).max()))
    return float(np.abs(got - want).max()) / scale


def reference_classifier(kind, cfg, tensors):
    import torch
    import torch.nn.functional as F

    def forward(x):
        if kind == "mlp":
            n = len(cfg["hidden"]) + 1
            act = {"relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh}[cfg["activation"]]
            for i in range(n):
                x = F.linear(x, tensors[f"layers.{i}.weight"], tensors[f"layers.{i}.bias"])
                if i + 1 < n:
                    x = act(x)
            return x
        x = x.reshape(x.shape[0], cfg["in_channels"], cfg["image_size"], cfg["image_size"])
        for i in range(len(cfg["channels"])):
            x = F.conv2d(x, tensors[f"convs.{i}.weight"], tensors[f"convs.{i}.bias"], padding=1)
            x = F.max_pool2d(F.relu(x), 2)
        return F.linear(x.flatten(1), tensors["fc.weight"], tensors["fc.bias"])

    return forward


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weft", default=os.path.join(ROOT, "target", "debug", "weft"))
    args = ap.parse_args()
    import numpy as np
    import onnxruntime as ort
    import torch
    from safetensors.torch import load_file
    from safetensors import safe_open

    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="weft-onnx-") as work:
        for case in ["mlp_adamw", "convnet_adamw", "gpt_adamw", "llama_gqa_adamw"]:
            ckpt = train(args.weft, case, work)
            onnx_path = os.path.join(work, case + ".onnx")
            run([args.weft, "export", "onnx", "--checkpoint", ckpt, "--output", onnx_path])
            session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
            st = os.path.join(work, case + ".safetensors")
            run([args.weft, "checkpoint", "consolidate", ckpt, "-o", st])
            with safe_open(st, "pt") as f:
                cfg = json.loads(f.metadata()["weft.model"])
            kind = cfg["kind"]
            if kind in ("gpt", "llama"):
                from transformers import AutoModelForCausalLM
                hf = os.path.join(work, case + "-hf")
                run([args.weft, "checkpoint", "consolidate", ckpt, "-o", hf, "--format", "hf"])
                model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
                ref = lambda x: model(input_ids=x).logits
                sizes = [(1, 1), (2, 7), (3, cfg["block_size"])]
                make = lambda b, t: torch.randint(0, cfg["vocab_size"], (b, t))
            else:
                ref = reference_classifier(kind, cfg, load_file(st))
                shape = [cfg["in_features"]] if kind == "mlp" else [cfg["in_channels"], cfg["image_size"],
                                                                     cfg["image_size"]]
                sizes = [(1, None), (5, None)]
                make = lambda b, t: torch.randn([b] + shape)
            for b, t in sizes:
                x = make(b, t)
                with torch.no_grad():
                    want = ref(x).numpy()
                got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
                err = worst(got, want)
                rows.append((case, list(x.shape), err))
    print(f"onnxruntime {ort.__version__}, torch {torch.__version__}")
    print("| fixture | input shape | worst difference / logits' scale |")
    print("|---|---|---:|")
    for case, shape, err in rows:
        print(f"| {case} | {shape} | {err:.2e} |")
    bad = [r for r in rows if r[2] > 1e-5]
    if bad:
        sys.exit(f"{len(bad)} runs above 1e-5")


if __name__ == "__main__":
    main()
