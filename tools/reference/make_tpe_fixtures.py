"""Writes Optuna's Parzen estimators, as its TPE sampler builds them, for weft-tune's tests.

Run by hand (needs optuna; CI never runs it) from the repository root:

    python3 tools/reference/make_tpe_fixtures.py

It writes crates/weft-tune/tests/fixtures/parzen_optuna.toml, which the tests of
crates/weft-tune/src/sampler/parzen.rs (one parameter) and joint.rs (several: the multivariate
estimator) read. Each case gives the observations (the good or the bad trials' values, on the
parameter's internal scale), the ranges, points to evaluate, and what Optuna's
`_ParzenEstimator` (with `TPESampler`'s default parameters) computes there: each kernel's
deviation per numeric dimension (the observations' kernels, then the prior's) and the log
density at each point. Re-run it after changing a case and commit the file with the script.
"""

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.samplers._tpe.parzen_estimator import _ParzenEstimator, _ParzenEstimatorParameters
from optuna.samplers._tpe.sampler import default_weights

OUT = "crates/weft-tune/tests/fixtures/parzen_optuna.toml"
# TPESampler's defaults (optuna 5)
PARAMS = _ParzenEstimatorParameters(prior_weight=1.0, consider_magic_clip=True, consider_endpoints=False,
                                    weights=default_weights, multivariate=True)

rng = np.random.RandomState(0)
CASES = [
    # name, dims [("numeric", lo, hi) | ("choice", n)], observations (one row per trial)
    ("one point", [("numeric", 0.0, 1.0)], [[0.3]]),
    ("four points", [("numeric", 0.0, 1.0)], [[0.9], [0.02], [0.6], [0.3]]),
    ("nine points", [("numeric", 0.0, 1.0)], [[x] for x in [0.1, 0.5, 0.55, 0.7, 0.95, 0.2, 0.33, 0.8, 0.41]]),
    ("another range", [("numeric", -5.0, 15.0)], [[-1.0], [9.0], [2.0]]),
    ("a hundred and twenty points", [("numeric", 0.0, 1.0)], [[x] for x in rng.rand(120)]),
    ("two dimensions", [("numeric", 0.0, 1.0), ("numeric", 0.0, 10.0)],
     [[0.9, 2.0], [0.02, 8.0], [0.6, 4.0], [0.3, 6.5]]),
    ("a listed dimension", [("choice", 3), ("numeric", 0.0, 1.0)], [[2, 0.2], [2, 0.25], [0, 0.9]]),
    ("listed values alone", [("choice", 4)], [[2], [2], [0], [3], [2]]),
    ("thirty listed values", [("choice", 3)], [[x] for x in rng.randint(0, 3, 30)]),
]


def fmt(xs):
    return "[" + ", ".join(repr(float(x)) for x in xs) + "]"


def main():
    lines = [f"# written by tools/reference/make_tpe_fixtures.py with optuna {optuna.__version__}", ""]
    for name, dims, obs in CASES:
        space = {}
        for k, d in enumerate(dims):
            space[f"p{k}"] = FloatDistribution(d[1], d[2]) if d[0] == "numeric" else CategoricalDistribution(list(range(d[1])))
        obs = np.array(obs, dtype=float)
        pe = _ParzenEstimator({f"p{k}": obs[:, k] for k in range(len(dims))}, space, PARAMS)
        mix = pe._mixture_distribution
        # points to evaluate: spread over each numeric range, each choice in turn
        fr = [0.01, 0.2, 0.5, 0.77, 0.99]
        pts = []
        for i, f in enumerate(fr):
            pts.append([d[1] + (d[2] - d[1]) * f if d[0] == "numeric" else float(i % d[1]) for d in dims])
        pts = np.array(pts)
        logpdf = pe.log_pdf({f"p{k}": pts[:, k] for k in range(len(dims))})
        lines += ["[[case]]", f"name = \"{name}\""]
        lines.append("dims = [" + ", ".join(
            f"{{ lo = {d[1]!r}, hi = {d[2]!r} }}" if d[0] == "numeric" else f"{{ choices = {d[1]} }}" for d in dims) + "]")
        lines.append("observations = [" + ", ".join(fmt(o) for o in obs) + "]")
        lines.append("points = [" + ", ".join(fmt(p) for p in pts) + "]")
        lines.append(f"log_pdf = {fmt(logpdf)}")
        sig = []
        for k, d in enumerate(dims):
            if d[0] == "numeric":
                sig.append(fmt(mix.distributions[k].sigma))
        lines.append("sigmas = [" + ", ".join(sig) + "]   # per numeric dimension: the observations', then the prior's")
        lines.append("")
    with open(OUT, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
