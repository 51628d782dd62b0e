"""File-level entry points of kernel-level prediction, what ``leti fit --kernels`` and
``leti predict --kernels`` run (the CLI only parses options and prints).

Why a module: the CLI contract reads tables, keeps the user's rows and columns exactly as given
(``predict`` returns the same rows plus ``predicted_ms``) and writes files; the predictor itself works on
LETI's kernel schema. This is the seam between the two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from leti.errors import DatasetError
from leti.predict.kernels.model import KernelLatencyPredictor, fit_kernel_predictor, load_kernel_predictor
from leti.predict.kernels.schema import as_kernel_table, read_frame, read_kernel_table, read_model_latency


def fit_kernels_file(kernels: Path, out: Path, device: str | None = None, e2e: Path | None = None,
                     params: dict[str, Any] | None = None) -> KernelLatencyPredictor:
    """Fit on the kernel table at ``kernels`` (one device: ``device`` picks it when there are several) and
    save to ``out``; ``e2e`` (QED e2e table or ``model, device, latency_ms``) fits the overhead."""
    table = read_kernel_table(kernels, device)
    devices = sorted(set(table.device))
    if len(devices) > 1:
        raise DatasetError(f"{kernels} has kernels of several devices ({', '.join(devices)}); choose one with --device")
    lat = read_model_latency(e2e, devices[0]) if e2e is not None else None
    try:
        pred = fit_kernel_predictor(table, lat, str(kernels), **(params or {}))
    except TypeError as exc:  # an unknown --param
        raise DatasetError(f"bad kernel predictor parameters: {exc}") from None
    pred.save(out)
    pred.left_out_rows = int(table.attrs.get("unusable_rows", 0))  # op-profile rows without shapes (usable false)
    return pred


def adapt_kernels_file(kernels: Path, out: Path, source: Path, device: str | None = None,
                       e2e: Path | None = None) -> KernelLatencyPredictor:
    """Kernel-level transfer (:mod:`leti.predict.kernels.adapt`): the kernel predictor at ``source`` (another
    device) adapted to the device of the kernel table at ``kernels`` (a few models' kernels), saved to ``out``;
    ``e2e`` rescales (or, with enough models, refits) the per-model overhead."""
    from leti.predict.kernels.adapt_fit import adapt_kernel_predictor

    src = load_kernel_predictor(source)
    table = read_kernel_table(kernels, device)
    devices = sorted(set(table.device))
    if len(devices) > 1:
        raise DatasetError(f"{kernels} has kernels of several devices ({', '.join(devices)}); choose one with --device")
    lat = read_model_latency(e2e, devices[0]) if e2e is not None else None
    pred = adapt_kernel_predictor(src, table, lat, str(kernels))
    pred.save(out)
    pred.left_out_rows = int(table.attrs.get("unusable_rows", 0))
    pred.adapted_from = (src.device, int(table.model.nunique()), len(table))
    return pred


def predict_kernels_file(kernels: Path, predictor: Path | KernelLatencyPredictor,
                         allow_unknown: bool = False) -> tuple[pd.DataFrame, dict[str, str]]:
    """The rows of ``kernels`` as read plus ``predicted_ms``, and {unknown type: type used for it}."""
    pred = predictor if isinstance(predictor, KernelLatencyPredictor) else load_kernel_predictor(predictor)
    frame = read_frame(kernels)
    table = as_kernel_table(frame, str(kernels))
    rows = pred.predict_kernels(table, allow_unknown, str(kernels))
    stood_in = {t: a for t, a in zip(table.kernel_type, rows.predicted_as) if t != a}
    return frame.reset_index(drop=True).assign(predicted_ms=rows["predicted_ms"].to_numpy()), stood_in
