"""What a kernel the delegate leaves to TFLite's own kernels costs inside a network, timed by the build.

Why timed and not fitted: the overhead's ``outside_delegate`` term (:data:`~.overhead.OUTSIDE`) prices each such kernel,
but its price is 1-3 µs on a desktop core, and the build's random networks, 0.1-30 ms each with a few such kernels,
carry 3-5 % noise: a fresh build's networks fitted it at 0 where session 57's, at 1.5 µs, moved the NB101 networks
inside 10 % (session 58, the local CPU). So the build times the difference directly: the same small network twice,
its channels truncated by an uneven two-way split (TFLite ``SPLIT_V``, left to TFLite's own kernels, as NAS-Bench-101
cells truncate) and by a strided slice (which XNNPACK runs), paired against the build's reference; the price is the
median over a few shapes of the time between them per kernel left out. Session 57 timed the same by hand: 0.4-2.7 µs a
node.
"""

from __future__ import annotations

import numpy as np

#: (pixels a side, channels) of the probe networks: NAS-Bench-101's stages at 16-64 channels
SHAPES = ((32, 16), (32, 32), (16, 64))
#: modules per probe network (each one truncation, one kernel left out in the split form)
MODULES = 9


def probe_network(h: int, c: int, split: bool, modules: int = MODULES, name: str = "probe"):
    """The Keras probe: ``modules`` times a 1×1 convolution whose first third of channels is truncated (``split``: by
    an uneven channel split, else by a strided slice), convolved back to ``c`` and added to it."""
    import keras
    from keras import layers, ops

    keras.utils.set_random_seed(0)
    k = max(1, c // 3)
    x = keras.Input((h, h, c), batch_size=1)
    y = x
    for _ in range(modules):
        y = layers.Conv2D(c, 1)(y)
        if split:
            t = layers.Lambda(lambda v: ops.split(v, [k], axis=-1)[0], output_shape=lambda s: (*s[:-1], k))(y)
        else:
            t = layers.Lambda(lambda v: v[..., :k], output_shape=lambda s: (*s[:-1], k))(y)
        y = layers.Add()([layers.Conv2D(c, 1)(t), y])
    return keras.Model(x, y, name=name)


def measure_delegate_price(bench) -> dict:
    """Time the probes on ``bench`` (a :class:`~.bench.KernelBench` of a TFLite device): ``{"price_ms": median ms a
    kernel left out costs beyond its delegated form (at least 0), "pairs": [{h, c, outside, split_ms, slice_ms}]}``."""
    import keras

    pairs = []
    for h, c in SHAPES:
        got = {}
        for split in (True, False):
            stem = f"probe-{'split' if split else 'slice'}-{h}x{c}"
            timed = bench.model(lambda: probe_network(h, c, split, name=stem.replace("-", "_")), stem)
            m = timed.measurement
            got[split] = (float(m.ratio) * float(m.ref_ms),
                          int(timed.kernels["outside_delegate"].sum()) if "outside_delegate" in timed.kernels else 0)
            keras.backend.clear_session()
        (a, n), (b, n_slice) = got[True], got[False]
        if n > 0 and n_slice == 0:
            pairs.append({"h": h, "c": c, "outside": n, "split_ms": a, "slice_ms": b})
    per = [(p["split_ms"] - p["slice_ms"]) / p["outside"] for p in pairs]
    return {"price_ms": max(float(np.median(per)), 0.0) if per else 0.0, "pairs": pairs}


def stored_delegate_price(store, bench, tick) -> float | None:
    """The build's price of a kernel the delegate leaves out, in ms: :func:`measure_delegate_price` once per TFLite
    build (about 7 s, after the budget too, as the cache profile), kept in the store (``delegate_price``); None on
    other runtimes."""
    if bench.runtime != "tflite-xnnpack":
        return None
    saved = store.get("delegate_price")
    if saved is None:
        tick("delegate price")
        saved = measure_delegate_price(bench)
        store.set("delegate_price", saved)
    return float(saved["price_ms"])
