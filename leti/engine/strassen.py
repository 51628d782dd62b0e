"""Strassen matrix multiplication with MNN's stopping rule.

For ``[m, k] × [k, n]`` the direct product needs ``m·n·k`` multiplications; one Strassen level needs
``7·(m/2)(n/2)(k/2)`` plus 4 additions of ``[m/2, k/2]``, 4 of ``[k/2, n/2]`` and 7 of
``[m/2, n/2]`` (MNN Eq. 9). Recursion continues while

    m·n·k − 7·(m/2)(n/2)(k/2)  >  4·(m/2)(k/2) + 4·(n/2)(k/2) + 7·(m/2)(n/2)

and all three dimensions are even (odd ones stop the recursion rather than pad). ``min_dim``
adds a floor on the half-sizes: the inequality counts scalar operations only, while each leaf
here is a BLAS call with fixed overhead and a blocked kernel that is inefficient on small blocks,
so leaves below ``min_dim`` cost more than they save (``min_dim=0`` gives the pure inequality).
"""

from __future__ import annotations

import numpy as np


def strassen_pays(m: int, n: int, k: int) -> bool:
    """MNN's inequality (Eq. 9) for one more level on ``[m, k] × [k, n]``."""
    saved = m * n * k - 7 * (m / 2) * (n / 2) * (k / 2)
    extra = 4 * (m / 2) * (k / 2) + 4 * (n / 2) * (k / 2) + 7 * (m / 2) * (n / 2)
    return saved > extra


def strassen_depth(m: int, n: int, k: int, min_dim: int = 0, max_depth: int = 8) -> int:
    """Number of Strassen levels the rule allows for ``[m, k] × [k, n]``."""
    depth = 0
    while (depth < max_depth and m % 2 == 0 and n % 2 == 0 and k % 2 == 0
           and min(m, n, k) // 2 >= max(min_dim, 1) and strassen_pays(m, n, k)):
        m, n, k = m // 2, n // 2, k // 2
        depth += 1
    return depth


def strassen_matmul(a: np.ndarray, b: np.ndarray, depth: int, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` with ``depth`` Strassen levels (2-D operands; dims divisible by 2**depth)."""
    if depth <= 0:
        return np.matmul(a, b, out=out)
    m, k = a.shape
    n = b.shape[1]
    h, kh, nh = m // 2, k // 2, n // 2
    a11, a12, a21, a22 = a[:h, :kh], a[:h, kh:], a[h:, :kh], a[h:, kh:]
    b11, b12, b21, b22 = b[:kh, :nh], b[:kh, nh:], b[kh:, :nh], b[kh:, nh:]
    d = depth - 1
    m1 = strassen_matmul(a11 + a22, b11 + b22, d)
    m2 = strassen_matmul(a21 + a22, b11, d)
    m3 = strassen_matmul(a11, b12 - b22, d)
    m4 = strassen_matmul(a22, b21 - b11, d)
    m5 = strassen_matmul(a11 + a12, b22, d)
    m6 = strassen_matmul(a21 - a11, b11 + b12, d)
    m7 = strassen_matmul(a12 - a22, b21 + b22, d)
    if out is None:
        out = np.empty((m, n), dtype=np.result_type(a, b))
    c11, c12, c21, c22 = out[:h, :nh], out[:h, nh:], out[h:, :nh], out[h:, nh:]
    np.add(m1, m4, out=c11)
    c11 -= m5
    c11 += m7
    np.add(m3, m5, out=c12)
    np.add(m2, m4, out=c21)
    np.subtract(m1, m2, out=c22)
    c22 += m3
    c22 += m6
    return out
