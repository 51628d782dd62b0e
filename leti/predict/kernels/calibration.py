"""Calibration models: small multi-kernel networks timed end to end, to learn the per-model overhead.

Why: single-kernel models tell what each kernel costs; they cannot tell what a *model* costs beyond the
sum of its kernels (the per-invoke cost, paid once per model and not once per kernel; caches warm or cold
between kernels). :class:`~leti.predict.kernels.overhead.Overhead` learns that from models whose end-to-end
latency was measured. These are random chains of 4-14 kernels of the build's own kernel types (so every
kernel of a calibration model has a regressor), drawn with the build's type weights and the shapes of a
real network's early-to-late stages: convolutions that widen and stride down, depthwise convolutions,
element-wise pieces, residual adds and concats on earlier tensors of the same shape, squeeze-excite style
broadcast products, ending in a global mean and a dense layer when the build has them. They are neither
``keras.applications`` networks nor NAS-Bench cells, so a zoo of those stays unseen.

Every second chain (:func:`calibration_chains`) is **weight-heavy**: the late stages of a network, small maps
(4-14 pixels) with many channels (96-1536), megabytes of weights per kernel. Why: a kernel timed alone runs
with its weights in the core's cache, in a network they stream in from memory every inference; the overhead's
``weights_mb`` term learns that cost, and the first 40 light chains (at most 6 MB of weights) could not (the
zoo's networks carry 2-100 MB).
"""

from __future__ import annotations

import numpy as np

from leti.models.kernel_models import KernelConfig, expected_row, input_shape, valid
from leti.predict.kernels.sampler import _round_channels

_SPATIAL = {"conv2d", "depthwise_conv2d", "grouped_conv2d", "max_pool", "avg_pool", "add", "mul", "sub",
            "squared_difference", "concat", "hard_swish", "sigmoid", "relu", "gelu", "neg", "rsqrt", "pad",
            "slice", "dense", "softmax"}


def _step(t: str, h: int, c: int, rng: np.random.Generator, max_c: int = 512) -> KernelConfig | None:
    """One kernel of type ``t`` on an (h, h, c) map, with sizes a network would use there (convolutions
    widen up to ``max_c`` channels)."""
    down = 2 if h >= 8 and rng.random() < 0.25 else 1
    kw: dict = {"kernel_type": t, "input_h": h, "input_w": h, "input_c": c}
    if t == "conv2d":
        kw.update(output_c=min(max_c, _round_channels(c * rng.uniform(0.5, 2.5), rng)),
                  kernel=int(rng.choice([1, 1, 3])), stride=down, activation="relu" if rng.random() < 0.6 else "")
    elif t == "depthwise_conv2d":
        kw.update(kernel=int(rng.choice([3, 5])), stride=down, activation="relu" if rng.random() < 0.5 else "")
    elif t == "grouped_conv2d":
        g = int(rng.choice([d for d in (2, 4, 8, c) if c % d == 0 and d > 1] or [0]))
        if g == 0:
            return None
        kw.update(output_c=c, groups=g, kernel=3, stride=down)
    elif t in ("max_pool", "avg_pool"):
        kw.update(kernel=int(rng.choice([2, 3])), stride=2)
    elif t in ("add", "mul", "sub"):
        kw.update(variant=str(rng.choice(["same", "same", "broadcast", "const"] if t != "sub" else ["same", "const"])))
    elif t == "squared_difference":
        kw.update(variant="same")
    elif t == "concat":
        kw.update(n_inputs=2, output_c=c + max(1, c // int(rng.choice([1, 2, 4]))))
    elif t in ("pad", "slice"):
        kw.update(kernel=1)
    elif t == "dense":
        kw.update(output_c=_round_channels(c * rng.uniform(0.5, 2), rng), variant="spatial")
    elif t == "softmax":
        kw.update(variant="spatial")
    try:
        cfg = KernelConfig(**kw)
    except Exception:  # noqa: BLE001 - an impossible combination is redrawn
        return None
    return cfg if valid(cfg) else None


def calibration_chain(types: list[str], weights: dict[str, float], rng: np.random.Generator,
                      max_flops: float = 6e8, min_flops: float = 5e7, heavy: bool = False) -> list[KernelConfig]:
    """A random chain of kernels of ``types`` (at least two steps), starting from an (h, h, c) map, of at
    least ``min_flops`` (a model of a millisecond or more on a CPU core: what the overhead is about) when
    one is found in a few draws; ``heavy``: a weight-heavy chain (small maps, many channels)."""
    best: list[KernelConfig] = []
    for _ in range(20):
        steps, flops = _chain(types, weights, rng, max_flops, heavy)
        if flops >= min_flops:
            return steps
        best = best if len(best) > len(steps) else steps
    return best


def calibration_chains(types: list[str], weights: dict[str, float], n: int, seed: int) -> list[list[KernelConfig]]:
    """The build's ``n`` calibration chains: deterministic in ``seed``, every second one weight-heavy."""
    rng = np.random.default_rng([seed, 991])
    chains: list[list[KernelConfig]] = []
    while len(chains) < n:
        steps = calibration_chain(types, weights, rng, heavy=len(chains) % 2 == 1)
        if chain_ok(steps):
            chains.append(steps)
    return chains


def _chain(types, weights, rng, max_flops, heavy: bool = False) -> tuple[list[KernelConfig], float]:
    if heavy:
        h = int(rng.choice([4, 6, 7, 8, 10, 12, 14]))
        c = int(rng.choice([96, 128, 192, 256, 384, 512]))
    else:
        h = int(rng.choice([16, 24, 32, 48, 56, 64, 96]))
        c = int(rng.choice([3, 8, 16, 24, 32, 48, 64]))
    spatial = [t for t in types if t in _SPATIAL]
    p = np.array([weights.get(t, 0.0) + 0.02 for t in spatial])
    steps: list[KernelConfig] = []
    flops = 0.0
    length = int(rng.integers(4, 15))
    tries = 0
    while len(steps) < length and tries < 200 and spatial:
        tries += 1
        cfg = _step(str(rng.choice(spatial, p=p / p.sum())), h, c, rng, 1536 if heavy else 512)
        if cfg is None:
            continue
        row = expected_row(cfg)
        cost = 2.0 * row["output_h"] * row["output_w"] * row["output_c"] * row["kernel_h"] * row["kernel_w"] * \
            row["input_c"] / row["groups"]
        if flops + cost > max_flops:
            continue
        flops += cost
        steps.append(cfg)
        h, c = row["output_h"], row["output_c"]
    if "mean" in types and steps:
        steps.append(KernelConfig("mean", h, h, c, variant="global"))
        if "dense" in types:
            steps.append(KernelConfig("dense", 1, 1, c, output_c=int(rng.choice([10, 100, 1000]))))
    return steps, flops


def chain_ok(steps: list[KernelConfig]) -> bool:
    """Each step takes the shape the one before gives (what :func:`chain_model` needs)."""
    for a, b in zip(steps, steps[1:]):
        r = expected_row(a)
        shape = (r["output_c"],) if (r["output_h"] == r["output_w"] == 1 and b.variant_ == "vector") else \
            (r["output_h"], r["output_w"], r["output_c"])
        if shape != input_shape(b):
            return False
    return len(steps) >= 2
