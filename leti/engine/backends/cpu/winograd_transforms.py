"""Winograd input and output transforms of the CPU backend (numba; the α² products between them run on
LETI's GEMM or a BLAS, :mod:`.conv`).

Each transformed element is one written-out sum of 4 or 6 products, stored once: Bᵀ and Aᵀ are zero-padded
to 4 (α ≤ 4) or 6 columns (α = 5, 6) by :func:`winograd_transforms`, so the zero terms cost FMAs but no
loads and stores of a partial sum. Accumulating a row one nonzero coefficient at a time (the kernels these
replace) read and wrote the buffer once per term: the input transform of a 56×56×64 F(4×4) convolution took
0.54 ms against 0.26 now, the output transform 0.46 against 0.29 (one thread; ``docs/engine.md``). α > 6
(tiles forced past F(4×4)) keeps generic loops.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from leti.engine.backends.cpu.kernels import _act


@njit(inline="always")
def _rows6(f, src, dst, j, c):
    """``dst[j, :] = Σ_i f[i] · src[i, j, :]`` over six rows (rows past α are zeros): one store per element,
    the sum in registers (accumulating row by row into ``dst`` read and wrote it α times)."""
    f0, f1, f2, f3, f4, f5 = f[0], f[1], f[2], f[3], f[4], f[5]
    for ci in range(c):
        dst[j, ci] = (f0 * src[0, j, ci] + f1 * src[1, j, ci] + f2 * src[2, j, ci] + f3 * src[3, j, ci]
                      + f4 * src[4, j, ci] + f5 * src[5, j, ci])


@njit(inline="always")
def _rows4(f, src, dst, j, c):
    f0, f1, f2, f3 = f[0], f[1], f[2], f[3]
    for ci in range(c):
        dst[j, ci] = f0 * src[0, j, ci] + f1 * src[1, j, ci] + f2 * src[2, j, ci] + f3 * src[3, j, ci]


@njit(inline="always")
def _cols6(f, src, out, c):
    """``out[:] = Σ_j f[j] · src[j, :]`` over six columns."""
    f0, f1, f2, f3, f4, f5 = f[0], f[1], f[2], f[3], f[4], f[5]
    for ci in range(c):
        out[ci] = (f0 * src[0, ci] + f1 * src[1, ci] + f2 * src[2, ci] + f3 * src[3, ci] + f4 * src[4, ci]
                   + f5 * src[5, ci])


@njit(inline="always")
def _cols4(f, src, out, c):
    f0, f1, f2, f3 = f[0], f[1], f[2], f[3]
    for ci in range(c):
        out[ci] = f0 * src[0, ci] + f1 * src[1, ci] + f2 * src[2, ci] + f3 * src[3, ci]


@njit(inline="always")
def _sum6(f, s0, s1, s2, s3, s4, s5, out, c):
    f0, f1, f2, f3, f4, f5 = f[0], f[1], f[2], f[3], f[4], f[5]
    for ci in range(c):
        out[ci] = f0 * s0[ci] + f1 * s1[ci] + f2 * s2[ci] + f3 * s3[ci] + f4 * s4[ci] + f5 * s5[ci]


@njit(inline="always")
def _sum4(f, s0, s1, s2, s3, out, c):
    f0, f1, f2, f3 = f[0], f[1], f[2], f[3]
    for ci in range(c):
        out[ci] = f0 * s0[ci] + f1 * s1[ci] + f2 * s2[ci] + f3 * s3[ci]


def _padded(mat: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``mat`` zero-padded to ``rows × cols`` (float32): the transforms' sums then run over 4 or 6 terms."""
    out = np.zeros((max(rows, mat.shape[0]), max(cols, mat.shape[1])), np.float32)
    out[:mat.shape[0], :mat.shape[1]] = mat
    return out


def winograd_transforms(at: np.ndarray, bt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(Aᵀ, Bᵀ)`` as :func:`winograd_input` / :func:`winograd_output` take them: with α ≤ 6, the columns
    zero-padded to 4 (α ≤ 4) or 6 terms, so that every sum is written out in full."""
    alpha = bt.shape[0]
    w = 4 if alpha <= 4 else 6 if alpha <= 6 else alpha
    return _padded(at, at.shape[0], w), _padded(bt, alpha, w)


@njit(parallel=True, cache=True, fastmath=True)
def winograd_input(x, bt, v, n_out, pt, pl, th, tw, threads, r0=0):
    """Tiles of ``x[b]`` (α×α, stride n_out, zero padded) transformed to ``v[a·α + b, t, c] = (Bᵀ X B)[a, b]``,
    ``bt`` = Bᵀ from :func:`winograd_transforms` (α rows; 4 or 6 columns, zero-padded, for α ≤ 6).

    Tiles are split into a few chunks per thread (``threads``: numba's current count); each chunk reuses two
    buffers of w×w×C (w = 4 or 6, the rows and columns past α zero) and every inner loop runs over contiguous
    channels (vectorised), each output element a sum of w products written once. Larger α (forced tiles past
    F(4×4)) take a generic loop. ``v`` holds a block of tiles: its row ``r`` is tile ``r0 + r`` of the batch."""
    nb, h, w, c = x.shape
    alpha = bt.shape[0]
    wdt = bt.shape[1]
    tiles = th * tw
    total = min(v.shape[1], nb * tiles - r0)
    nchunks = max(1, min(total, 4 * threads))
    for ch in prange(nchunks):
        d = np.zeros((wdt, wdt, c), dtype=np.float32)
        tmp = np.zeros((wdt, wdt, c), dtype=np.float32)
        for row in range(ch * total // nchunks, (ch + 1) * total // nchunks):
            b = (r0 + row) // tiles
            t = (r0 + row) % tiles
            y0 = (t // tw) * n_out - pt
            x0 = (t % tw) * n_out - pl
            for i in range(alpha):
                yy = y0 + i
                for j in range(alpha):
                    xx = x0 + j
                    if 0 <= yy < h and 0 <= xx < w:
                        for ci in range(c):
                            d[i, j, ci] = x[b, yy, xx, ci]
                    else:
                        for ci in range(c):
                            d[i, j, ci] = 0.0
            if wdt == 6:
                for a in range(alpha):  # tmp = Bᵀ d (rows)
                    for j in range(alpha):
                        _rows6(bt[a], d, tmp[a], j, c)
                for a in range(alpha):  # v = tmp B (columns)
                    for bb in range(alpha):
                        _cols6(bt[bb], tmp[a], v[a * alpha + bb, row], c)
            elif wdt == 4:
                for a in range(alpha):
                    for j in range(alpha):
                        _rows4(bt[a], d, tmp[a], j, c)
                for a in range(alpha):
                    for bb in range(alpha):
                        _cols4(bt[bb], tmp[a], v[a * alpha + bb, row], c)
            else:
                for a in range(alpha):
                    for j in range(alpha):
                        for ci in range(c):
                            tmp[a, j, ci] = 0.0
                        for i in range(alpha):
                            f = bt[a, i]
                            if f != 0.0:
                                for ci in range(c):
                                    tmp[a, j, ci] += f * d[i, j, ci]
                for a in range(alpha):
                    for bb in range(alpha):
                        out = v[a * alpha + bb, row]
                        for ci in range(c):
                            out[ci] = 0.0
                        for j in range(alpha):
                            f = bt[bb, j]
                            if f != 0.0:
                                for ci in range(c):
                                    out[ci] += f * tmp[a, j, ci]


@njit(parallel=True, cache=True, fastmath=True)
def winograd_output(m, at, y, bias, has_bias, act, th, tw, threads, r0=0):
    """``y[b, ty·n + i, tx·n + j, :] = act((Aᵀ M A)[i, j] + bias)``, cropped to y's size; ``at`` = Aᵀ from
    :func:`winograd_transforms` (n rows; 4 or 6 columns, zero-padded, for α ≤ 6). ``m`` holds a block of tiles: its row
    ``r`` is tile ``r0 + r`` of the batch."""
    nb, oh, ow, oc = y.shape
    n_out, wdt = at.shape
    alpha = int(np.sqrt(m.shape[0]) + 0.5)
    tiles = th * tw
    total = min(m.shape[1], nb * tiles - r0)
    nchunks = max(1, min(total, 4 * threads))
    for ch in prange(nchunks):
        zero = np.zeros(oc, dtype=np.float32)  # M's row past α (F(3×3): α = 5 of 6 terms)
        bvec = bias[:oc] if has_bias else zero
        tmp = np.zeros((n_out, wdt, oc), dtype=np.float32)
        acc = np.empty(oc, dtype=np.float32)
        for row in range(ch * total // nchunks, (ch + 1) * total // nchunks):
            b = (r0 + row) // tiles
            t = (r0 + row) % tiles
            y0 = (t // tw) * n_out
            x0 = (t % tw) * n_out
            if wdt == 6:
                for i in range(n_out):  # tmp = Aᵀ M (rows), straight from M's α² planes
                    for bb in range(alpha):
                        _sum6(at[i], m[bb, row], m[alpha + bb, row], m[2 * alpha + bb, row], m[3 * alpha + bb, row],
                              m[4 * alpha + bb, row], m[5 * alpha + bb, row] if alpha == 6 else zero, tmp[i, bb], oc)
            elif wdt == 4:
                for i in range(n_out):
                    for bb in range(alpha):
                        _sum4(at[i], m[bb, row], m[alpha + bb, row], m[2 * alpha + bb, row], m[3 * alpha + bb, row],
                              tmp[i, bb], oc)
            else:
                for i in range(n_out):
                    for bb in range(alpha):
                        for o in range(oc):
                            tmp[i, bb, o] = 0.0
                        for a in range(alpha):
                            f = at[i, a]
                            if f != 0.0:
                                s = m[a * alpha + bb, row]
                                for o in range(oc):
                                    tmp[i, bb, o] += f * s[o]
            for i in range(n_out):
                yy = y0 + i
                if yy >= oh:
                    continue
                for j in range(n_out):
                    xx = x0 + j
                    if xx >= ow:
                        continue
                    dst = y[b, yy, xx]
                    if wdt == 6:  # one pass: the sum, the bias and the activation straight into y
                        f0, f1, f2, f3, f4, f5 = at[j, 0], at[j, 1], at[j, 2], at[j, 3], at[j, 4], at[j, 5]
                        ti = tmp[i]
                        for o in range(oc):
                            dst[o] = _act(f0 * ti[0, o] + f1 * ti[1, o] + f2 * ti[2, o] + f3 * ti[3, o]
                                          + f4 * ti[4, o] + f5 * ti[5, o] + bvec[o], act)
                        continue
                    if wdt == 4:
                        f0, f1, f2, f3 = at[j, 0], at[j, 1], at[j, 2], at[j, 3]
                        ti = tmp[i]
                        for o in range(oc):
                            dst[o] = _act(f0 * ti[0, o] + f1 * ti[1, o] + f2 * ti[2, o] + f3 * ti[3, o] + bvec[o], act)
                        continue
                    else:
                        for o in range(oc):
                            acc[o] = 0.0
                        for bb in range(alpha):
                            f = at[j, bb]
                            if f != 0.0:
                                for o in range(oc):
                                    acc[o] += f * tmp[i, bb, o]
                    for o in range(oc):
                        dst[o] = _act(acc[o] + bvec[o], act)
