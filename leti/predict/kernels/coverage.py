"""How much each measured kernel should weigh in its type's fit: its closeness to the kernels of real networks.

Why: the build spends most of its budget on adaptive rounds that measure the candidates the regressors are least
sure of (:mod:`.build`), and the least sure are the corners: a 3×3 convolution of 913 channels on one pixel, a
5×5 one from 1 to 16 channels. In session 30's engine build 3,891 of 4,658 measured kernels came from those
rounds, and only 13 plain 3×3/5×5 stride-1 convolutions had 48-160 channels on 4-24 pixels, where ResNets and
NB101 networks put theirs; the conv2d regressor, fitted for the same error everywhere, read such kernels of
real models 1.2-1.5× their time alone. The corners are worth measuring (they keep a regressor sane off the
real distribution), but a fit should answer best where models are.

:func:`coverage_weights` is importance weighting for that shift: per kernel type, a classifier tells the
measured kernels from draws of the real distribution (:meth:`~.sampler.KernelSampler.draw` with no uniform
share: real kernels of ``keras.applications``, jittered), and each measured kernel weighs ``(p / (1 − p))^POWER``,
its odds of being a real draw tempered, clipped to ``[1/CLIP, CLIP]`` times the type's median and scaled to mean 1.
The weights enter the type's base (a weighted ridge) and its boosted members (a weighted bootstrap). The
classifier sees the shape only (output pixels, channels in and out, per group, window, stride): what the sampler
jitters. The kernel build (``leti kernels build``) fits with them; ``leti fit --kernels`` on a per-op table of
real models does not (its rows are the real distribution already).

Chosen on the dev split of the engine's zoo, refitting session 30's tables (power 0.3 / 0.5 / 0.75 / 1 with clip
3 / 3 / 5 / 10: dev Acc@10 85.3 / 86.7 / 85.3 / 80.0 %, 85.3 % before), and checked on every kernel of the 75 dev models
timed alone (``benchmarks/bench_kernels_alone.py``): the models' kernel sums 4.9 → 4.5 % from their sums alone,
conv2d's latency-weighted |log error| 0.121 → 0.109. Plain odds starved the corners (the build's cross-validated
conv2d wMAPE 12 → 24 %). Measuring more of the real distribution instead did not help the models; the sweep and
that try: ``benchmarks/results/zoo_kernels_local_cpu.md``, session 31.

The same odds (:class:`RealOdds`) steer the build's adaptive rounds since session 51
(:func:`~.build_fit.cv_by_type`, :func:`~.build_fit.candidate_scores`): weighing the fit alone left the rounds drawing
around the corners they could not predict (noisy 1-2 channel convolutions: 1,653 of session 50's 2,713 conv2d kernels).
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

#: draws of the real distribution per kernel type the classifier compares the measured kernels with
DRAWS = 2000
#: the odds' power (1: plain importance weights) and the clip of the weights, [median / CLIP, median · CLIP] of
#: their type; see the module docstring for how they were chosen
POWER, CLIP = 0.5, 3.0
#: fewest measured kernels of a type to weigh (fewer: every kernel weighs 1)
MIN_ROWS = 40


def shape_features(rows: pd.DataFrame) -> np.ndarray:
    """The shape of each kernel row: log output pixels, log channels in and out, log channels per group,
    window and stride."""
    f = lambda c: rows[c].to_numpy(np.float64)  # noqa: E731
    groups = np.maximum(f("groups"), 1.0)
    return np.column_stack([np.log1p(f("output_h") * f("output_w")), np.log1p(f("input_c")), np.log1p(f("output_c")),
                            np.log1p(f("input_c") / groups), f("kernel_h"), f("stride")])


@functools.lru_cache(maxsize=64)
def real_shapes(kernel_type: str, n: int = DRAWS, seed: int = 0) -> np.ndarray | None:
    """:func:`shape_features` of ``n`` kernels drawn from the real distribution of ``kernel_type`` (None for a type
    with no real kernels). Cached: a build fits its regressors several times a round on the same draws."""
    from leti.models.kernel_models import expected_row
    from leti.predict.kernels.sampler import default_sampler

    sampler = default_sampler()
    if kernel_type not in sampler.pool or kernel_type in sampler.synthetic:
        return None
    configs = sampler.draw(kernel_type, n, np.random.default_rng(seed), uniform_share=0.0)
    return shape_features(pd.DataFrame([expected_row(c) for c in configs])) if configs else None


class RealOdds:
    """Per kernel type, a classifier's odds that a kernel shape is a draw of the real distribution rather than one of
    ``table``'s measured kernels (:func:`shape_features`; types with fewer than :data:`MIN_ROWS` rows or no real draws
    have none: odds 1). :meth:`odds` answers for any rows, measured or not (a build's candidates);
    :meth:`relative` divides by the type's median odds over ``table``, so 1 is a typical measured kernel;
    :attr:`table_odds` holds ``table``'s own odds, computed once, which :meth:`table_relative` and :meth:`weights`
    read."""

    def __init__(self, table: pd.DataFrame, seed: int = 0) -> None:
        from sklearn.ensemble import HistGradientBoostingClassifier

        self.classifiers: dict = {}
        self.median: dict[str, float] = {}
        self.table_odds = np.ones(len(table))
        types = self._types = table["kernel_type"].astype(str).to_numpy()
        for t in sorted(set(types)):
            m = types == t
            if m.sum() < MIN_ROWS:
                continue
            x_real = real_shapes(t, seed=seed)
            if x_real is None or len(x_real) < MIN_ROWS:
                continue
            x_meas = shape_features(table[m])
            x = np.vstack([x_meas, x_real])
            y = np.r_[np.zeros(len(x_meas)), np.ones(len(x_real))]
            self.classifiers[t] = HistGradientBoostingClassifier(
                max_depth=3, max_iter=100, learning_rate=0.1, class_weight="balanced", random_state=seed).fit(x, y)
            self.table_odds[m] = self.odds(table[m])
            self.median[t] = float(np.median(self.table_odds[m]))

    def odds(self, rows: pd.DataFrame) -> np.ndarray:
        types = rows["kernel_type"].astype(str).to_numpy()
        out = np.ones(len(rows))
        for t, clf in self.classifiers.items():
            m = types == t
            if m.any():
                p = np.clip(clf.predict_proba(shape_features(rows[m]))[:, 1], 1e-6, 1 - 1e-6)
                out[m] = p / (1 - p)
        return out

    def _over_median(self, types: np.ndarray, odds: np.ndarray) -> np.ndarray:
        med = np.array([self.median.get(t, 1.0) for t in types]) if len(types) else np.ones(0)
        return odds / np.maximum(med, 1e-12)

    def relative(self, rows: pd.DataFrame) -> np.ndarray:
        return self._over_median(rows["kernel_type"].astype(str).to_numpy(), self.odds(rows))

    def table_relative(self) -> np.ndarray:
        """:meth:`relative` of the fitted table's own rows, from their odds computed once."""
        return self._over_median(self._types, self.table_odds)

    def weights(self) -> np.ndarray:
        """Per row of the fitted table: its weight in its type's fit (mean 1 per type; 1 for types without real
        draws or with fewer than :data:`MIN_ROWS` rows)."""
        out = np.ones(len(self._types))
        for t in self.classifiers:
            m = self._types == t
            w = self.table_odds[m] ** POWER
            med = np.median(w)
            w = np.clip(w, med / CLIP, med * CLIP)
            out[m] = w / w.mean()
        return out


def coverage_weights(table: pd.DataFrame, seed: int = 0) -> np.ndarray:
    """Per row of a measured kernel table: its weight in its type's fit (:meth:`RealOdds.weights`)."""
    return RealOdds(table, seed).weights()
