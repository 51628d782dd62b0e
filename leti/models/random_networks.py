"""Random multi-block CNNs: the real-network calibration set of a kernel build (``leti kernels build --networks``).

Why: a kernel predictor sums kernels timed one at a time. In a real network the same kernel runs beside
others (its input just written by the previous kernel, its weights streamed in once per inference, dozens of
kernels per invoke), and how far the sum is from the network's latency differs *by kernel type*: measured on the
local CPU, a real network's convolutions cost ~7 % more than alone, grouped convolutions ~40 % less than a
regressor extrapolates, pads and squeeze-excite products more. Short chains of random kernels
(:mod:`leti.predict.kernels.calibration`) do not show it; whole networks do. These networks are the build's
own: stages of blocks drawn at random from the kinds real CNNs are made of — plain convolutions, inverted
residuals (optionally squeeze-excite), basic and bottleneck residuals (grouped or not), fire modules, dense
concatenations, channel-split shuffle units — with random widths, depths, kernels, activations and input
sizes, under a multiply-accumulate budget. No ``keras.applications`` network and none of the zoo's
(:mod:`leti.models.zoo`) is built here, so a zoo of those stays unseen.

``network_params(seed)`` draws a JSON-able description (what a build stores and can rebuild);
``build_network(params, net)`` runs it on a :class:`~leti.models.zoo_blocks.Net` back end (Keras tensors or
shapes: :func:`network_macs` counts without building).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from leti.models.zoo_blocks import CountNet, KerasNet, Net, make_divisible

BLOCKS = ("plain", "inverted", "basic", "bottleneck", "fire", "dense", "shuffle", "cell", "nasnet")
#: how often a stage draws each block: the last two at a third of the weight. Why they are here: they hold what
#: XNNPACK leaves to TFLite's own kernels (a ``cell``'s uneven channel splits, as NAS-Bench-101 cells truncate; a
#: ``nasnet`` block's 6-input concatenation and, down a stage, NASNet's 1×1 stride-2 average pool), so the overhead
#: fitted on these networks can price the switches between the delegate's partitions
#: (:data:`~leti.predict.kernels.overhead.OUTSIDE`); session 57 found every one of the build's networks before them
#: delegated whole
BLOCK_WEIGHTS = (3, 3, 3, 3, 3, 3, 3, 1, 1)
ACTIVATIONS = ("relu", "relu6", "hard_swish", "swish")
#: multiply-accumulates a calibration network may have: a millisecond to ~60 ms on one desktop core
MACS_RANGE = (2e7, 8e8)
#: ... and a small one (drawn with :data:`SMALL_SHARE`): tenths of a millisecond, where the per-kernel costs a
#: kernel timed alone carries (its share of the invoke, tensors too small to time apart) decide the error
SMALL_RANGE = (1e6, 2e7)
SMALL_SHARE = 0.3


def _stage(rng: np.random.Generator, block: str, c: int, first: bool) -> dict:
    s = {"block": block, "channels": c, "repeats": int(rng.integers(1, 4)), "stride": 1 if first else 2,
         "kernel": int(rng.choice([3, 3, 5, 7] if block in ("inverted", "shuffle") else [3, 3, 3, 5])),
         "down": "conv" if rng.random() < 0.75 else "maxpool"}
    if block == "inverted":
        s.update(expand=int(rng.choice([1, 3, 4, 6])), se=bool(rng.random() < 0.4),
                 gate=str(rng.choice(["hard_sigmoid", "sigmoid"])))
    elif block == "bottleneck":
        width = int(rng.choice([8, 16, 24, 32, 48]))
        s.update(groups_width=width if rng.random() < 0.6 else 0, se=bool(rng.random() < 0.3), gate="sigmoid")
    elif block == "basic":
        s.update(se=bool(rng.random() < 0.2), gate="sigmoid")
    elif block == "dense":
        s.update(growth=int(rng.choice([8, 12, 16, 24, 32])))
    elif block == "cell":
        s.update(branches=[str(o) for o in rng.choice(["conv3", "conv1", "pool"], size=int(rng.integers(2, 4)))])
    return s


def network_params(seed: int) -> dict:
    """One random network, deterministic in ``seed`` (redrawn until its MACs fall in its range: small or not)."""
    rng = np.random.default_rng([seed, 1603])
    lo, hi = SMALL_RANGE if rng.random() < SMALL_SHARE else MACS_RANGE
    while True:
        size = int(rng.choice([32, 64, 96, 112, 128, 160, 192, 224]))
        c = int(rng.choice([8, 16, 24, 32, 48, 64]))
        p = {"seed": seed, "input": size, "stem": c, "stem_kernel": int(rng.choice([3, 3, 5, 7])),
             "act": str(rng.choice(ACTIVATIONS)), "classes": int(rng.choice([10, 100, 1000], p=[0.2, 0.2, 0.6])),
             "last": 0, "stages": []}
        for i in range(int(rng.integers(3, 7))):
            c = min(1024, make_divisible(c * rng.uniform(1.3, 2.6)))
            w = np.asarray(BLOCK_WEIGHTS, np.float64)
            p["stages"].append(_stage(rng, str(rng.choice(BLOCKS, p=w / w.sum())), c, first=i == 0))
        if rng.random() < 0.6:
            p["last"] = min(2048, make_divisible(c * rng.uniform(1.5, 6)))
        if lo <= network_macs(p) <= hi:
            return p


def _block(net: Net, x, s: Mapping, stride: int, act: str):
    """One block of stage ``s`` (its first one carries the stage's stride)."""
    c, k, kind = s["channels"], s["kernel"], s["block"]
    cin = net.channels(x)
    if stride == 2 and s["down"] == "maxpool" and kind not in ("shuffle", "nasnet"):
        x, stride = net.maxpool(x, 3, 2), 1
    if kind == "plain":
        return net.conv(x, c, k, stride, act=act)
    if kind == "inverted":
        y = net.conv(x, cin * s["expand"], 1, act=act) if s["expand"] != 1 else x
        y = net.dw(y, k, stride, act=act)
        if s["se"]:
            y = net.se(y, make_divisible(net.channels(y) / 4), s["gate"])
        y = net.conv(y, c, 1, act=None)
        return net.add(x, y) if stride == 1 and cin == c else y
    if kind in ("basic", "bottleneck"):
        if kind == "basic":
            y = net.conv(net.conv(x, c, k, stride, act=act), c, k, act=None)
        else:
            mid = make_divisible(c / 4)
            groups = max(1, mid // s["groups_width"]) if s["groups_width"] else 1
            while mid % groups:
                groups -= 1
            y = net.conv(net.conv(x, mid, 1, act=act), mid, k, stride, groups=groups, act=act)
            y = net.conv(y, c, 1, act=None)
        if s["se"]:
            y = net.se(y, make_divisible(c / 16), s["gate"])
        short = x if stride == 1 and cin == c else net.conv(x, c, 1, stride, act=None)
        return net.act(net.add(short, y), act)
    if kind == "fire":
        x = net.conv(x, make_divisible(c / 8), 1, stride, act=act)
        half = make_divisible(c / 2)
        return net.concat([net.conv(x, half, 1, act=act), net.conv(x, c - half if c > half else half, k, act=act)])
    if kind == "dense":
        if stride == 2 or cin > c:
            x = net.conv(x, min(cin, c), 1, stride, act=act)  # a transition: narrower, and down when asked
        y = net.conv(net.conv(x, 4 * s["growth"], 1, act=act), s["growth"], k, act=act)
        return net.concat([x, y])
    if kind == "shuffle":
        if stride == 2 or cin != c or cin % 2:
            a = net.conv(net.dw(x, k, stride, act=None), c // 2, 1, act=act)
            b = net.conv(net.dw(net.conv(x, c // 2, 1, act=act), k, stride, act=None), c - c // 2, 1, act=act)
        else:
            a, b = net.split(x)
            b = net.conv(net.dw(net.conv(b, c // 2, 1, act=act), k, 1, act=None), c // 2, 1, act=act)
        y = net.concat([a, b])
        return net.shuffle(y) if net.channels(y) % 2 == 0 else y
    if kind == "cell":  # a NAS-Bench-101 cell: a projection, branches on uneven truncations of it, concatenated
        y = net.conv(x, c, 1, stride, act=act)
        n = len(s["branches"])
        widths = [c // n + (i < c % n) for i in range(n)]
        outs = []
        for op, w in zip(s["branches"], widths):
            t = net.truncate(y, w)
            outs.append(net.maxpool(t, 3, 1) if op == "pool" else net.conv(t, w, 3 if op == "conv3" else 1, act=act))
        return net.add(net.concat(outs), y)
    if kind == "nasnet":  # a NASNet cell: a 1×1 stride-2 average pool when it goes down, six branches concatenated
        if stride == 2:
            x = net.conv(net.avgpool(x, 1, 2), c, 1, act=None)
        w = make_divisible(c / 6, 4)
        h = net.conv(x, w, 1, act=act)
        sep = lambda t, kk: net.conv(net.dw(t, kk, act=None), w, 1, act=act)  # noqa: E731
        return net.concat([h, sep(h, k), sep(h, 5), net.avgpool(h, 3, 1), net.maxpool(h, 3, 1),
                           net.add(sep(h, 3), h)])
    raise ValueError(f"unknown block kind {kind!r}")


def build_network(p: Mapping, net: Net, x):
    """Run the network ``p`` on ``net`` from the input ``x``; the output of its classifier."""
    act = p["act"]
    x = net.conv(x, p["stem"], p["stem_kernel"], 2, act=act)
    for s in p["stages"]:
        for i in range(s["repeats"]):
            x = _block(net, x, s, s["stride"] if i == 0 else 1, act)
    if p["last"]:
        x = net.conv(x, p["last"], 1, act=act)
    return net.head(x, p["classes"])


def network_macs(p: Mapping) -> int:
    """Multiply-accumulates of ``p`` (convolutions and the classifier), counted on shapes."""
    count = CountNet()
    build_network(p, count, (p["input"], p["input"], 3))
    return count.macs


def keras_network(p: Mapping, name: str | None = None):
    """The Keras model of ``p`` (random weights: Keras' initialisers; batch norm folded by the converter)."""
    import keras

    x = keras.Input((p["input"], p["input"], 3), batch_size=1)
    return keras.Model(x, build_network(p, KerasNet(), x), name=name or f"net_{p['seed']}")
