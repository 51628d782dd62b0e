"""3×3 depthwise convolutions (multiplier 1): LETI's C kernel where it builds (:func:`depthwise3x3_leti`,
``csrc/dwconv.c``: the taps held in registers along a row; MobileNet v2's depthwise layers 1.5× faster
than the numba kernels below), else in numba: stride 1 over whole rows (:func:`depthwise3x3_rows`),
any stride per output pixel with the nine taps fused (:func:`depthwise3x3`).

The generic kernel (:func:`.kernels.depthwise`) accumulates tap by tap into a channel vector,
checking the window's bounds per tap: each tap loads and stores the accumulator again. Here a pixel
whose window lies inside the input (all but the border) takes one loop over its channels that
reads the nine input rows' values and weights and writes the output once; border pixels keep the
accumulating path. MobileNet v2's stride-2 depthwise layers are the users (the stride-1 ones run
:func:`depthwise3x3_rows`, which fuses whole rows).

Offsets are unsigned, as in the other row kernels: a signed computed index makes numba's
negative-index wraparound turn each load into a gather.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from leti.engine.backends.cpu import ckernels
from leti.engine.backends.cpu.ckernels import dwconv3x3
from leti.engine.backends.cpu.kernels import _act

ckernels.library()  # loaded before numba links depthwise3x3_leti (see gemm.py)


@njit(parallel=True, cache=True)
def depthwise3x3_leti(x, w9, bias, has_bias, y, sh, sw, dh, dw, pt, pl, act, threads):
    """``x`` (N, H, W, C), ``w9`` the taps as :func:`ckernels.dw3x3_weights` lays them out, ``y`` (N, OH, OW, C):
    the C kernel over contiguous blocks of output rows, one per thread."""
    nb, h, wd, c = x.shape
    _, oh, ow, _ = y.shape
    rows = nb * oh
    parts = max(1, min(threads, rows))
    b_ptr = bias.ctypes.data if has_bias else 0
    for i in prange(parts):
        dwconv3x3(x.ctypes.data, y.ctypes.data, w9.ctypes.data, b_ptr, h, wd, c, oh, ow, sh, sw, dh, dw, pt, pl, act,
                  i * rows // parts, (i + 1) * rows // parts)


@njit(inline="always")
def dw3x3_border(x3, n, iy, x0, h, wd, c, dh, dw, w9, b, acc):
    """``acc = b + Σ`` the taps of the 3×3 window at input row ``iy``, column ``x0`` that fall inside
    ``x3`` (N, H, W·C), ``w9`` (9, C) the taps row by row: a border pixel of the depthwise kernels,
    taps outer, channels inner."""
    uc = np.uint64(c)
    for o in range(uc):
        acc[o] = b[o]
    for i in range(3):
        yy = iy + i * dh
        if yy < 0 or yy >= h:
            continue
        for j in range(3):
            xx = x0 + j * dw
            if xx < 0 or xx >= wd:
                continue
            base = np.uint64(xx) * uc
            k = i * 3 + j
            for o in range(uc):
                acc[o] += x3[n, yy, base + o] * w9[k, o]


@njit(parallel=True, cache=True, fastmath=True)
def depthwise3x3_rows(x3, wt, bt, y3, w, b, h, wd, c, oh, ow, pt, pl, dh, dw, xa, xb, act):
    """3×3 stride-1 depthwise conv (multiplier 1) over flattened rows: ``x3`` (N, H, W·C), ``y3``
    (N, OH, OW·C). For an inner row, the outputs ``xa ≤ xo < xb`` (no column padding) are one
    contiguous run of ``(xb − xa)·C`` values, computed in a single vectorised loop with all nine
    taps fused: ``wt`` (9, run) and ``bt`` (run) hold the weights and bias tiled along the run
    once at resize, so the loop needs no per-pixel setup (the per-pixel kernel spent most of its
    time there on MobileNet's 32-channel 112×112 layer). Border pixels take a per-pixel path.

    The run's indices are unsigned on purpose: numba's negative-index wraparound on a signed
    computed index turns each load into a gather, about 3× slower."""
    nb = x3.shape[0]
    w9 = w.reshape(9, c)
    run = np.uint64((xb - xa) * c)
    d1 = np.uint64(dw * c)
    d2 = np.uint64(2 * dw * c)
    for r in prange(nb * oh):
        n = r // oh
        yo = r % oh
        iy = yo - pt
        first, last = 0, 0
        if iy >= 0 and iy + 2 * dh < h:
            i1 = iy + dh
            i2 = iy + 2 * dh
            s0 = np.uint64((xa - pl) * c)
            q0 = np.uint64(xa * c)
            for t in range(run):
                s = s0 + t
                v = (bt[t] + x3[n, iy, s] * wt[0, t] + x3[n, iy, s + d1] * wt[1, t] + x3[n, iy, s + d2] * wt[2, t]
                     + x3[n, i1, s] * wt[3, t] + x3[n, i1, s + d1] * wt[4, t] + x3[n, i1, s + d2] * wt[5, t]
                     + x3[n, i2, s] * wt[6, t] + x3[n, i2, s + d1] * wt[7, t] + x3[n, i2, s + d2] * wt[8, t])
                y3[n, yo, q0 + t] = _act(v, act)
            first, last = xa, xb
        acc = np.empty(c, dtype=np.float32)
        for xo in range(ow):  # border pixels (every pixel of a border row)
            if first <= xo < last:
                continue
            dw3x3_border(x3, n, iy, xo - pl, h, wd, c, dh, dw, w9, b, acc)
            out = np.uint64(xo * c)
            for o in range(np.uint64(c)):
                y3[n, yo, out + o] = _act(acc[o], act)


@njit(parallel=True, cache=True, fastmath=True)
def depthwise3x3(x3, w9, b, y3, h, wd, c, sh, sw, dh, dw, pt, pl, act):
    """``x3`` (N, H, W·C), ``w9`` (9, C) the taps row by row, ``b`` (C) the bias (zeros if none),
    ``y3`` (N, OH, OW·C)."""
    nb, oh, _ = y3.shape
    ow = y3.shape[2] // c
    uc = np.uint64(c)
    d1 = np.uint64(dw * c)
    d2 = np.uint64(2 * dw * c)
    xa = min(ow, (pl + sw - 1) // sw)  # first output column whose window starts inside the input
    xb = max(xa, min(ow, (wd - 1 - 2 * dw + pl) // sw + 1))  # one past the last whose window ends inside
    for r in prange(nb * oh):
        n = r // oh
        yo = r % oh
        iy = yo * sh - pt
        out = y3[n, yo]
        first, last = 0, 0
        if iy >= 0 and iy + 2 * dh < h:
            r0 = x3[n, iy]
            r1 = x3[n, iy + dh]
            r2 = x3[n, iy + 2 * dh]
            for xo in range(xa, xb):
                s0 = np.uint64(xo * sw - pl) * uc
                s1 = s0 + d1
                s2 = s0 + d2
                q = np.uint64(xo) * uc
                for o in range(uc):
                    v = (b[o] + r0[s0 + o] * w9[0, o] + r0[s1 + o] * w9[1, o] + r0[s2 + o] * w9[2, o]
                         + r1[s0 + o] * w9[3, o] + r1[s1 + o] * w9[4, o] + r1[s2 + o] * w9[5, o]
                         + r2[s0 + o] * w9[6, o] + r2[s1 + o] * w9[7, o] + r2[s2 + o] * w9[8, o])
                    out[q + o] = _act(v, act)
            first, last = xa, xb
        acc = np.empty(c, dtype=np.float32)
        for xo in range(ow):  # border pixels (every pixel of a border row)
            if first <= xo < last:
                continue
            dw3x3_border(x3, n, iy, xo * sw - pl, h, wd, c, dh, dw, w9, b, acc)
            q = np.uint64(xo) * uc
            for o in range(uc):
                out[q + o] = _act(acc[o], act)
