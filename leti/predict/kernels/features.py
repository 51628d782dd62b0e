"""Per-kernel features for the kernel regressors.

Why these: a kernel's latency on a phone GPU or CPU is set by the work it does (FLOPs), the memory it
moves (activations in and out, weights) and how well its shape maps onto the hardware (channel counts
against the SIMD/warp width, spatial sizes against the tiling, the kernel window and stride, groups).
Counts enter as logs — latencies span four orders of magnitude and the regressors fit log latency —
together with the arithmetic intensity (FLOPs per byte: compute- vs memory-bound) and the ops fused
into the kernel. :data:`FEATURES` names the columns in order; the saved predictor records them.

The tiling features (:data:`TILING`, added after :data:`FEATURES_V1`): XNNPACK runs convolutions and dense
layers as GEMM micro-kernels that compute tiles of a few output pixels by 8 or 16 output channels, so a
kernel whose channels or pixels do not fill the last tile pays for a whole one. The FLOPs of the padded
tiles (4x8 and 7x16, the AVX2 and AVX-512 tiles), the output channels modulo 8/16 and the pixel, input and
output channel counts as logs cut the median cross-validated error on the local CPU from 9.5 % to 7.8 % for
conv2d kernels and from 9.5 % to 8.8 % over all types (3,947 kernels, 4 folds), and the summed kernels of 113
calibration chains from 5.6 % to 4.5 % median error. A predictor saved with the older feature list (a prefix
of this one) still loads and predicts with it.

The scheme features (:data:`SCHEME`, LETI's engine on the CPU only): the engine computes a k×k convolution
by Winograd F(n×n) with n from the shape, by im2col, or a 1×1 one as a (Strassen) product — its own
pre-inference choice, recomputed here from the kernel's shape with the engine's rule. The cost per FLOP of
these differs by 2-3× (a 3×3 convolution of 16 channels on 32×32: 0.22 ms by Winograd F(4×4), 0.14 ms by
im2col), which FLOPs and shapes alone leave the regressors to guess: without them the engine's predictor put
the Winograd convolutions of small NB101 networks at half their time.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

#: fused ops that get an indicator feature (others count in ``n_fused``)
FUSED_FLAGS = ("add", "relu", "hard_swish", "sigmoid", "mul")

FEATURES_V1: tuple[str, ...] = (
    "log_flops", "log_bytes_in", "log_bytes_out", "log_bytes_weights", "log_bytes_total", "log_intensity",
    "input_h", "input_c", "output_h", "output_c", "kernel", "stride", "groups", "log_c_per_group",
    "n_inputs", "c_mod4", "c_mod8", "out_c_mod4", "n_fused", *(f"fused_{f}" for f in FUSED_FLAGS),
)
TILING: tuple[str, ...] = ("log_pixels", "log_input_c", "log_output_c", "out_c_mod8", "out_c_mod16", "c_mod16",
                           "log_flops_tile4x8", "log_flops_tile7x16", "output_w")
#: tiles per group (:data:`TILING_V2`): a grouped convolution runs one GEMM per group, so each group's output
#: channels fill whole tiles (RegNet's groups of 8 channels pay for 16 in a 7×16 tile, not 8/16 of one); and the
#: engine's own 6×16 micro-kernel, whose last panel of at most 8 columns costs half (``csrc/gemm.c``)
TILING_V2: tuple[str, ...] = ("log_flops_gtile4x8", "log_flops_gtile7x16", "log_flops_tile6x16")
#: 32-channel panels (:data:`TILING_V3`): on a core with AVX-512 XNNPACK computes a product in panels of 32 output
#: channels when the last panel holds more than 16 of them, else in panels of 16 throughout, and the 16-wide tiles run
#: ~0.8× as fast per FLOP: on a Zen 5, 1×1 convolutions of 10×10×240 → N ran at 182-188 GFLOP/s for every N of 16
#: modulo 32 and 226-233 for every N of 0 modulo 32 (session 36, ``docs/any_model.md``). The output channels (per
#: group) modulo 32, the indicator of a last panel of at most 16, and the FLOPs of 7×32 tiles per group
TILING_V3: tuple[str, ...] = ("out_c_mod32", "gout_c_mod32", "narrow32", "log_flops_gtile7x32")
FEATURES_V2: tuple[str, ...] = FEATURES_V1 + TILING + TILING_V2
FEATURES: tuple[str, ...] = FEATURES_V2 + TILING_V3
SCHEME: tuple[str, ...] = ("scheme_winograd_n", "scheme_im2col", "scheme_strassen_depth", "log_scheme_mults")
#: the feature list of an engine-CPU kernel predictor
ENGINE_FEATURES: tuple[str, ...] = FEATURES + SCHEME
#: an engine-CPU predictor saved before :data:`TILING_V2`, and one saved before :data:`TILING_V3`
ENGINE_FEATURES_V1: tuple[str, ...] = FEATURES_V1 + TILING + SCHEME
ENGINE_FEATURES_V2: tuple[str, ...] = FEATURES_V2 + SCHEME
#: runtimes whose convolution scheme is the engine CPU backend's rule (the CUDA backend picks by measurement)
SCHEME_RUNTIMES = frozenset({"leti-engine-cpu"})


def features_for(runtimes) -> tuple[str, ...]:
    """The feature list of a predictor fitted on kernels of ``runtimes`` (one or several names)."""
    names = {str(r) for r in ([runtimes] if isinstance(runtimes, str) else runtimes)}
    return ENGINE_FEATURES if names and names <= SCHEME_RUNTIMES else FEATURES


def check_names(names, where: str = "the predictor") -> tuple[str, ...]:
    """``names`` when they are a feature list this LETI computes (:data:`FEATURES` or a prefix of it, as
    older predictors saved), else a :class:`~leti.errors.CorruptModelError`."""
    from leti.errors import CorruptModelError

    names = tuple(names)
    if names not in (ENGINE_FEATURES, ENGINE_FEATURES_V1, ENGINE_FEATURES_V2) and (len(names) < len(FEATURES_V1)
                                                               or names != FEATURES[: len(names)]):
        raise CorruptModelError(f"{where}: the predictor's kernel features differ from this LETI's")
    return names


def _tiled_flops(pixels, cin_per_group, cout, k2, mr: int, nr: int) -> np.ndarray:
    return 2.0 * np.ceil(pixels / mr) * mr * np.ceil(cout / nr) * nr * cin_per_group * k2


def _group_tiled_flops(pixels, cin_per_group, cout, groups, k2, mr: int, nr: int, half: bool = False) -> np.ndarray:
    """FLOPs of ``mr``-pixel by ``nr``-channel tiles where a grouped convolution (more than one input channel per
    group) pads each group's output channels to whole tiles; ``half``: a last tile of at most ``nr / 2`` channels
    costs half a tile (the engine's half panels)."""
    per_group = (groups > 1) & (cin_per_group > 1)
    g = np.where(per_group, groups, 1.0)
    c = cout / g
    whole = np.floor(c / nr) * nr
    rest = c - whole
    pad = np.where(rest == 0, 0.0, np.where(half & (rest <= nr / 2), nr / 2, float(nr)))
    return 2.0 * np.ceil(pixels / mr) * mr * g * (whole + pad) * cin_per_group * k2


@lru_cache(maxsize=65536)
def _engine_scheme(ih: int, iw: int, ic: int, oc: int, kh: int, kw: int, stride: int, oh: int) -> tuple[float, ...]:
    """(Winograd n or 0, im2col 0/1, Strassen depth, log multiplications) of the engine CPU backend's scheme
    for one convolution ('same' padding where the output has ⌈input / stride⌉ rows, else 'valid')."""
    from leti.engine.ops import conv2d
    from leti.engine.schedule import ScheduleOptions

    attrs = {"strides": [stride, stride], "padding": "same" if oh == -(-ih // stride) else "valid"}
    shapes = [(1, ih, iw, ic), (kh, kw, ic, oc)]
    scheme = conv2d.choose_scheme(shapes, attrs, ScheduleOptions())
    mults = conv2d.mul(shapes, None, attrs, scheme)
    return (float(scheme.params.get("n", 0)) if scheme.name == "winograd" else 0.0, float(scheme.name == "im2col"),
            float(scheme.params.get("depth", 0)) if scheme.name == "strassen" else 0.0, float(np.log1p(mults)))


def scheme_columns(t: pd.DataFrame) -> list[np.ndarray]:
    """The :data:`SCHEME` columns: the engine's scheme of each plain convolution, zeros for other kernels."""
    out = np.zeros((len(t), len(SCHEME)))
    conv = (t["kernel_type"].astype(str).to_numpy() == "conv2d") & (t["groups"].to_numpy() == 1)
    cols = ("input_h", "input_w", "input_c", "output_c", "kernel_h", "kernel_w", "stride", "output_h")
    for i, row in zip(np.flatnonzero(conv), t.loc[conv, list(cols)].to_numpy(np.int64)):
        out[i] = _engine_scheme(*(int(v) for v in row))
    return list(out.T)


def kernel_features(table: pd.DataFrame, names: tuple[str, ...] = FEATURES) -> np.ndarray:
    """``(N, len(names))`` float32 features of a kernel table (LETI's schema, :mod:`.schema`); ``names`` is
    :data:`FEATURES`, a prefix of it or :data:`ENGINE_FEATURES` (:func:`check_names`)."""
    t = table
    flops = t["flops"].to_numpy(np.float64)
    bi, bo, bw = (t[c].to_numpy(np.float64) for c in ("bytes_in", "bytes_out", "bytes_weights"))
    total = bi + bo + bw
    cin, cout = t["input_c"].to_numpy(np.float64), t["output_c"].to_numpy(np.float64)
    groups = t["groups"].to_numpy(np.float64)
    fused = t["fused"].astype(str).str.split("+")
    parts = [
        np.log1p(flops), np.log1p(bi), np.log1p(bo), np.log1p(bw), np.log1p(total),
        np.log((flops + 1) / (total + 1)),
        t["input_h"].to_numpy(np.float64), cin, t["output_h"].to_numpy(np.float64), cout,
        t["kernel_h"].to_numpy(np.float64), t["stride"].to_numpy(np.float64), groups,
        np.log(np.maximum(cin / groups, 1)), t["n_inputs"].to_numpy(np.float64),
        cin % 4, cin % 8, cout % 4,
        fused.map(lambda p: sum(1 for x in p if x)).to_numpy(np.float64),
        *(fused.map(lambda p, f=f: float(f in p)).to_numpy(np.float64) for f in FUSED_FLAGS),
    ]
    cols = dict(zip(FEATURES_V1, parts))
    if len(names) > len(FEATURES_V1):
        pixels = np.maximum(t["output_h"].to_numpy(np.float64) * t["output_w"].to_numpy(np.float64), 1)
        k2 = t["kernel_h"].to_numpy(np.float64) * t["kernel_w"].to_numpy(np.float64)
        g = np.maximum(groups, 1)
        cpg = np.maximum(cin / g, 1)
        cols.update(zip(TILING, [
            np.log(pixels), np.log(np.maximum(cin, 1)), np.log(np.maximum(cout, 1)), cout % 8, cout % 16,
            cin % 16, np.log(_tiled_flops(pixels, cpg, cout, k2, 4, 8)),
            np.log(_tiled_flops(pixels, cpg, cout, k2, 7, 16)), t["output_w"].to_numpy(np.float64)]))
        if any(n in TILING_V2 for n in names):
            cols.update(zip(TILING_V2, [np.log(np.maximum(_group_tiled_flops(pixels, cpg, cout, g, k2, mr, nr, half), 1))
                                        for mr, nr, half in ((4, 8, False), (7, 16, False), (6, 16, True))]))
        if any(n in TILING_V3 for n in names):
            rest = np.floor(cout / np.where((g > 1) & (cpg > 1), g, 1.0)) % 32  # per group, as the group tiles
            cols.update(zip(TILING_V3, [cout % 32, rest, ((rest > 0) & (rest <= 16)).astype(np.float64),
                                        np.log(np.maximum(_group_tiled_flops(pixels, cpg, cout, g, k2, 7, 32), 1))]))
    if any(n in SCHEME for n in names):
        cols.update(zip(SCHEME, scheme_columns(t)))
    return np.ascontiguousarray(np.stack([cols[n] for n in names], axis=1), np.float32)
