"""Winograd minimal filtering: a generator of A, B, G for any F(n, k), and MNN's tile-size choice.

**Generator.** For ``F(n, k)`` (``n`` outputs of a ``k``-tap filter from ``α = n + k − 1`` inputs)
pick α − 1 finite interpolation points ``0, ±f, ±2f, …`` with ``f = 0.5`` (MNN's choice, the roots of
its polynomial ``x·(x−f)(x+f)·(x−2f)(x+2f)⋯``) plus the point at infinity. With the Vandermonde
matrices

* ``V``  (α × α): row ``[1, a, a², …, a^(α−1)]`` per finite point, ``[0, …, 0, 1]`` for infinity,
* ``Vg`` (α × k) and ``Vd`` (α × n): the same rows truncated to ``k`` and ``n`` columns,

Toom-Cook computes the linear convolution ``s = g * d`` as ``V⁻¹ [(Vg g) ⊙ (Vd d)]``. Correlation
(what a CNN "convolution" is) is the transpose of that bilinear map in ``d``, which gives

    y = Aᵀ [(G g) ⊙ (Bᵀ x)],   A = Vd,  G = Vg,  Bᵀ = V⁻ᵀ,

and in 2-D ``Y = Aᵀ [(G W Gᵀ) ⊙ (Bᵀ X B)] A`` (MNN's Eq. 6). The matrices are computed exactly with
fractions and then rounded to float.

**Tile size.** MNN's Eq. 2, ``C(n) = 2·ic·(n+k−1)³ + ic·oc·(n+k−1)² + n·(n+k−1)·(2n+k−1)``, is the
arithmetic cost of one n×n output tile (input transform, channel products, output transform). We
minimise the cost of the whole output, ``C(n)·⌈oh/n⌉·⌈ow/n⌉`` (which also charges the waste of
partial tiles), over ``1 ≤ n ≤ max_n``; ``n̂ = 1`` means the sliding window (im2col) scheme.
``max_n`` bounds α because the points spread and float32 error grows with it.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

import numpy as np

F_SCALE = Fraction(1, 2)


def points(count: int, f: Fraction = F_SCALE) -> list[Fraction]:
    """The first ``count`` finite interpolation points: 0, f, −f, 2f, −2f, …"""
    pts = [Fraction(0)]
    i = 1
    while len(pts) < count:
        pts += [i * f, -i * f]
        i += 1
    return pts[:count]


def _vandermonde(pts: list[Fraction], cols: int) -> list[list[Fraction]]:
    rows = [[p ** j for j in range(cols)] for p in pts]
    rows.append([Fraction(0)] * (cols - 1) + [Fraction(1)])  # the point at infinity
    return rows


def _inverse(m: list[list[Fraction]]) -> list[list[Fraction]]:
    n = len(m)
    a = [row[:] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(m)]
    for col in range(n):
        piv = next(r for r in range(col, n) if a[r][col] != 0)
        a[col], a[piv] = a[piv], a[col]
        p = a[col][col]
        a[col] = [v / p for v in a[col]]
        for r in range(n):
            if r != col and a[r][col] != 0:
                fac = a[r][col]
                a[r] = [v - fac * w for v, w in zip(a[r], a[col])]
    return [row[n:] for row in a]


@lru_cache(maxsize=None)
def winograd_matrices(n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(AT, BT, G)`` for F(n, k): shapes (n, α), (α, α), (α, k), float64."""
    if n < 1 or k < 1:
        raise ValueError(f"F({n}, {k}) needs n, k >= 1")
    alpha = n + k - 1
    pts = points(alpha - 1)
    v = _vandermonde(pts, alpha)
    binv = _inverse(v)  # B = V^-1, so B^T = V^-T
    a = _vandermonde(pts, n)
    g = _vandermonde(pts, k)
    at = np.array([[float(a[r][c]) for r in range(alpha)] for c in range(n)])
    bt = np.array([[float(binv[r][c]) for r in range(alpha)] for c in range(alpha)])
    return at, bt, np.array([[float(x) for x in row] for row in g])


def winograd_1d(d: np.ndarray, g: np.ndarray, n: int) -> np.ndarray:
    """1-D correlation of ``α`` inputs with ``k`` taps via F(n, k) — the numerical self-check."""
    at, bt, gm = winograd_matrices(n, len(g))
    return at @ ((gm @ g) * (bt @ d))


def tile_cost(n: int, k: int, ic: int, oc: int) -> int:
    """MNN's Eq. 2: arithmetic cost of one n×n output tile of F(n×n, k×k)."""
    a = n + k - 1
    return 2 * ic * a ** 3 + ic * oc * a ** 2 + n * a * (2 * n + k - 1)


def choose_tile(k: int, ic: int, oc: int, oh: int, ow: int, max_n: int = 6, min_tiles: int = 0) -> int:
    """n̂ minimising ``tile_cost(n)·⌈oh/n⌉·⌈ow/n⌉`` over ``1..max_n`` (ties: the smaller n).

    ``min_tiles`` (per image) drops tile sizes that leave fewer tiles than that: the α² channel
    products then have so few rows that BLAS runs far below peak while streaming α²/k² times the
    filter's bytes, which Eq. 2 does not count (on a small map im2col's one tall product wins)."""
    costs = {n: tile_cost(n, k, ic, oc) * (-(-oh // n)) * (-(-ow // n)) for n in range(1, max_n + 1)
             if n == 1 or (-(-oh // n)) * (-(-ow // n)) >= min_tiles}
    return min(costs, key=lambda n: (costs[n], n))
