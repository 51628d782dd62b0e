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
"""

from __future__ import annotations

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
FEATURES: tuple[str, ...] = FEATURES_V1 + TILING


def check_names(names, where: str = "the predictor") -> tuple[str, ...]:
    """``names`` when they are a feature list this LETI computes (:data:`FEATURES` or a prefix of it, as
    older predictors saved), else a :class:`~leti.errors.CorruptModelError`."""
    from leti.errors import CorruptModelError

    names = tuple(names)
    if len(names) < len(FEATURES_V1) or names != FEATURES[: len(names)]:
        raise CorruptModelError(f"{where}: the predictor's kernel features differ from this LETI's")
    return names


def _tiled_flops(pixels, cin_per_group, cout, k2, mr: int, nr: int) -> np.ndarray:
    return 2.0 * np.ceil(pixels / mr) * mr * np.ceil(cout / nr) * nr * cin_per_group * k2


def kernel_features(table: pd.DataFrame, names: tuple[str, ...] = FEATURES) -> np.ndarray:
    """``(N, len(names))`` float32 features of a kernel table (LETI's schema, :mod:`.schema`); ``names`` is
    :data:`FEATURES` or a prefix of it (:func:`check_names`)."""
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
    if len(names) > len(FEATURES_V1):
        pixels = np.maximum(t["output_h"].to_numpy(np.float64) * t["output_w"].to_numpy(np.float64), 1)
        k2 = t["kernel_h"].to_numpy(np.float64) * t["kernel_w"].to_numpy(np.float64)
        cpg = np.maximum(cin / np.maximum(groups, 1), 1)
        parts += [np.log(pixels), np.log(np.maximum(cin, 1)), np.log(np.maximum(cout, 1)), cout % 8, cout % 16,
                  cin % 16, np.log(_tiled_flops(pixels, cpg, cout, k2, 4, 8)),
                  np.log(_tiled_flops(pixels, cpg, cout, k2, 7, 16)), t["output_w"].to_numpy(np.float64)]
    return np.ascontiguousarray(np.stack(parts[: len(names)], axis=1), np.float32)
