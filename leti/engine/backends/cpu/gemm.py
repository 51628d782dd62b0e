"""numba drivers of LETI's own SGEMM (:mod:`.ckernels`, ``csrc/gemm.c``): the split of one product over
numba's threads, and the α² Winograd products."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from leti.engine.backends.cpu import ckernels
from leti.engine.backends.cpu.ckernels import MR, NR
from leti.engine.backends.cpu.ckernels import sgemm as leti_sgemm

# The C kernels' symbols must be loaded before numba links a kernel that calls them (an unresolved symbol
# is a jump to address 0): build/load them now, so that no caller depends on having asked first.
ckernels.library()

#: A product with more columns than rows splits its weight panels over the threads rather than its rows where its
#: weights reach this percentage of its input and output together (``csrc/program.c``, ``ckernels.set_weights_split``).
WEIGHTS_SPLIT = 120


@njit(parallel=True, cache=True)
def gemm_leti_bias_act(a, bp, y, bias, has_bias, act, threads, res, has_res):
    """``y = act(a @ B + bias [+ res])`` through LETI's own kernel (:mod:`.ckernels`): C-contiguous ``a``
    (rows × k), ``y`` and ``res`` (a residual shaped like ``y``, added before the activation when
    ``has_res``), ``bp`` the packed weights ``(panels, k, 16)``, ``bias`` padded to whole panels.
    Rows are split over the threads in multiples of the kernel's 6 where there are more rows than columns;
    products with fewer (a 14×14 or 7×7 map's: megabytes of weights, a few hundred kilobytes of input) split the
    weight panels instead where the weights are large (:data:`WEIGHTS_SPLIT`), on pairs of panels, so that each
    thread reads its share of the weights rather than all of them; and so that no thread sits idle on too few rows."""
    m, k = a.shape
    n = y.shape[1]
    panels = bp.shape[0]
    b_ptr = bias.ctypes.data if has_bias else 0
    r_ptr = res.ctypes.data if has_res else 0
    by_rows = panels < threads or (m >= 4 * MR * threads and (m >= n or 100 * k * n < WEIGHTS_SPLIT * m * (k + n)))
    parts = max(1, min(threads, m // MR if by_rows else panels))
    for i in prange(parts):
        if by_rows:
            r0 = (i * m // parts) // MR * MR
            r1 = m if i == parts - 1 else ((i + 1) * m // parts) // MR * MR
            leti_sgemm(r1 - r0, n, k, a.ctypes.data + r0 * k * 4, k, bp.ctypes.data, y.ctypes.data + r0 * n * 4, n,
                       b_ptr, r_ptr + r0 * n * 4 if has_res else 0, act)
        else:
            q0 = i * panels // parts
            q1 = panels if i == parts - 1 else (i + 1) * panels // parts
            if panels >= 4 * parts:  # part boundaries on pairs of panels (the paired AVX-512 tiles)
                q0 = (q0 + 1) // 2 * 2
                q1 = panels if i == parts - 1 else (q1 + 1) // 2 * 2
            cols = min(n, q1 * NR) - q0 * NR
            leti_sgemm(m, cols, k, a.ctypes.data, k, bp.ctypes.data + q0 * k * NR * 4, y.ctypes.data + q0 * NR * 4, n,
                       b_ptr + q0 * NR * 4 if has_bias else 0, r_ptr + q0 * NR * 4 if has_res else 0, act)


@njit(parallel=True, cache=True)
def batched_gemm_leti(v, up, m):
    """``m[p] = v[p] @ U[p]`` for every Winograd position p, ``up`` the packed ``U`` (:func:`ckernels.pack`
    of a ``(P, ic, oc)`` stack); one kernel call per position in numba's pool."""
    positions, tiles, ic = v.shape
    oc = m.shape[2]
    step_u = up.shape[1] * ic * NR * 4
    for p in prange(positions):
        leti_sgemm(tiles, oc, ic, v.ctypes.data + p * tiles * ic * 4, ic, up.ctypes.data + p * step_u,
                   m.ctypes.data + p * tiles * oc * 4, oc, 0, 0, 0)


@njit(parallel=True, cache=True)
def conv_window_leti(x, xp, bp, y, bias, has_bias, res, has_res, groups, kh, kw, sh, sw, pt, pl, act, threads):
    """``y = act(conv(x, W) + bias [+ res])`` for a window over few channels, or a grouped convolution
    (``ckernels.conv_window``): the output rows split over the threads. ``bp``: per group the (kh·kw·C/groups)
    × (n/groups) weights packed, stacked (one stack when ``groups`` is 1); no dilation. A window that reads no
    padding (a strided 1×1 shortcut, a ``valid`` window) reads ``x`` in place, and so does one that reads padding
    when ``xp`` is empty (``ckernels.conv_window_inplace``: the rows under a border pixel copied as it needs them,
    :func:`padded_shape`); with a padded copy ``xp`` (hp × wp × C scratch: the AVX-512 windows) it is written by row
    blocks over the threads first."""
    nb, h, wd, c = x.shape
    oh, ow, n = y.shape[1], y.shape[2], y.shape[3]
    hp, wp = (oh - 1) * sh + kh, (ow - 1) * sw + kw
    padded = window_reads_padding(h, wd, oh, ow, kh, kw, sh, sw, pt, pl)
    b_ptr = bias.ctypes.data if has_bias else 0
    for b in range(nb):
        x_ptr = x.ctypes.data + b * h * wd * c * 4
        src, row = x_ptr, wd
        parts = max(1, min(threads, oh))
        y_ptr = y.ctypes.data + b * oh * ow * n * 4
        r_ptr = res.ctypes.data + b * oh * ow * n * 4 if has_res else 0
        if padded and xp.size == 0:
            for i in prange(parts):
                ckernels.conv_window_inplace(x_ptr, h, wd, c // groups, groups, kh, kw, sh, sw, pt, pl, bp.ctypes.data,
                                             n // groups, y_ptr, ow, b_ptr, r_ptr, act, i * oh // parts * groups,
                                             (i + 1) * oh // parts * groups)
            continue
        if padded:
            src, row = xp.ctypes.data, wp
            pparts = max(1, min(threads, hp))
            for i in prange(pparts):
                ckernels.pad_nhwc(x_ptr, h, wd, c, src, hp, wp, pt, pl, i * hp // pparts, (i + 1) * hp // pparts)
        for i in prange(parts):
            ckernels.conv_window(src, row, c // groups, groups, kh, kw, sh, sw, bp.ctypes.data, n // groups,
                                 y_ptr, ow, b_ptr, r_ptr, act, i * oh // parts, (i + 1) * oh // parts)


@njit(cache=True)
def window_reads_padding(h, wd, oh, ow, kh, kw, sh, sw, pt, pl):
    """Whether the windows of an ``oh × ow`` output reach outside the ``h × wd`` input (placed at ``pt, pl``).
    Python at resize calls ``.py_func``: a compiled function's first call costs a process ~45 MiB (numba's JIT
    starting), which a model run by native programs alone (:mod:`.native`) never pays otherwise."""
    return pt > 0 or pl > 0 or (oh - 1) * sh + kh > h or (ow - 1) * sw + kw > wd


#: the padded copy passed for a window that reads its input in place
NO_PADDING = np.zeros((0, 0, 0), np.float32)


def padded_shape(in_shape, oh, ow, kh, kw, sh, sw, pt, pl) -> tuple[int, int]:
    """``(hp, wp)`` of the zero-padded copy :func:`conv_window_leti` reads for an input of ``in_shape`` (NHWC), or
    ``(0, 0)`` where it reads the input in place (no scratch to plan): where the window reads no padding, and, on AVX2,
    where it does (``leti_conv_window_inplace``, session 28; the AVX-512 windows read a padded copy)."""
    if not window_reads_padding.py_func(in_shape[1], in_shape[2], oh, ow, kh, kw, sh, sw, pt, pl):
        return 0, 0
    if not ckernels.set_avx512(None):
        return 0, 0
    return (oh - 1) * sh + kh, (ow - 1) * sw + kw


def padded_view(scratch, hp: int, wp: int, c: int) -> np.ndarray:
    """The padded copy's view of an execution's scratch (:data:`NO_PADDING` when ``hp`` is 0)."""
    return NO_PADDING if not hp else scratch[0].view(np.float32).reshape(hp, wp, c)
