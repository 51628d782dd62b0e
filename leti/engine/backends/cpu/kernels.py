"""numba kernels of the CPU backend (compiled once per dtype/layout and cached on disk).

All kernels work on NHWC float32 arrays and write into preallocated outputs; ``act`` is 0 (none),
1 (ReLU) or 2 (ReLU6). Parallel loops (``prange``) run on numba's thread pool, whose size the
backend sets from its ``threads`` option.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401 - numba's np.dot calls it: load it before thread limits apply
from numba import njit, prange

from leti.engine.backends.cpu.blas import set_threads_local, sgemm

ACT_CODE = {"none": 0, None: 0, "relu": 1, "relu6": 2}


@njit(inline="always")
def _act(v, act):
    if act == 1:
        return v if v > 0.0 else np.float32(0.0)
    if act == 2:
        return min(max(v, np.float32(0.0)), np.float32(6.0))
    return v


@njit(parallel=True, cache=True, fastmath=True)
def bias_act(y, bias, has_bias, act):
    """In place on a 2-D ``(rows, channels)`` array: ``y = act(y + bias)``."""
    rows, ch = y.shape
    for r in prange(rows):
        for c in range(ch):
            v = y[r, c]
            if has_bias:
                v += bias[c]
            y[r, c] = _act(v, act)


@njit(parallel=True, cache=True)
def im2col(x, col, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow):
    """``col[(n·oh + y)·ow + x, (i·kw + j)·C + c] = x[n, y·sh − pt + i·dh, x·sw − pl + j·dw, c]`` (0 outside).

    With few channels (C < 16) and no dilation, a window row inside the input is one contiguous run
    of ``kw·C`` values, copied in one loop over flat unsigned offsets (the stem convolution's C = 3
    made the per-tap copies three values long: 1.2× on 224×224×3, 3×3/2)."""
    nb, h, w, c = x.shape
    kc = np.uint64(kw * c)
    xf = x.reshape(nb * h * w * c)
    cf = col.reshape(col.shape[0] * col.shape[1])
    ncol = np.uint64(col.shape[1])
    for r in prange(nb * oh):
        n = r // oh
        y = r % oh
        for xo in range(ow):
            row = r * ow + xo
            x0 = xo * sw - pl
            whole = dw == 1 and c < 16 and x0 >= 0 and x0 + kw <= w
            for i in range(kh):
                yy = y * sh - pt + i * dh
                if whole and 0 <= yy < h:
                    s0 = np.uint64(((n * h + yy) * w + x0) * c)
                    d0 = np.uint64(row) * ncol + np.uint64(i * kw * c)
                    for t in range(kc):
                        cf[d0 + t] = xf[s0 + t]
                    continue
                for j in range(kw):
                    xx = x0 + j * dw
                    base = (i * kw + j) * c
                    if 0 <= yy < h and 0 <= xx < w:
                        for ci in range(c):
                            col[row, base + ci] = x[n, yy, xx, ci]
                    else:
                        for ci in range(c):
                            col[row, base + ci] = 0.0


#: Bytes of the wider of a row block's input and output that one BLAS call + epilogue covers: about
#: Zen 3's L2, so the epilogue reads the product back from cache (12544×16×96: 1.9× faster than
#: one call per thread followed by the epilogue over a 4.8 MB output; docs/engine.md).
BLOCK_BYTES = 1 << 19


@njit(inline="always")
def _sub_rows(k, n):
    return max(16, BLOCK_BYTES // (4 * max(k, n)))


@njit(inline="always")
def _epilogue(y, r0, r1, bias, has_bias, act):
    """``y[r0:r1] = act(y[r0:r1] + bias)`` on a block still in cache from its product; one loop per
    case (a branch on ``act`` inside the loop kept it from vectorising)."""
    n = y.shape[1]
    if has_bias:
        if act == 2:
            for r in range(r0, r1):
                for c in range(n):
                    y[r, c] = min(max(y[r, c] + bias[c], np.float32(0.0)), np.float32(6.0))
        elif act == 1:
            for r in range(r0, r1):
                for c in range(n):
                    y[r, c] = max(y[r, c] + bias[c], np.float32(0.0))
        else:
            for r in range(r0, r1):
                for c in range(n):
                    y[r, c] += bias[c]
    elif act != 0:
        for r in range(r0, r1):
            for c in range(n):
                y[r, c] = _act(y[r, c], act)


@njit(parallel=True, cache=True, fastmath=True)
def gemm_bias_act(a, b, y, bias, has_bias, act, threads):
    """``y = act(a @ b + bias)`` for 2-D ``a`` (rows × k), ``b`` (k × n, C or F order) and C-contiguous
    ``y``: rows split into one block per numba thread, each block one single-threaded BLAS call
    (scipy's) per :data:`BLOCK_BYTES` of rows, each followed by the epilogue while it is in cache.
    Keeping the GEMMs inside numba's pool means one set of threads (no BLAS pool competing with
    numba's for the cores)."""
    m, k = a.shape
    blocks = max(1, min(threads, m // 16))
    sub = _sub_rows(k, b.shape[1])
    for i in prange(blocks):
        for s0 in range(i * m // blocks, (i + 1) * m // blocks, sub):
            s1 = min((i + 1) * m // blocks, s0 + sub)
            np.dot(a[s0:s1], b, y[s0:s1])
            if has_bias or act != 0:
                _epilogue(y, s0, s1, bias, has_bias, act)


@njit(parallel=True, cache=True, fastmath=True)
def gemm_mkl_bias_act(a, b, y, bias, has_bias, act, threads, one):
    """:func:`gemm_bias_act` through MKL's ``sgemm_`` (see :mod:`.blas`): C-contiguous ``a`` (rows × k),
    ``b`` (k × n) and ``y``. Row-major ``y = a b`` is the column-major ``yᵀ = bᵀ aᵀ``, so the call
    passes ``b`` first. ``one`` holds the int32 1 that MKL's per-thread thread count is set to."""
    m, k = a.shape
    n = b.shape[1]
    blocks = max(1, min(threads, m // 16))
    sub = _sub_rows(k, n)
    for i in prange(blocks):
        r0 = i * m // blocks
        r1 = (i + 1) * m // blocks
        dims = np.empty(4, dtype=np.int32)  # n, rows, k, 'N'
        dims[0] = n
        dims[2] = k
        dims[3] = 78
        scale = np.empty(2, dtype=np.float32)  # alpha, beta
        scale[0] = 1.0
        scale[1] = 0.0
        nn, rows, kk, trans = dims.ctypes.data, dims.ctypes.data + 4, dims.ctypes.data + 8, dims.ctypes.data + 12
        set_threads_local(one.ctypes.data)
        for s0 in range(r0, r1, sub):
            s1 = min(r1, s0 + sub)
            dims[1] = s1 - s0
            sgemm(trans, trans, nn, rows, kk, scale.ctypes.data, b.ctypes.data, nn, a[s0:].ctypes.data, kk,
                  scale.ctypes.data + 4, y[s0:].ctypes.data, nn)
            if has_bias or act != 0:
                _epilogue(y, s0, s1, bias, has_bias, act)


@njit(parallel=True, cache=True, fastmath=True)
def residual_act(y, res, act):
    """In place on 2-D ``(rows, channels)`` arrays: ``y = act(y + res)`` (a shortcut added after a
    product that ran without its activation)."""
    rows, ch = y.shape
    for r in prange(rows):
        for c in range(ch):
            y[r, c] = _act(y[r, c] + res[r, c], act)


@njit(parallel=True, cache=True, fastmath=True)
def gemv_bias_act(x, wp, y, bias, has_bias, act):
    """``y = act(x @ w + bias)`` for one input row (a fully connected layer at batch 1), ``w`` packed as the
    products' (``ckernels.pack``: panels of k × 16 outputs): one panel per iteration, split over numba's threads
    (a split over rows would leave all but one thread idle), streaming the weights once, in order."""
    n = y.shape[0]
    panels, k, nr = wp.shape
    for p in prange(panels):
        acc = np.zeros(nr, np.float32)
        for j in range(k):
            for q in range(nr):
                acc[q] += x[j] * wp[p, j, q]
        for q in range(min(nr, n - p * nr)):
            v = acc[q] + bias[p * nr + q] if has_bias else acc[q]
            y[p * nr + q] = _act(v, act)


@njit(parallel=True, cache=True)
def swap_last_two(x, y):
    """``y[b, q, p] = x[b, p, q]`` (3-D arrays): a transpose of the last two axes, as ShuffleNet's channel
    shuffle: NumPy's strided copy of it, with an innermost axis of 2-8 elements, runs at ~1.5-2.5 ns per
    element; this loop, reading rows in order, at ~0.35-0.5 (one thread, 32,000-360,000 elements)."""
    nb, np_, nq = x.shape
    for b in prange(nb):
        for p in range(np_):
            for q in range(nq):
                y[b, q, p] = x[b, p, q]


@njit(parallel=True, cache=True)
def batched_gemm(v, ut, m):
    """``m[p] = v[p] @ ut[p]ᵀ`` for every p (the α² Winograd products), one BLAS call per p in
    numba's pool; ``ut`` stores each matrix transposed (BLAS packs it faster for few rows)."""
    for p in prange(v.shape[0]):
        np.dot(v[p], ut[p].T, m[p])


@njit(parallel=True, cache=True, fastmath=True)
def depthwise(x, w, bias, has_bias, y, mult, sh, sw, dh, dw, pt, pl, act):
    """Depthwise conv: ``y[.., c·mult + m] = Σ x[.., c] · w[i, j, c·mult + m]``.

    Parallel over output rows; per output pixel the taps accumulate into a channel vector with
    contiguous, vectorised loops over channels (the multiplier-1 case, MobileNet's, has no index
    arithmetic in the inner loop)."""
    nb, h, wd, _ = x.shape
    _, oh, ow, oc = y.shape
    kh, kw, _ = w.shape
    for r in prange(nb * oh):
        n = r // oh
        yo = r % oh
        acc = np.empty(oc, dtype=np.float32)
        for xo in range(ow):
            if has_bias:
                for o in range(oc):
                    acc[o] = bias[o]
            else:
                for o in range(oc):
                    acc[o] = 0.0
            for i in range(kh):
                yy = yo * sh - pt + i * dh
                if yy < 0 or yy >= h:
                    continue
                for j in range(kw):
                    xx = xo * sw - pl + j * dw
                    if xx < 0 or xx >= wd:
                        continue
                    xr = x[n, yy, xx]
                    wr = w[i, j]
                    if mult == 1:
                        for o in range(oc):
                            acc[o] += xr[o] * wr[o]
                    else:
                        for o in range(oc):
                            acc[o] += xr[o // mult] * wr[o]
            yr = y[n, yo, xo]
            for o in range(oc):
                yr[o] = _act(acc[o], act)


@njit(cache=True, fastmath=True)
def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


@njit(parallel=True, cache=True, fastmath=True)
def lstm_recurrence(gx, rt, seq, h, c):
    """The recurrent loop: ``gx`` (N, T, 4H) holds the input projections of all steps (one GEMM
    done before); each step adds ``h @ r`` (``rt = rᵀ``, contiguous per unit) and updates the state, threads split over hidden units."""
    n, t, h4 = gx.shape
    hd = h4 // 4
    hn = np.empty_like(h)
    for s in range(t):
        for u in prange(hd):
            for b in range(n):
                zi = gx[b, s, u]
                zf = gx[b, s, hd + u]
                zg = gx[b, s, 2 * hd + u]
                zo = gx[b, s, 3 * hd + u]
                for k in range(hd):
                    hv = h[b, k]
                    zi += hv * rt[u, k]
                    zf += hv * rt[hd + u, k]
                    zg += hv * rt[2 * hd + u, k]
                    zo += hv * rt[3 * hd + u, k]
                cv = _sigmoid(zf) * c[b, u] + _sigmoid(zi) * np.tanh(zg)
                c[b, u] = cv
                hn[b, u] = _sigmoid(zo) * np.tanh(cv)
        for b in range(n):
            for u in range(hd):
                h[b, u] = hn[b, u]
                seq[b, s, u] = hn[b, u]


@njit(cache=True, fastmath=True)
def spatial_mean(x3, out2):
    """``out2[b, c] = mean over p of x3[b, p, c]`` (global average pooling of an NHWC map viewed as
    (N, H·W, C)): rows added in order into a float64 accumulator per channel, one contiguous pass. NumPy's
    mean over axes 1 and 2 made a temporary and, run after a convolution inside a model, took 0.13 ms for a
    7×7×1024 map."""
    nb, p, c = x3.shape
    acc = np.empty(c, dtype=np.float64)
    for b in range(nb):
        for o in range(c):
            acc[o] = 0.0
        for i in range(p):
            for o in range(c):
                acc[o] += x3[b, i, o]
        for o in range(c):
            out2[b, o] = acc[o] / p


@njit(cache=True, fastmath=True)
def softmax_rows(x2, beta, y2):
    """``y2[r] = softmax(beta · x2[r])`` row by row, without NumPy's temporaries."""
    rows, c = x2.shape
    for r in range(rows):
        m = -np.inf
        for o in range(c):
            v = beta * x2[r, o]
            y2[r, o] = v
            if v > m:
                m = v
        s = 0.0
        for o in range(c):
            e = np.exp(y2[r, o] - m)
            y2[r, o] = e
            s += e
        inv = np.float32(1.0 / s)
        for o in range(c):
            y2[r, o] *= inv
