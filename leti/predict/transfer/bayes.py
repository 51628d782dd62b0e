"""Bayesian linear regression with grouped prior variances, fitted by marginal likelihood.

Every model of ``transfer-ridge`` is one of these: y = x·w + ε, w ~ N(0, diag(prior)), ε ~ N(0, σ²),
where the first ``broad`` columns of x have a fixed broad prior and every following block of columns
shares one prior variance. With ten samples there is no room for cross-validation; the block variances
and σ² maximise the evidence p(y | x) instead (L-BFGS over their logs, a few starts), which is also what
lets the variants be weighed against each other.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize

BROAD = 100.0  # prior variance of the broad columns (intercept, mean-profile slope)
INIT_GROUP, INIT_NOISE = (-2.0, 0.0, -4.0, -2.0), (-6.0, -4.0, -8.0, -3.0)
BOUNDS = (-12.0, 4.0)  # of the log prior variances and log noise


def prior_var(h: np.ndarray, sizes: list[int], broad: int) -> np.ndarray:
    return np.concatenate([np.full(broad, BROAD), *[np.full(s, h[i]) for i, s in enumerate(sizes)]])


def _kernels(x: np.ndarray, sizes: list[int], broad: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed part of the sample covariance (broad columns) and one ``x_g x_gᵀ`` per group."""
    fixed = BROAD * x[:, :broad] @ x[:, :broad].T
    edges = np.cumsum([broad, *sizes])
    return fixed, np.stack([x[:, a:b] @ x[:, a:b].T for a, b in zip(edges[:-1], edges[1:])])


def neg_evidence(logh: np.ndarray, fixed: np.ndarray, groups: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """−log p(y | prior variances exp(logh[:-1]), noise exp(logh[-1])) and its gradient in logh."""
    h = np.exp(logh)
    k = fixed + np.tensordot(h[:-1], groups, 1) + h[-1] * np.eye(len(y))
    try:
        chol = np.linalg.cholesky(k)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros_like(logh)
    a = np.linalg.solve(chol, y)
    nll = float(0.5 * a @ a + np.log(np.diag(chol)).sum() + 0.5 * len(y) * np.log(2 * np.pi))
    kinv = np.linalg.inv(k)
    alpha = kinv @ y
    d = kinv - np.outer(alpha, alpha)  # d nll / d K = d / 2
    grad = 0.5 * h * np.append((groups * d).sum((1, 2)), np.trace(d))
    return nll, grad


def fit_evidence(x: np.ndarray, y: np.ndarray, sizes: list[int], broad: int,
                 bounds: tuple[float, float] = BOUNDS) -> dict:
    """Posterior of w at the evidence-maximising hyperparameters: ``{coef, cov, noise, hyper, nll}``."""
    fixed, groups = _kernels(x, sizes, broad)
    inits = [np.array([g] * len(sizes) + [n]) for g, n in zip(INIT_GROUP, INIT_NOISE)]
    best = min((minimize(neg_evidence, i, args=(fixed, groups, y), jac=True, method="L-BFGS-B",
                         bounds=[bounds] * len(i)) for i in inits), key=lambda r: r.fun)
    h = np.exp(best.x)
    prec = x.T @ x / h[-1] + np.diag(1.0 / prior_var(h, sizes, broad))
    cov = np.linalg.inv(prec)
    return {"coef": cov @ x.T @ y / h[-1], "cov": cov, "noise": float(h[-1]), "hyper": h, "nll": float(best.fun)}


def predictive(x: np.ndarray, m: dict) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance (noise included) of y at the rows of ``x``."""
    return x @ m["coef"], ((x @ m["cov"]) * x).sum(1) + m["noise"]


def _primal_nll(logh: np.ndarray, xtx: np.ndarray, xty: np.ndarray, yty: float, n: int, sizes: list[int],
                broad: int) -> tuple[float, np.ndarray]:
    """:func:`neg_evidence` in weight space (p × p instead of n × n), with its gradient: with A = XᵀX/σ² + Λ⁻¹,
    Σ = A⁻¹, m = Σ Xᵀy/σ², −log p(y) = ½ (yᵀy/σ² − mᵀAm + log|A| + log|Λ| + n log σ² + n log 2π);
    d/d log λ_j = ½ (1 − (Σ_jj + m_j²)/λ_j), d/d log σ² = ½ (n − γ − |y − Xm|²/σ²), γ = p − Σ_j Σ_jj/λ_j."""
    h = np.exp(logh)
    lam, s2 = prior_var(h, sizes, broad), h[-1]
    a = xtx / s2 + np.diag(1.0 / lam)
    try:
        chol = np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        return 1e10, np.zeros_like(logh)
    cov = np.linalg.inv(a)
    m = cov @ xty / s2
    resid2 = max(yty - 2 * m @ xty + m @ xtx @ m, 0.0)
    nll = 0.5 * (yty / s2 - m @ a @ m + 2 * np.log(np.diag(chol)).sum() + np.log(lam).sum() + n * np.log(s2)
                 + n * np.log(2 * np.pi))
    per = 0.5 * (1.0 - (np.diag(cov) + m ** 2) / lam)
    edges = np.cumsum([broad, *sizes])
    gamma = len(lam) - float(np.sum(np.diag(cov) / lam))
    grad = [per[a_:b_].sum() for a_, b_ in zip(edges[:-1], edges[1:])] + [0.5 * (n - gamma - resid2 / s2)]
    return float(nll), np.array(grad)


def fit_evidence_primal(x: np.ndarray, y: np.ndarray, sizes: list[int], broad: int,
                        bounds: tuple[float, float] = BOUNDS) -> dict:
    """:func:`fit_evidence` computed in weight space: the same posterior, at a cost that grows with the columns
    (p³) and not the rows (n³). Why: kernel-level transfer (:mod:`leti.predict.kernels.adapt`) fits a few
    thousand kernels on ~140 columns, where the n × n form took two minutes and this takes a second."""
    xtx, xty, yty = x.T @ x, x.T @ y, float(y @ y)
    inits = [np.array([g] * len(sizes) + [n]) for g, n in zip(INIT_GROUP, INIT_NOISE)]
    best = min((minimize(_primal_nll, i, args=(xtx, xty, yty, len(y), sizes, broad), jac=True, method="L-BFGS-B",
                         bounds=[bounds] * len(i)) for i in inits), key=lambda r: r.fun)
    h = np.exp(best.x)
    cov = np.linalg.inv(xtx / h[-1] + np.diag(1.0 / prior_var(h, sizes, broad)))
    return {"coef": cov @ xty / h[-1], "cov": cov, "noise": float(h[-1]), "hyper": h, "nll": float(best.fun)}
