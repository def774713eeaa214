"""TorchServe handler for tools/bench/serve_vs_torchserve.sh: the digits mlp (64 -> 128 -> 64 -> 10,
ReLU between the Linears) with the weights of a weft checkpoint (`model.safetensors` in the
archive, weft's names `layers.{i}.weight` and `layers.{i}.bias`). Each request's body is its rows
as nested JSON arrays (`[[64 values], ...]`), as `weft serve`'s `/predictions/NAME` takes them;
the answer is the rows' logits, nested likewise. Requests TorchServe batches together run as one
forward, each given back its own rows.
"""

import json
import os

import torch
from safetensors.torch import load_file


class DigitsHandler:
    def __init__(self):
        self.model = None

    def initialize(self, context):
        weights = load_file(os.path.join(context.system_properties["model_dir"], "model.safetensors"))
        n = len({k.split(".")[1] for k in weights})
        layers = []
        for i in range(n):
            w = weights[f"layers.{i}.weight"]
            lin = torch.nn.Linear(w.shape[1], w.shape[0])
            lin.weight.data.copy_(w)
            lin.bias.data.copy_(weights[f"layers.{i}.bias"])
            layers.append(lin)
            if i + 1 < n:
                layers.append(torch.nn.ReLU())
        self.model = torch.nn.Sequential(*layers).eval()

    def handle(self, data, context):
        rows, counts = [], []
        for request in data:
            body = request.get("body") if request.get("body") is not None else request.get("data")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            rows.extend(body)
            counts.append(len(body))
        with torch.inference_mode():
            out = self.model(torch.tensor(rows, dtype=torch.float32)).tolist()
        answers, at = [], 0
        for c in counts:
            answers.append(out[at:at + c])
            at += c
        return answers


_service = DigitsHandler()


def handle(data, context):
    if _service.model is None:
        _service.initialize(context)
    if data is None:
        return None
    return _service.handle(data, context)
