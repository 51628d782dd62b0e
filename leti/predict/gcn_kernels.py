"""The compiled (numba) kernels of :mod:`leti.predict.gcn_infer`'s GCN evaluation: numbering distinct
rows, a layer's aggregation ``relu(bias + Σ coefficient · z[neighbour])`` over CSR neighbourhoods (fused
with the readout for the last layer), the live columns of a block, and the dense layers of a few cells."""

from __future__ import annotations

import numba
import numpy as np

_MIX = np.random.default_rng(20240607).integers(1, 2**62, size=64, dtype=np.int64) | 1


def unique_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(representative row of each distinct row, id of every row) of an int64 matrix; ids follow
    the order in which the distinct rows first appear: the states of one cell get nearby ids, so the
    next layer's aggregation reads its neighbours' rows almost sequentially (in hash order it was
    bound by memory latency). One pass over an open-addressing table; rows are compared whole."""
    first = np.empty(len(keys), np.int64)
    ids = np.empty(len(keys), np.int64)
    count = _number_rows(np.ascontiguousarray(keys, np.int64), _MIX, first, ids)
    return first[:count], ids


@numba.njit(cache=True, nogil=True)
def _number_rows(keys, mix, first, ids):
    n, w = keys.shape
    size = 1
    while size < 2 * n:
        size *= 2
    slot_row = np.full(size, -1, np.int64)  # the representative row in each slot, -1: empty
    count = 0
    for i in range(n):
        h = np.int64(0)
        for c in range(w):
            h = h * mix[c % mix.shape[0]] + keys[i, c]  # wrapping multiply-add
        slot = (h ^ (h >> 31)) & (size - 1)
        while True:
            r = slot_row[slot]
            if r < 0:
                slot_row[slot] = i
                first[count] = i
                ids[i] = count
                count += 1
                break
            same = True
            for c in range(w):
                if keys[r, c] != keys[i, c]:
                    same = False
                    break
            if same:
                ids[i] = ids[r]
                break
            slot = (slot + 1) & (size - 1)
    return count


# ---- kernels: a layer's new state is relu(bias + Σ coefficient · z[neighbour]) ------------------
@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _csr_sum(buf, bias, rowptr, col, val, z, r):
    """``buf = bias + Σ val · z[col]`` over the CSR entries of row ``r``."""
    buf[:] = bias
    for e in range(rowptr[r], rowptr[r + 1]):
        c = val[e]
        zr = z[col[e]]
        for q in range(buf.shape[0]):
            buf[q] += c * zr[q]


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _dense_sum(buf, bias, arow, zc):
    """``buf = bias + Σ_j arow[j] · zc[j]`` (a dense row of one small cell's adjacency)."""
    buf[:] = bias
    for j in range(arow.shape[0]):
        c = arow[j]
        if c != 0.0:
            zr = zc[j]
            for q in range(buf.shape[0]):
                buf[q] += c * zr[q]


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _relu(buf):
    for q in range(buf.shape[0]):
        if buf[q] < 0.0:
            buf[q] = 0.0


@numba.njit(cache=True, nogil=True, fastmath=True, inline="always")
def _relu_dot(buf, w):
    """``w · relu(buf)``: the linear readout of a state, without storing it."""
    acc = 0.0
    for q in range(buf.shape[0]):
        if buf[q] > 0.0:
            acc += buf[q] * w[q]
    return acc


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def aggregate(rowptr, col, val, z, bias, valid, lo, out):
    """New states ``lo .. lo + len(out)`` into ``out`` (0 for padding states)."""
    for i in numba.prange(out.shape[0]):
        if valid[lo + i]:
            _csr_sum(out[i], bias, rowptr, col, val, z, lo + i)
            _relu(out[i])
        else:
            out[i] = 0.0


@numba.njit(cache=True, nogil=True, fastmath=True)
def column_max(buf, top):
    """``top[q]`` = the largest entry of column ``q`` of ``buf`` (ReLU outputs: > 0 where the unit is live)."""
    top[:] = 0.0
    for i in range(buf.shape[0]):
        for q in range(buf.shape[1]):
            top[q] = max(top[q], buf[i, q])


@numba.njit(cache=True, nogil=True, parallel=True)
def take_columns(buf, keep, out):
    """``out = buf[:, keep]``."""
    for i in numba.prange(buf.shape[0]):
        for k in range(keep.shape[0]):
            out[i, k] = buf[i, keep[k]]


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def aggregate_readout(rowptr, col, val, z, bias, valid, head_w, out):
    """The last layer fused with the readout: ``out[r] = head_w · (state r)``, 0 for padding states."""
    n = out.shape[0]
    for blk in numba.prange((n + 63) // 64):
        buf = np.empty(z.shape[1], np.float32)
        for r in range(blk * 64, min(n, blk * 64 + 64)):
            out[r] = 0.0
            if valid[r]:
                _csr_sum(buf, bias, rowptr, col, val, z, r)
                out[r] = _relu_dot(buf, head_w)


@numba.njit(cache=True, nogil=True, fastmath=True)
def small_layer(a, z, bias, mask, out):
    """One layer of a few dense cells: ``out[c, i]`` from ``a[c, i]`` and ``z[c]``, 0 where masked."""
    for c in range(z.shape[0]):
        for i in range(z.shape[1]):
            if mask[c, i] != 0.0:
                _dense_sum(out[c, i], bias, a[c, i], z[c])
                _relu(out[c, i])
            else:
                out[c, i] = 0.0


@numba.njit(cache=True, nogil=True, fastmath=True)
def small_layer_readout(a, z, bias, mask, head_w, out):
    """:func:`small_layer` fused with the readout: ``out[c, i] = head_w · (that state)``."""
    buf = np.empty(z.shape[2], np.float32)
    for c in range(z.shape[0]):
        for i in range(z.shape[1]):
            out[c, i] = 0.0
            if mask[c, i] != 0.0:
                _dense_sum(buf, bias, a[c, i], z[c])
                out[c, i] = _relu_dot(buf, head_w)
