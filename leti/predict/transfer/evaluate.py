"""The transfer protocol: per target device, train size and seed, N target cells (random, or chosen
with :func:`~leti.predict.transfer.choose.choose`) fit each predictor — transfer predictors with the
sources, ordinary ones from scratch on the N cells alone (the baseline) — and every other target cell
tests it. Results are :class:`~leti.predict.evaluate.PredictorResult` s, one per (predictor, N).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from leti.predict.base import make_predictor, predictor_class
from leti.predict.evaluate import PredictorResult, family_of, select
from leti.predict.metrics import score_all
from leti.predict.transfer import TRANSFER, make_transfer
from leti.predict.transfer.choose import choose
from leti.predict.transfer.data import TransferData, check_train_size


def split(data, sources, n: int, seed: int, chosen: bool | str) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices of one target device."""
    total = len(data.latency_ms)
    how = {"method": chosen} if isinstance(chosen, str) else {}  # True: choose's default method
    tr = choose(sources, data.cells, n, seed=seed, **how) if chosen else np.random.default_rng(seed).permutation(total)[:n]
    te = np.setdiff1d(np.arange(total), tr)
    return tr, te


def fit_one(spec: str, data, sources, tr: np.ndarray, seed: int, folds: int = 1,
            overrides: dict[str, Any] | None = None):
    """One predictor fitted on the target cells ``tr`` (with the sources when it is a transfer predictor)."""
    over = dict(overrides or {})
    t_tr, y_tr = data.cells.take(tr), data.latency_ms[tr]
    if spec in TRANSFER:
        model = make_transfer(spec, **over)
        if "random_state" in model.get_params():
            model.set_params(random_state=int(seed))
        return model.fit(t_tr, y_tr, sources), {**model.get_params()}, []
    family, _ = family_of(spec)
    if "random_state" in predictor_class(family)().get_params():
        over.setdefault("random_state", int(seed))
    params, cv = select(spec, t_tr, y_tr, min(folds, len(tr)), seed, over)
    return make_predictor(family, **params).fit(t_tr, y_tr), params, cv


def evaluate_transfer(data: TransferData, specs: Sequence[str], train_sizes: Sequence[int],
                      seeds: Sequence[int] = (0, 1, 2), folds: int = 1, chosen: bool | str = False,
                      overrides: dict[str, dict[str, Any]] | None = None,
                      progress: Callable[[str], None] | None = None
                      ) -> dict[str, dict[str, dict[int, PredictorResult]]]:
    """``{device: {predictor: {N: PredictorResult}}}``."""
    overrides = overrides or {}
    out: dict[str, dict[str, dict[int, PredictorResult]]] = {}
    for d in data.targets:
        for n in train_sizes:
            check_train_size(n, len(d.latency_ms), f"the target {d.device!r}", need_test=True)
        res = out[d.device] = {s: {n: PredictorResult(s) for n in train_sizes} for s in specs}
        for n in train_sizes:
            for k, seed in enumerate(seeds):
                tr, te = split(d, data.sources, n, seed, chosen)
                for spec in specs:
                    t0 = time.perf_counter()
                    model, params, cv = fit_one(spec, d, data.sources, tr, seed, folds, overrides.get(spec))
                    t1 = time.perf_counter()
                    pred = model.predict(d.cells.take(te))
                    t2 = time.perf_counter()
                    r = res[spec][n]
                    r.seeds.append({"seed": int(seed), "params": params, "cv": cv,
                                    "metrics": score_all(d.latency_ms[te], pred),
                                    "seconds": {"fit": t1 - t0, "predict": t2 - t1}, "train": len(tr), "test": len(te)})
                    if k == 0:
                        r.scatter = (d.latency_ms[te], pred)
                    if progress is not None:
                        progress(spec)
    return out


def to_json(res: dict[int, PredictorResult]) -> dict[str, Any]:
    """One predictor of one device: today's ``{spec, mean, std, seeds}`` for the first train size, and
    ``train_sizes: {N: {mean, std, seeds}}`` for every one."""
    sizes = list(res)
    first = res[sizes[0]].to_json()
    first["train_sizes"] = {str(n): {k: v for k, v in r.to_json().items() if k != "spec"} for n, r in res.items()}
    return first


def expand_specs(specs: str) -> list[str]:
    """``--predictors`` with transfer: transfer names and from-scratch baselines; ``all`` = every transfer
    predictor, ``catboost-rich`` and ``flops``."""
    from leti.errors import LetiError
    from leti.predict.evaluate import expand

    names = [s.strip() for s in specs.split(",") if s.strip()]
    out: list[str] = []
    for n in names:
        for m in ([*TRANSFER.names(), "catboost-rich", "flops"] if n == "all" else [n]):
            if m not in TRANSFER:
                expand([m])  # raises for an unknown name
            if m not in out:
                out.append(m)
    if not out:
        raise LetiError("no predictors given")
    return out
