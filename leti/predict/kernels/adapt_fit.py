"""A known device's kernel-level predictor adapted to a new device from a few measured models.

:mod:`.adapt` corrects the kernels; this module also carries the per-model overhead over. The overhead
(:class:`~leti.predict.kernels.overhead.Overhead`: launch gaps, unlisted ops, copies) needs about as many models
with an end-to-end latency as it has terms (kernel types + 4) to be fitted afresh; a new device measured on
2–10 models has fewer. Its *form* carries over like the kernels' does, so the source device's overhead is
kept and scaled by one factor — the geometric mean, over the new device's models with an end-to-end latency,
of measured / predicted — and its spread becomes the larger of the source's and that of those ratios. With
enough models the overhead is fitted afresh, as ``leti fit --kernels`` does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from leti.errors import DatasetError
from leti.predict.kernels.adapt import AdaptedKernels
from leti.predict.kernels.model import KernelLatencyPredictor, table_identity
from leti.predict.kernels.overhead import Overhead, fit_on_networks, model_aggregates, outlier_sigmas


def overhead_scale(base: Overhead, agg: pd.DataFrame, e2e_ms: np.ndarray) -> tuple[float, float]:
    """(geometric-mean ratio of ``e2e_ms`` to ``base``'s prediction, spread of the log ratios)."""
    log_ratio = np.log(np.asarray(e2e_ms, np.float64) / base.predict(agg))
    spread = float(np.sqrt(np.mean((log_ratio - log_ratio.mean()) ** 2))) if len(log_ratio) > 1 else 0.0
    return float(np.exp(log_ratio.mean())), spread


def scaled_overhead(base: Overhead, agg: pd.DataFrame, e2e_ms: np.ndarray) -> Overhead:
    """``base`` with every coefficient times :func:`overhead_scale` (``base`` = the identity overhead, latency =
    sum of kernels, when it has none), at ``base``'s cache size."""
    terms, coef = (list(base.terms), list(base.coef)) if base.coef else (["sum_ms"], [1.0])
    r, spread = overhead_scale(Overhead(terms, coef), agg, e2e_ms)
    return Overhead(terms, [c * r for c in coef], max(base.resid_std, spread), len(agg), cache_mb=base.cache_mb)


def adapt_kernel_predictor(source: KernelLatencyPredictor, table: pd.DataFrame, e2e: pd.DataFrame | None = None,
                           where: str = "kernels") -> KernelLatencyPredictor:
    """``source`` (device A) adapted to the device of ``table`` (B's measured kernels, one device, same runtime
    and precision); ``e2e`` (``model, latency_ms``) rescales or refits the overhead on B's models."""
    ident = table_identity(table, where)
    src = f"the source predictor {source.source}" if source.source else "the source predictor"
    if ident["device"] == source.device:
        raise DatasetError(f"{where}: the kernels are of device {ident['device']!r}, the device {src} already "
                           f"describes; transfer needs kernels of another device")
    for col in ("runtime", "precision"):
        mine = getattr(source, col)
        if mine and ident[col] and ident[col] != mine:
            raise DatasetError(f"{where}: kernels of {col} {ident[col]!r}, but {src} describes {source.describes}; "
                               f"kernel transfer needs both of one {col}")
    reg = AdaptedKernels(source.regressors, source.device).fit(table)
    overhead, note = source.overhead, f"overhead: that of {source.device!r} as is (no end-to-end latency of these models)"
    if e2e is not None:
        e2e = e2e[e2e.device.isin([ident["device"], ""])] if "device" in e2e else e2e
        lat = e2e.groupby("model")["latency_ms"].mean()
        shared = [m for m in pd.unique(table.model) if m in lat.index]
        if shared:
            sub = table[table.model.isin(shared)]
            agg = model_aggregates(sub, reg.predict(sub)[0])
            y = lat.loc[agg.index].to_numpy()
            if len(shared) >= table.kernel_type.nunique() + 4:
                overhead, note = Overhead().fit(agg, y), f"overhead fitted on {len(shared)} models"
            else:
                overhead = scaled_overhead(source.overhead, agg, y)
                r = overhead_scale(source.overhead, agg, y)[0]
                note = f"overhead: that of {source.device!r} scaled by {r:.3f} ({len(shared)} models with an end-to-end latency)"
    pred = KernelLatencyPredictor(reg, overhead, ident["device"], ident["runtime"], ident["precision"], source.rules)
    pred.overhead_note = note
    return pred


def networks_overhead(predictor: KernelLatencyPredictor, base: Overhead, nets: pd.DataFrame | None,
                      net_kernels: pd.DataFrame | None) -> tuple[Overhead, str]:
    """The overhead of ``predictor`` from timed whole networks (``nets``: ``model, latency_ms``; ``net_kernels``
    their kernel rows), those of at most :data:`~leti.predict.kernels.build_fit.MAX_NETWORK_WEIGHTS_MB` of weights
    (as a scratch build takes them): fitted afresh with per-type scales from
    :data:`~leti.predict.kernels.build_fit.MIN_NETWORKS` of them, else ``base`` scaled by :func:`overhead_scale`
    (``base`` empty: latency = sum of kernels, scaled; the plain sum scaled instead of ``base`` when its log
    ratios to the networks spread less: the source's overhead terms describe the source's runtime), else ``base``
    as is; and a note saying which."""
    from leti.predict.kernels.build_fit import MAX_NETWORK_WEIGHTS_MB, MIN_NETWORKS

    if nets is None or nets.empty or net_kernels is None or net_kernels.empty:
        return base, "overhead: the source's as is (no network timed)"
    got = _network_rows(predictor, nets, net_kernels)
    if got is None:
        return base, f"overhead: the source's as is (the {len(nets)} networks timed hold over {MAX_NETWORK_WEIGHTS_MB:g} MB)"
    agg, y = got
    if len(y) >= MIN_NETWORKS:
        fitted, odd = fit_on_networks(agg, y, outlier_sigmas(predictor.runtime))
        left = f", {len(odd)} left out as outliers ({', '.join(odd)})" if odd else ""
        return fitted, f"overhead fitted on {len(y) - len(odd)} networks{left}: {' + '.join(fitted.terms)}"
    plain = Overhead()
    if base.coef and overhead_scale(plain_sum(), agg, y)[1] < overhead_scale(base, agg, y)[1]:
        base, whose = plain, "the sum of kernels"  # the source's overhead describes its runtime, not this one
    else:
        whose = "the source's" if base.coef else "the sum of kernels"
    r = overhead_scale(base if base.coef else plain_sum(), agg, y)[0]
    return scaled_overhead(base, agg, y), f"overhead: {whose} scaled by {r:.3f} ({len(y)} networks timed)"


def plain_sum() -> Overhead:
    """The overhead that adds nothing: latency = the sum of the kernels."""
    return Overhead(["sum_ms"], [1.0])


def adapt_to_build(source: KernelLatencyPredictor, table: pd.DataFrame, device: str, runtime: str, rules,
                   cache=None, nets: pd.DataFrame | None = None,
                   net_kernels: pd.DataFrame | None = None) -> KernelLatencyPredictor:
    """``source``'s regressors adapted to the single-kernel ``table`` a transfer build measured on ``device`` and
    blended with the device's own (:class:`~leti.predict.kernels.blend.BlendedKernels`), with the build's fusion
    ``rules`` and cache profile, and the overhead of :func:`networks_overhead` on the networks it timed
    (``overhead_note`` says which)."""
    from leti.predict.kernels.blend import BlendedKernels

    reg = BlendedKernels(source.regressors, source.device).fit(table)
    pred = KernelLatencyPredictor(reg, source.overhead, device, runtime, source.precision, rules, cache)
    if reg.checked_types():  # types of few kernels: their weights checked on the networks (blend's docstring)
        cv = dict(reg.weight_)
        spread = {}
        for factor in SHRINK:  # the kernels' verdict checked on the networks: the one measure of whole models
            reg.weight_ = cv
            reg.shrink(factor)
            spread[factor] = network_spread(pred, source.overhead, nets, net_kernels)
        best = min(SHRINK, key=lambda f: (round(spread[f], 4), f))  # ties: the adapted source
        reg.weight_ = cv
        reg.shrink(best if np.isfinite(spread[best]) else 1.0)
    pred.overhead, pred.overhead_note = networks_overhead(pred, source.overhead, nets, net_kernels)
    return pred


#: the factors of the cross-validated weights tried on the timed networks (:func:`adapt_to_build`; only the
#: weights of types measured fewer than :data:`~leti.predict.kernels.blend.NETWORK_CHECK_ROWS` times)
SHRINK = (0.0, 0.5, 1.0)
#: the fewest timed networks that can overrule the kernels' cross-validation
MIN_GATE_NETWORKS = 3


def network_spread(predictor: KernelLatencyPredictor, base: Overhead, nets: pd.DataFrame | None,
                   net_kernels: pd.DataFrame | None) -> float:
    """The spread of the log ratios of the timed networks' latency to ``predictor``'s sum of kernels under the better
    of ``base`` and the plain sum, each scaled to them (inf with fewer than :data:`MIN_GATE_NETWORKS` networks)."""
    got = _network_rows(predictor, nets, net_kernels)
    if got is None or len(got[1]) < MIN_GATE_NETWORKS:
        return float("inf")
    agg, y = got
    spreads = [overhead_scale(plain_sum(), agg, y)[1]] + ([overhead_scale(base, agg, y)[1]] if base.coef else [])
    return min(spreads)


def _network_rows(predictor: KernelLatencyPredictor, nets: pd.DataFrame | None, net_kernels: pd.DataFrame | None):
    """(the model aggregates of ``predictor`` on the timed networks of at most
    :data:`~leti.predict.kernels.build_fit.MAX_NETWORK_WEIGHTS_MB` of weights, their latencies), None without any."""
    from leti.predict.kernels.build_fit import MAX_NETWORK_WEIGHTS_MB

    if nets is None or nets.empty or net_kernels is None or net_kernels.empty:
        return None
    weights = net_kernels.groupby("model").bytes_weights.sum() / 1e6
    kept = nets[nets.model.map(weights).fillna(0.0).to_numpy() <= MAX_NETWORK_WEIGHTS_MB]
    if kept.empty:
        return None
    rows = predictor.in_model(predictor.predict_kernels(net_kernels[net_kernels.model.isin(kept.model)],
                                                        allow_unknown=True, where="calibration networks"))
    # at the cache size the source's overhead ramps its eviction term at too (a store refitted with --cache-mb)
    agg = model_aggregates(rows, rows["predicted_ms"].to_numpy(), predictor.overhead.cache_sizes())
    agg = agg[[c for c in agg.columns if not c.startswith("n:")]]
    return agg, kept.set_index("model").latency_ms.loc[agg.index].to_numpy(np.float64)
