"""Where single-kernel configurations come from: the kernels of real networks, jittered, plus uniform coverage.

Why real networks: a kernel regressor is only as good as its coverage of the kernels it will be asked
about, and those are the kernels of real CNNs — a depthwise 3×3 at 112×112×32, a 1×1 convolution with 960
outputs, a squeeze-excite scale over 14×14×672. :func:`real_kernels` splits the architectures of
``keras.applications`` (built with ``weights=None``, at their DEFAULT input size and width; nothing is
downloaded) and two RegNets Keras does not ship (:data:`BUILT_ARCHITECTURES`) into the kernels TFLite runs and
caches that table in the package (``data/real_kernels.parquet``: collecting it converts 16 networks, about three
minutes; done once, not per build). Models of other resolutions and widths are what a held-out zoo tests, so
they are never collected here.

:class:`KernelSampler` draws :class:`~leti.models.kernel_models.KernelConfig`\\ s per kernel type as a mix of

* **jittered real kernels** (nn-Meter's sampling around the real distribution): a random real kernel of the
  type with channels ×[0.5, 1.5] rounded to multiples of 8 or 4 (sometimes left odd, as real models have 3,
  11, 1000 channels), the resolution ×[0.4, 1.6], the window redrawn from {1, 3, 5, 7} at times, the stride
  and the fused activation flipped at times; and
* **uniform coverage**: sizes log-uniform over what CNNs use, so a regressor has seen the corners too.

Every draw is a valid configuration (:func:`~leti.models.kernel_models.valid`) of at most ``MAX_FLOPS`` and
``MAX_WEIGHT_BYTES``.
:meth:`KernelSampler.type_weights` says how much of a build each type deserves: its share of the kernels of
the real networks and its share of their latency (FLOPs and bytes until a predictor gives latencies).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pandas as pd

from leti.models.kernel_models import BUILDABLE, KernelConfig, expected_row, valid
from leti.predict.kernels.schema import normalize

REAL_TABLE = Path(__file__).with_name("data") / "real_kernels.parquet"
#: keras.applications architectures and their default input size (each built at exactly that)
REAL_ARCHITECTURES = {
    "MobileNet": 224, "MobileNetV2": 224, "MobileNetV3Small": 224, "MobileNetV3Large": 224, "EfficientNetB0": 224,
    "EfficientNetV2B0": 224, "ResNet50": 224, "ResNet50V2": 224, "DenseNet121": 224, "NASNetMobile": 224,
    "Xception": 299, "InceptionV3": 299, "ConvNeXtTiny": 224, "VGG16": 224,
}
#: networks of the zoo's own builders that Keras 3 does not ship, at 224 px (the zoo holds them at 96-192 px only):
#: RegNetX/Y-200MF (:data:`leti.models.zoo.REGNETS`), the only real rows of bottleneck grouped convolutions (groups
#: of 8 channels, 3×3, inputs of 7-112 px; ConvNeXt's grouped rows are depthwise ones) and of their SE blocks' shapes.
#: Measured (session 54): without them RegNetX/Y-200MF at 96 px were predicted 14-17 % high on the engine, their
#: grouped convolutions 1.24× their time alone.
BUILT_ARCHITECTURES = {"RegNetX002": ("x002", 224), "RegNetY002": ("y002", 224)}
MAX_FLOPS = 4e9
#: the most weight bytes a sampled kernel may have: converting a 1 GB dense layer (VGG16's 25088 → 4096 head,
#: jittered up) takes ~100 s, and 15 such draws took 26 of a 45-minute engine build (session 10)
MAX_WEIGHT_BYTES = 64e6
UNIFORM_SHARE = 0.3
#: the share of a build each kernel type without a real network in ``keras.applications`` gets
SYNTHETIC_WEIGHT = 0.01
#: the least share of a build of a type whose real rows stand in for other kernels. Grouped convolutions: Keras 3
#: ships no RegNet or ResNeXt, and until session 54 the pool's only grouped rows were ConvNeXt's depthwise-as-grouped
#: ones, redrawn with RegNet-like groups (:meth:`KernelSampler._jitter`), so their real share (0.3 %) said nothing of
#: the networks that have them, which spend about a third of their time there. Measured (session 36, the Zen 5's fresh store):
#: 150 more grouped kernels drawn by this sampler (31 s) took RegNetX/Y from −14 / −12 % to −11.5 / −10 % and the
#: zoo's dev split from 83.8 to 87.5 % (150 more again: no further gain); 245 of 6,324 kernels, ~4 %.
MIN_WEIGHT = {"grouped_conv2d": 0.03}
#: pooling kinds whose real rows also seed the other's draws (as that kind). Why: cells of searched networks take a
#: 3×3 stride-1 max or average pool as one choice among their operations (NAS-Bench-101/201, NASNet's search space,
#: GoogLeNet's branches), while ``keras.applications`` has stride-1 3×3 pools only as average pools (InceptionV3,
#: NASNet-Mobile) and max pools only striding down. Measured (session 56, the fresh TFLite store): no stride-1 max
#: pool under 94,000 elements was timed, the regressor put the NB101 networks' 72 stride-1 max pools at 0.43× their
#: time alone (everything else in them within 5 %), and those networks were predicted 16-22 % low
POOL_PARTNERS = {"max_pool": "avg_pool", "avg_pool": "max_pool"}


def synthetic_kernels() -> list[KernelConfig]:
    """Seeds for kernel types real CNNs use but no ``keras.applications`` network has: ShuffleNet's channel
    shuffle (a transpose of an (h, w, groups, c/groups) view; ShuffleNet v1/v2 maps, 2-8 groups). Without
    them LETI's engine predicted the shuffles of ShuffleNet-like networks ~10x low (as an element-wise op)."""
    out = []
    for h in (56, 28, 14, 7):
        for c in (24, 48, 96, 116, 176, 232, 240, 352, 464, 480, 960):
            for g in (2, 3, 4, 8):
                cfg = KernelConfig("transpose", h, h, c, groups=g)
                if valid(cfg):
                    out.append(cfg)
    return out


def real_architectures() -> list[str]:
    return [*REAL_ARCHITECTURES, *BUILT_ARCHITECTURES]


def _real_model(name: str):
    import keras

    if name in BUILT_ARCHITECTURES:
        from leti.models.zoo import build_zoo_model, regnet_entry

        return build_zoo_model(regnet_entry(*BUILT_ARCHITECTURES[name]))
    size = REAL_ARCHITECTURES[name]
    return getattr(keras.applications, name)(weights=None, input_tensor=keras.Input((size, size, 3), batch_size=1))


def collect_real_kernels(names=None, echo=lambda _m: None) -> pd.DataFrame:
    """The kernels (LETI's kernel table, runtime ``tflite-xnnpack``) of the named architectures (keras.applications
    and :data:`BUILT_ARCHITECTURES`; all of them by default) at their default configuration, the batch fixed at 1
    (static shapes throughout)."""
    from leti.engine.convert.from_tflite import from_tflite
    from leti.models.keras_import import keras_to_tflite
    from leti.models.tflite import release
    from leti.predict.kernels.split import split_graph

    tables = []
    for name in names or real_architectures():
        model = _real_model(name)
        tables.append(split_graph(from_tflite(keras_to_tflite(model)), "tflite-xnnpack", model=name))
        echo(f"{name}: {len(tables[-1])} kernels")
        del model
        release(collect=True)
    return pd.concat(tables, ignore_index=True)


def real_kernels(path: Path = REAL_TABLE, refresh: bool = False, echo=lambda _m: None) -> pd.DataFrame:
    """The cached real-kernel table (collected and written on first use, or with ``refresh``; architectures the
    cache lacks are collected and added)."""
    if path.is_file() and not refresh:
        table = normalize(pd.read_parquet(path), str(path))
        have = set(table.model)
        missing = [n for n in real_architectures() if n not in have]
        if not missing:
            return table
        table = pd.concat([table, collect_real_kernels(missing, echo=echo)], ignore_index=True)
    else:
        table = collect_real_kernels(echo=echo)
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(path, index=False, compression="zstd")
    return table


# ---- real kernel rows -> configurations ---------------------------------------------------------
def config_from_row(row) -> KernelConfig | None:
    """The :class:`KernelConfig` that a real kernel row describes (None for a type not buildable)."""
    t = str(row["kernel_type"])
    if t not in BUILDABLE:
        return None
    h, w, c, oh, oc = (int(row[k]) for k in ("input_h", "input_w", "input_c", "output_h", "output_c"))
    k, s, groups, n_in = int(row["kernel_h"]), int(row["stride"]), int(row["groups"]), int(row["n_inputs"])
    act = "relu" if "relu" in str(row["fused"]) else ""
    kw = {"kernel_type": t, "input_h": h, "input_w": w, "input_c": c}
    if t in ("conv2d", "depthwise_conv2d", "grouped_conv2d", "max_pool", "avg_pool"):
        padding = "same" if oh == -(-h // s) else "valid"
        kw.update(kernel=k, stride=s, padding=padding)
        if int(row["kernel_w"]) != k:
            kw.update(kernel_w=int(row["kernel_w"]))
        if t != "max_pool" and t != "avg_pool":
            kw.update(output_c=oc if t != "depthwise_conv2d" else 0, activation=act,
                      groups=groups if t == "grouped_conv2d" else 1)
    elif t == "dense":
        kw.update(output_c=oc, activation=act, variant="vector" if h == w == 1 else "spatial")
    elif t == "mean":
        kw.update(variant="global" if oh == 1 and oc == c else "channel")
    elif t in ("add", "mul", "sub", "squared_difference"):
        second = float(row["bytes_in"]) / 4 - h * w * c
        variant = ("expand" if oc != c else "const") if n_in == 1 else "broadcast" if second == c and h * w > 1 else \
            "channel1" if second == h * w and c > 1 else "same"
        kw.update(variant=variant, activation=act if t in ("add", "mul") else "", output_c=oc if oc != c else 0)
    elif t == "concat":
        kw.update(output_c=oc, n_inputs=n_in, activation=act)
    elif t == "softmax":
        kw.update(variant="vector" if h == w == 1 else "spatial")
    elif t == "pad":
        kw.update(kernel=max(oh - h, 1))
    elif t == "slice":
        kw.update(kernel=max(h - oh, 1))
    try:
        cfg = KernelConfig(**kw)
    except Exception:  # noqa: BLE001 - a real row outside what the builder makes (skipped, never guessed)
        return None
    return cfg if valid(cfg) else None


_WEIGHTED = ("conv2d", "depthwise_conv2d", "grouped_conv2d", "dense")


def _inputs_per_output(row: dict) -> float:
    """Weights (multiplications) per output value of a convolution or dense layer: window × channels per group."""
    return row["kernel_h"] * row["kernel_w"] * row["input_c"] / row["groups"]


def config_weight_bytes(c: KernelConfig) -> float:
    """Float32 bytes of the kernel's weights (convolutions and dense layers; 0 for the others)."""
    row = expected_row(c)
    return 4.0 * _inputs_per_output(row) * row["output_c"] if c.kernel_type in _WEIGHTED else 0.0


def config_flops(c: KernelConfig) -> float:
    row = expected_row(c)
    out = row["output_h"] * row["output_w"] * row["output_c"]
    if c.kernel_type in _WEIGHTED:
        return 2.0 * out * _inputs_per_output(row)
    return float(max(out, row["bytes_in"] / 4))


# ---- the sampler ---------------------------------------------------------------------------------
def _round_channels(x: float, rng: np.random.Generator) -> int:
    m = rng.choice([8, 4, 1], p=[0.5, 0.3, 0.2])
    return int(max(m, round(x / m) * m)) if x >= m else max(1, int(round(x)))


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


class KernelSampler:
    """Draws kernel configurations per type from the real distribution (jittered) and uniform coverage."""

    def __init__(self, real: pd.DataFrame | None = None) -> None:
        self.real = real_kernels() if real is None else real
        configs = [config_from_row(r) for r in self.real.to_dict("records")]
        self.pool: dict[str, list[KernelConfig]] = {}
        for c in configs:
            if c is not None:
                self.pool.setdefault(c.kernel_type if c.kernel_type != "relu6" else "relu", []).append(c)
        own = {t: list(v) for t, v in self.pool.items()}
        for t, other in POOL_PARTNERS.items():
            if t in own:
                self.pool[t] += [dataclasses.replace(c, kernel_type=t) for c in own.get(other, [])]
        #: kernel types drawn from :func:`synthetic_kernels` (no real network to weigh them by)
        seeds = synthetic_kernels()
        self.synthetic = sorted({c.kernel_type for c in seeds} - set(self.pool))
        for c in seeds:
            if c.kernel_type in self.synthetic:
                self.pool.setdefault(c.kernel_type, []).append(c)

    @property
    def kernel_types(self) -> list[str]:
        return sorted(self.pool)

    def type_weights(self, latency_ms: np.ndarray | None = None) -> dict[str, float]:
        """Each sampled type's share of the real networks' kernels (every network counted equally) averaged
        with its share of their latency (``latency_ms`` per real row, when a predictor gave it; FLOPs and
        bytes moved otherwise); :data:`SYNTHETIC_WEIGHT` for a type of :func:`synthetic_kernels`, at least
        :data:`MIN_WEIGHT` for a type whose real rows stand in for others."""
        t = self.real[self.real.kernel_type.isin(self.pool)]
        count = t.groupby("model").kernel_type.value_counts(normalize=True).groupby("kernel_type").sum()
        cost = (pd.Series(latency_ms, index=self.real.index).loc[t.index] if latency_ms is not None
                else t.flops / 2e10 + (t.bytes_in + t.bytes_out + t.bytes_weights) / 1e10)
        share = (cost / t.assign(_c=cost).groupby("model")._c.transform("sum")).groupby(t.kernel_type).sum()
        w = 0.5 * count / count.sum() + 0.5 * share / share.sum()
        floor = {k: v for k, v in MIN_WEIGHT.items() if k in w.index and w[k] < v}
        rest = 1 - SYNTHETIC_WEIGHT * len(self.synthetic) - sum(floor.values())
        w = w.drop(list(floor)) / w.drop(list(floor)).sum() * rest
        return {k: SYNTHETIC_WEIGHT if k in self.synthetic else floor.get(k, float(w.get(k, 0.0)))
                for k in self.kernel_types}

    def draw(self, kernel_type: str, n: int, rng: np.random.Generator, uniform_share: float = UNIFORM_SHARE,
             around: list[KernelConfig] | None = None) -> list[KernelConfig]:
        """``n`` valid configurations of ``kernel_type``: jittered real ones (or jittered ``around`` ones,
        when given: sampling near kernels the predictor gets wrong), a ``uniform_share`` of uniform ones."""
        base = around or self.pool.get(kernel_type)
        if not base:
            raise KeyError(kernel_type)
        out: list[KernelConfig] = []
        tries = 0
        while len(out) < n and tries < 50 * n + 50:
            tries += 1
            if rng.random() < uniform_share:
                c = self._uniform(kernel_type, base[int(rng.integers(len(base)))], rng)
            else:
                c = self._jitter(base[int(rng.integers(len(base)))], rng, mild=around is not None)
            if c is not None and valid(c) and config_flops(c) <= MAX_FLOPS and config_weight_bytes(c) <= MAX_WEIGHT_BYTES:
                out.append(c)
        return out

    @staticmethod
    def _jitter(c: KernelConfig, rng: np.random.Generator, mild: bool = False) -> KernelConfig | None:
        span = 0.2 if mild else 0.5
        d = c.to_dict()
        scale = rng.uniform(1 - span, 1 + span)
        if c.input_h > 1:
            res = rng.uniform(1 - span, 1 + span) if mild else rng.uniform(0.4, 1.6)
            d["input_h"] = d["input_w"] = max(1, int(round(c.input_h * res)))
        t = c.kernel_type
        if t == "transpose":
            d["input_c"] = c.groups * max(2, int(round(c.input_c * scale / c.groups)))
        elif t == "grouped_conv2d":
            per_in, per_out = c.input_c // c.groups, c.out_c // c.groups
            if per_in == 1:
                # a depthwise convolution written as a grouped one (ConvNeXt): LETI's engine runs it as the depthwise
                # convolution it is (passes.depthwise_from_grouped), so the grouped type takes its place and size with
                # groups of a RegNet-like width instead (46 of session 14's 76 engine samples had one channel a group,
                # 5-30x slower per FLOP than groups of 4+, and RegNet's grouped convolutions were predicted 4.3x high)
                width = int(rng.choice([4, 8, 16, 24, 32, 48, 64]))
                d["groups"] = max(2, int(round(c.input_c * scale / width)))
                d["input_c"] = d["output_c"] = width * d["groups"]
            else:
                d["groups"] = max(2, int(round(c.groups * rng.uniform(1 - span, 1 + span))))
                d["input_c"], d["output_c"] = per_in * d["groups"], per_out * d["groups"]
        if t not in ("transpose", "grouped_conv2d"):
            d["input_c"] = _round_channels(c.input_c * scale, rng)
            if c.output_c:
                d["output_c"] = _round_channels(c.output_c * rng.uniform(1 - span, 1 + span), rng)
        if t == "concat":
            d["output_c"] = d["input_c"] + max(c.n_inputs - 1, int(round((c.output_c - c.input_c) * scale)))
        if t in ("conv2d", "depthwise_conv2d", "grouped_conv2d") and rng.random() < 0.25:
            d["kernel"] = int(rng.choice([1, 3, 5, 7] if t != "depthwise_conv2d" else [3, 5, 7]))
        if t in ("max_pool", "avg_pool") and rng.random() < 0.25:
            d["kernel"] = int(rng.choice([2, 3]))
        if t in ("conv2d", "depthwise_conv2d") and rng.random() < 0.15:
            d["stride"] = 3 - c.stride if c.stride in (1, 2) else 1
        if c.activation and rng.random() < 0.1:
            d["activation"] = ""
        try:
            return KernelConfig.from_dict(d)
        except Exception:  # noqa: BLE001 - an invalid jitter is redrawn
            return None

    @staticmethod
    def _uniform(t: str, like: KernelConfig, rng: np.random.Generator) -> KernelConfig | None:
        """Sizes log-uniform over CNN ranges; the variant and input count of ``like`` (a real kernel)."""
        h = 1 if like.input_h == 1 else int(round(_log_uniform(rng, 2, 160)))
        c = _round_channels(_log_uniform(rng, 1, 1024), rng)
        d = {"kernel_type": t, "input_h": h, "input_w": h, "input_c": c, "variant": like.variant,
             "n_inputs": like.n_inputs, "padding": "same" if rng.random() < 0.8 else "valid"}
        if t in ("conv2d", "grouped_conv2d", "dense"):
            d["output_c"] = _round_channels(_log_uniform(rng, 1, 1024 if t != "dense" else 4096), rng)
        if t in ("conv2d", "depthwise_conv2d", "grouped_conv2d"):
            d.update(kernel=int(rng.choice([1, 3, 5, 7] if t != "depthwise_conv2d" else [3, 5, 7])),
                     stride=int(rng.choice([1, 2], p=[0.7, 0.3])))
            d["activation"] = "relu" if rng.random() < 0.5 else ""
        if t == "grouped_conv2d" and rng.random() < 0.5:
            # a bottleneck's grouped convolution (ResNeXt, RegNet): as many channels out as in, groups of a fixed
            # width. Keras 3 ships no such network, so the real pool has only ConvNeXt's depthwise-as-grouped ones
            # (measured: networks of these were predicted ~12 % high with the pool alone)
            width = int(rng.choice([4, 8, 16, 24, 32, 48, 64]))
            d["groups"] = max(2, int(round(_log_uniform(rng, 2, max(3, 1024 // width)))))
            d["input_c"] = d["output_c"] = width * d["groups"]
            d["kernel"] = int(rng.choice([3, 3, 3, 5]))
        elif t == "grouped_conv2d":  # at least two input channels a group (one is a depthwise convolution)
            d["groups"] = int(rng.choice([2, 4, 8, 16, 32]))
            d["input_c"] = d["groups"] * max(2, c // d["groups"])
            d["output_c"] = d["groups"] * max(1, d["output_c"] // d["groups"])
        if t in ("max_pool", "avg_pool"):
            d.update(kernel=int(rng.choice([2, 3])), stride=int(rng.choice([1, 2])))
        if t == "concat":
            d["output_c"] = c + _round_channels(_log_uniform(rng, max(like.n_inputs - 1, 1), 512), rng)
        if t in ("pad", "slice"):
            d["kernel"] = int(rng.choice([1, 2, 3]))
        if t == "transpose":
            d["groups"] = int(rng.choice([2, 3, 4, 8]))
            d["input_c"] = d["groups"] * max(2, c // d["groups"])
        if like.activation and t in ("add", "mul", "concat", "dense"):
            d["activation"] = like.activation if rng.random() < 0.5 else ""
        try:
            return KernelConfig.from_dict(d)
        except Exception:  # noqa: BLE001
            return None


@functools.lru_cache(maxsize=1)
def default_sampler() -> KernelSampler:
    """The sampler of the cached real-kernel table, built once per process (a few seconds: every real row turned
    into a configuration); a build and its fits' coverage weights (:mod:`.coverage`) share it."""
    return KernelSampler()
