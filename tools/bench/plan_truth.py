#!/usr/bin/env python3
"""Local truth for `weft plan`: every feasible layout the planner lists for a model on N local
ranks is predicted (`weft plan --json --device-spec local`) and run (`weft launch
--nproc-per-node N -- weft train`), and the predictions are compared with the measurements.

    python3 tools/bench/plan_truth.py [--weft target/release/weft] [--nproc 4] [--steps 20]
        [--max-layouts 16] [--models builtin,bench] [--repeats 1] [--json out.json]

Models: `builtin` is `weft train`'s default GPT (vocab 128, block 64, 4 layers, 4 heads, width
128, batch 16); `bench` is tools/bench/gpt_step.toml's shape on the built-in text (vocab 96: the built-in corpus has 94 characters).
Before predicting, `weft plan calibrate --nproc N` measures this machine at that model's shapes
(in a private WEFT_CACHE_DIR, so the user's calibration is left alone).

Measured step time: the median `step_ms` of the last half of the steps in the metrics file;
with `--repeats N`, every layout runs N times, in rounds over all of them (so that the
machine's drift over minutes falls on every layout alike), and the median of the N is compared.
Memory: the predicted params + grads + optimizer bytes of the device that needs the most
against the largest `state_bytes` sum of the ranks that log (rank 0 writes the metrics: the
comparison is of rank 0's state, stage 0 for a pipeline), and predicted activations against
`activation_bytes` where the metrics log them.

Prints a table per model, the median absolute percentage error of the step time, Spearman's
rank correlation, and whether the planner's choice (the best predicted plan that reduces and
sends in f32, what `[parallel] auto = true` runs) is within 10% of the best measured layout. Layouts
beyond --max-layouts are sampled evenly along the predicted ranking (the best always kept).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = {
    "builtin": [],
    "bench": [
        "model.vocab_size=96",
        "model.block_size=64",
        "model.n_layer=4",
        "model.n_head=4",
        "model.n_embd=128",
    ],
}
RUN = ["train.eval_every=0", "train.sample_tokens=0", "train.log_every=1"]


def sets(items):
    out = []
    for s in items:
        out += ["--set", s]
    return out


def run(cmd, env, timeout):
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p, time.time() - t0


def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2.0
        i = j + 1
    return r


def spearman(a, b):
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def label(p):
    schedule = p["schedule"] if p["schedule"] != "interleaved" else f"interleaved-v{p['virtual_stages']}"
    s = f"dp{p['dp']} tp{p['tp']} pp{p['pp']} zero{p['zero']} m{p['micro_batches']} {schedule}"
    if p.get("sequence_parallel"):
        s += " sp"
    if p["recompute"]:
        s += " rc"
    if p["comm_dtype"] == "bf16":
        s += " bf16"
    if p.get("pipeline_dtype") == "bf16":
        s += " p2p-bf16"
    return s


def layout_sets(p):
    return [
        f"parallel.dp={p['dp']}",
        f"parallel.tp={p['tp']}",
        f"parallel.pp={p['pp']}",
        f"parallel.zero={p['zero']}",
        f"parallel.micro_batches={p['micro_batches']}",
        f"parallel.schedule=\"{p['schedule']}\"",
        f"parallel.recompute={'true' if p['recompute'] else 'false'}",
        f"parallel.sequence_parallel={'true' if p.get('sequence_parallel') else 'false'}",
        f"parallel.comm_dtype=\"{p['comm_dtype']}\"",
        f"parallel.pipeline_dtype=\"{p.get('pipeline_dtype', 'f32')}\"",
    ] + ([f"parallel.stage_blocks={p['stage_blocks']}"] if p["pp"] > 1 else []) + (
        [f"parallel.virtual_stages={p['virtual_stages']}"] if p["schedule"] == "interleaved" else [])


def sample(plans, k):
    if len(plans) <= k:
        return plans
    idx = sorted({round(i * (len(plans) - 1) / (k - 1)) for i in range(k)})
    return [plans[i] for i in idx]


def one_model(name, args, env, tmp):
    model = MODELS[name]
    p, secs = run([args.weft, "plan", "calibrate", "--nproc", str(args.nproc)] + sets(model), env, 120)
    if p.returncode != 0:
        sys.exit(f"calibrate failed:\n{p.stderr}")
    print(f"## {name}: calibrated in {secs:.1f} s: {p.stdout.strip()}")
    p, _ = run(
        [args.weft, "plan", "--json", "--device-spec", "local", "--devices", str(args.nproc), "--top", "10000"]
        + sets(model),
        env,
        60,
    )
    if p.returncode != 0:
        sys.exit(f"plan failed:\n{p.stderr}")
    report = json.loads(p.stdout)
    plans = [q for q in report["plans"] if q["feasible"]]
    # what parallel.auto runs: the best that reduces and sends in f32
    chosen = next(q for q in plans if q["comm_dtype"] == "f32" and q.get("pipeline_dtype", "f32") == "f32")
    todo = sample(plans, args.max_layouts)
    if chosen not in todo:
        todo.append(chosen)
    print(f"{len(plans)} feasible layouts listed, {len(todo)} run")
    # each layout's runs: rounds over all of them, so that the machine's drift over minutes
    # falls on every layout alike (--repeats)
    runs = {i: [] for i in range(len(todo))}
    errors = {}
    for rnd in range(args.repeats):
        for i, q in enumerate(todo):
            if i in errors:
                continue
            metrics = os.path.join(tmp, f"{name}-{i}-{rnd}.jsonl")
            cmd = (
                [args.weft, "launch", "--nproc-per-node", str(args.nproc), "--stop-timeout", "5", "--",
                 args.weft, "train", "--quiet"]
                + sets(model + RUN + layout_sets(q) + [f"train.steps={args.steps}", f"train.metrics=\"{metrics}\""])
            )
            p, secs = run(cmd, env, 600)
            if p.returncode != 0:
                print(f"  {label(q)}: failed: {p.stderr.strip().splitlines()[-1:]}")
                errors[i] = p.stderr.strip()[-400:]
                continue
            recs = [json.loads(l) for l in open(metrics) if l.strip()]
            steps = [r for r in recs if "step_ms" in r]
            tail = steps[len(steps) // 2:]
            runs[i].append((statistics.median(r["step_ms"] for r in tail), steps[-1], secs))
            print(f"  {label(q):<34} predicted {q['predicted_step_ms']:8.1f} ms  measured "
                  f"{runs[i][-1][0]:8.1f} ms  ({secs:.0f} s, round {rnd + 1})", flush=True)
    rows = []
    for i, q in enumerate(todo):
        if i in errors:
            rows.append({"plan": q, "error": errors[i]})
            continue
        measured = statistics.median(r[0] for r in runs[i])
        last = runs[i][-1][1]
        sb = last.get("state_bytes", {})
        state = sum(v for v in sb.values() if isinstance(v, (int, float)))
        act = last.get("activation_bytes")
        act = max(act) if isinstance(act, list) and act else None
        rows.append({
            "plan": q,
            "label": label(q),
            "predicted_ms": q["predicted_step_ms"],
            "measured_ms": measured,
            "measured_runs_ms": [r[0] for r in runs[i]],
            "predicted_state": q["memory"]["params"] + q["memory"]["grads"] + q["memory"]["optimizer"],
            "measured_state": state,
            "predicted_act": q["memory"]["activations"],
            "measured_act": act,
            "wall_s": sum(r[2] for r in runs[i]),
        })
    return {"model": name, "feasible": len(plans), "chosen": label(chosen), "rows": rows}


def summarize(res):
    ok = [r for r in res["rows"] if "measured_ms" in r]
    lines = [
        f"### {res['model']}: {res['feasible']} feasible layouts, {len(ok)} run",
        "",
        "| layout | stages | predicted ms | measured ms | error | state MB predicted | state MB measured | activations MB predicted | activations MB measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(ok, key=lambda r: r["measured_ms"]):
        err = (r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"]
        act = f"{r['measured_act'] / 1e6:.2f}" if r["measured_act"] is not None else "not logged"
        lines.append(
            f"| {r['label']}{' (chosen)' if r['label'] == res['chosen'] else ''} | {r['plan']['stage_blocks']} | "
            f"{r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | {100 * err:+.0f}% | "
            f"{r['predicted_state'] / 1e6:.2f} | {r['measured_state'] / 1e6:.2f} | "
            f"{r['predicted_act'] / 1e6:.2f} | {act} |"
        )
    pred = [r["predicted_ms"] for r in ok]
    meas = [r["measured_ms"] for r in ok]
    mape = statistics.median(abs(p - m) / m for p, m in zip(pred, meas)) if ok else float("nan")
    rho = spearman(pred, meas)
    best = min(meas) if ok else float("nan")
    chosen = [r["measured_ms"] for r in ok if r["label"] == res["chosen"]]
    within = chosen and chosen[0] <= 1.1 * best
    mem = statistics.median(abs(r["predicted_state"] - r["measured_state"]) / r["measured_state"]
                            for r in ok if r["measured_state"]) if ok else float("nan")
    lines += [
        "",
        f"median absolute error of the step time {100 * mape:.0f}%, Spearman {rho:.2f}; chosen "
        f"{res['chosen']} measured {chosen[0] if chosen else float('nan'):.1f} ms against the best "
        f"{best:.1f} ms ({'within' if within else 'not within'} 10%); state bytes: median error {100 * mem:.0f}%",
        "",
    ]
    failed = [r for r in res["rows"] if "error" in r]
    for r in failed:
        lines.append(f"failed: {label(r['plan'])}: {r['error'].splitlines()[-1] if r['error'] else ''}")
    return "\n".join(lines), {"mape": mape, "spearman": rho, "chosen_within_10pct": bool(within)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weft", default="target/release/weft")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-layouts", type=int, default=16)
    ap.add_argument("--models", default="builtin,bench")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each layout, in rounds over all of them; the median is compared")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.weft = os.path.abspath(args.weft)
    tmp = tempfile.mkdtemp(prefix="plan-truth-")
    env = dict(os.environ, WEFT_CACHE_DIR=os.path.join(tmp, "cache"))
    out = []
    t0 = time.time()
    for name in args.models.split(","):
        res = one_model(name, args, env, tmp)
        text, summary = summarize(res)
        res["summary"] = summary
        out.append(res)
        print(text, flush=True)
    print(f"total {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
