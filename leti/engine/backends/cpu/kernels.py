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
def winograd_input(x, bt, v, n_out, pt, pl, th, tw, threads):
    """Tiles of ``x[b]`` (α×α, stride n_out, zero padded) transformed to ``v[a·α + b, t, c] = (Bᵀ X B)[a, b]``,
    ``bt`` = Bᵀ from :func:`winograd_transforms` (α rows; 4 or 6 columns, zero-padded, for α ≤ 6).

    Tiles are split into a few chunks per thread (``threads``: numba's current count); each chunk reuses two
    buffers of w×w×C (w = 4 or 6, the rows and columns past α zero) and every inner loop runs over contiguous
    channels (vectorised), each output element a sum of w products written once. Larger α (forced tiles past
    F(4×4)) take a generic loop."""
    nb, h, w, c = x.shape
    alpha = bt.shape[0]
    wdt = bt.shape[1]
    tiles = th * tw
    total = nb * tiles
    nchunks = max(1, min(total, 4 * threads))
    for ch in prange(nchunks):
        d = np.zeros((wdt, wdt, c), dtype=np.float32)
        tmp = np.zeros((wdt, wdt, c), dtype=np.float32)
        for row in range(ch * total // nchunks, (ch + 1) * total // nchunks):
            b = row // tiles
            t = row % tiles
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
def winograd_output(m, at, y, bias, has_bias, act, th, tw, threads):
    """``y[b, ty·n + i, tx·n + j, :] = act((Aᵀ M A)[i, j] + bias)``, cropped to y's size; ``at`` = Aᵀ from
    :func:`winograd_transforms` (n rows; 4 or 6 columns, zero-padded, for α ≤ 6)."""
    nb, oh, ow, oc = y.shape
    n_out, wdt = at.shape
    alpha = int(np.sqrt(m.shape[0]) + 0.5)
    tiles = th * tw
    total = nb * tiles
    nchunks = max(1, min(total, 4 * threads))
    for ch in prange(nchunks):
        zero = np.zeros(oc, dtype=np.float32)  # M's row past α (F(3×3): α = 5 of 6 terms)
        bvec = bias[:oc] if has_bias else zero
        tmp = np.zeros((n_out, wdt, oc), dtype=np.float32)
        acc = np.empty(oc, dtype=np.float32)
        for row in range(ch * total // nchunks, (ch + 1) * total // nchunks):
            b = row // tiles
            t = row % tiles
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
def gemv_bias_act(x, wt, y, bias, has_bias, act):
    """``y = act(wt @ x + bias)`` for one input row (a fully connected layer at batch 1): one dot
    product per output, split over numba's threads (a split over rows would leave all but one
    thread idle), streaming ``wt`` (n × k, C order) once."""
    n, k = wt.shape
    for c in prange(n):
        acc = np.float32(0.0)
        for j in range(k):
            acc += x[j] * wt[c, j]
        if has_bias:
            acc += bias[c]
        y[c] = _act(acc, act)


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
