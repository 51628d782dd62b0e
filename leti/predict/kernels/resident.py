"""What LETI's engine holds and runs for a kernel beyond the model's own tensors: the weights it reads per inference
as the runtime stores them, and whether the step runs inside its native program.

Why: a kernel row carries the model's weights (``bytes_weights``: k·k·ic·oc floats), but the engine's CPU backend
runs a convolution with weights it transformed at pre-inference (``leti/engine/backends/cpu/conv.py``):

* a Winograd F(n×n, k×k) convolution multiplies by ``U = G W Gᵀ``, one ic × oc matrix per position of the α × α
  tile (α = n + k − 1): α²/k² the filter's bytes, 4× for a 3×3 filter at n = 4, 2× for a 7×7 one at n = 4 (α = 10);
* every product (1×1, im2col, the window over few channels, Winograd's α² products) reads packed panels of 16
  output channels (``ckernels.pack``), the last one zero-padded.

Those are the bytes that pass through the cache each inference and that a model evicts between two runs of the
kernel, so the cache term (:mod:`.cache`) counts them (:func:`resident_weight_bytes`). On the engine zoo's dev split
(session 26) they are 1.15-2.4× the model file's weights in the ResNet-basic variants, up to 2.1× in NB101 networks,
1.34× in DenseNet and within 5 % elsewhere.

And a Winograd convolution with α > 8 (:func:`stepped`: a 7×7 window at F(4×4), α = 10) is a step the engine cannot
describe as records of its native program (``conv.py`` takes α ≤ 8): it runs in numba between two programs
(``docs/engine.md``, "Native programs"). Timed alone such a kernel runs the same numba code, but the build's
calibration networks and chains hold none (their random convolutions are 3×3/5×5 or strided), so nothing teaches the
overhead what it costs inside a network. On the engine zoo's dev split (session 26) the five models with such steps
(ResNet-basic and -bottleneck variants with 7×7 windows, 2-5 steps each) ran 0.17-0.19 ms per step over their
kernels' prediction in four of them (+4 % in the fifth; the other 75 models: median error −0.3 %), while the
conv2d regressor's cross-validated error on the build's 200 such kernels is unbiased (median log ratio +0.01);
:data:`STEPPED_MS` is that cost, added per step (:meth:`~.model.KernelLatencyPredictor.in_model`). It is not the
break of the program as such: the three calibration chains with a spatial slice (the other op that runs between
programs) ran 0.00-0.03 ms over the chains' median ratio. What inside the numba Winograd step costs it in a network
is not measured (``Session.profile`` of such a model would tell).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: output channels per packed weight panel of the engine's products (``ckernels.NR``)
PANEL = 16
#: the largest Winograd tile side α the native program's Winograd record takes (``conv.py``: ``alpha <= 8``)
NATIVE_ALPHA_MAX = 8
#: what a stepped kernel (:func:`stepped`) costs in a network beyond its time alone (ms; chosen on the engine zoo's
#: dev split among 0.05-0.2 ms per step and 0.1-0.4× the kernel's own time, session 26: 0.1-0.2 ms and 0.2-0.3× reach
#: the same dev Acc@10, 93.8 %, and 0.15-0.2 ms the best dev Acc@5, 67.5 %)
STEPPED_MS = 0.15


def _engine_rows(rows: pd.DataFrame) -> np.ndarray:
    from leti.predict.kernels.features import SCHEME_RUNTIMES

    if "runtime" not in rows:
        return np.zeros(len(rows), bool)
    return rows["runtime"].astype(str).isin(SCHEME_RUNTIMES).to_numpy()


def _winograd_alpha(rows: pd.DataFrame) -> np.ndarray:
    """α = n + k − 1 of each plain convolution the engine runs by Winograd F(n×n, k×k), else 0."""
    from leti.predict.kernels.features import scheme_columns

    n = scheme_columns(rows)[0]
    return np.where(n > 0, n + rows["kernel_h"].to_numpy(np.float64) - 1, 0.0)


def resident_weight_bytes(rows: pd.DataFrame) -> np.ndarray:
    """Per kernel row: the weight bytes the runtime reads per inference — for LETI's engine on the CPU the
    Winograd-transformed filters (α² · ic · oc) and packed panels of :data:`PANEL` output channels for plain
    convolutions and dense layers; ``bytes_weights`` for every other kernel and runtime."""
    w = rows["bytes_weights"].to_numpy(np.float64).copy()
    engine = _engine_rows(rows)
    if not engine.any():
        return w
    t = rows["kernel_type"].astype(str).to_numpy()
    plain = engine & (((t == "conv2d") & (rows["groups"].to_numpy() == 1)) | (t == "dense")) & (w > 0)
    if not plain.any():
        return w
    sub = rows[plain]
    alpha = _winograd_alpha(sub)
    k = sub["kernel_h"].to_numpy(np.float64) * sub["kernel_w"].to_numpy(np.float64)
    taps = np.where(alpha > 0, alpha * alpha, k)
    panels = np.ceil(sub["output_c"].to_numpy(np.float64) / PANEL) * PANEL
    w[plain] = taps * sub["input_c"].to_numpy(np.float64) * panels * 4.0
    return w


def stepped(rows: pd.DataFrame) -> np.ndarray:
    """Per kernel row: True where LETI's engine on the CPU runs it outside its native program (a Winograd convolution
    with α > :data:`NATIVE_ALPHA_MAX`); False for other kernels and runtimes."""
    out = np.zeros(len(rows), bool)
    engine = _engine_rows(rows) & (rows["kernel_type"].astype(str).to_numpy() == "conv2d")
    if engine.any():
        out[engine] = _winograd_alpha(rows[engine]) > NATIVE_ALPHA_MAX
    return out


def stepped_ms(rows: pd.DataFrame) -> np.ndarray:
    """Per kernel row: :data:`STEPPED_MS` for a stepped kernel (:func:`stepped`), else 0."""
    return np.where(stepped(rows), STEPPED_MS, 0.0)
