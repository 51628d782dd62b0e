"""Fast GCN inference: the trained :class:`~leti.predict.gcn.GCNPredictor` network evaluated once per
*distinct vertex state* instead of once per vertex.

A GCN layer computes, for vertex ``i``, ``h_i' = relu(b + Σ_j â_ij · h_j W)`` where ``â`` is the
normalised adjacency with self-loops (``â_ij = 1/sqrt(d_i d_j)``). So ``h_i'`` is a function of the
multiset ``{(â_ij, h_j)}`` of its neighbourhood — the idea behind the Weisfeiler-Lehman test. Cells of
a search space share most neighbourhoods: over the 15,625 NB201 cells the 125,000 vertices have only
~1,300 distinct states after layer 1 and ~46,000 after layer 2; NB101 cells are similar. This module
gives every vertex an integer *state id* per layer (exactly: ids of equal neighbourhood multisets are
equal, verified, never trusted to a hash), evaluates the expensive ``h W`` product (the 600×600
matrices) only for one representative per id, and gathers. The readout is linear in the last layer's
states, so it is applied per id too. Results equal the torch-geometric forward up to float summation
order (tests compare them).

At batch scale the big layers have ~100,000 states of 600 floats (240 MB each), so memory traffic
matters as much as the products: ids are numbered in order of first appearance (a state's neighbours
then sit close together in memory); a layer's new states are aggregated a block at a time into a
buffer that is multiplied by the next weight matrix while it is still in cache, so the states
themselves are never stored; and the last layer is aggregated and read out in one kernel that keeps
only a scalar per state. On all 15,625 NB201 cells the aggregations went from ~0.4 s to ~0.15 s
(one thread), ~1.1x on the whole batch: the rest is the products themselves (~1 s, MKL at ~100
GFLOP/s), which only fewer states, fewer columns or a lower precision can shorten.

Fewer columns: a trained 4×600 network has many dead ReLU units (about a third of the columns of a
block of states are zero in every row), so each block's all-zero columns are dropped from the
product with the matching rows of ``W`` — the same sum without its zero terms. The float32 products
run in NumPy's BLAS (OpenBLAS: ~88 GFLOP/s on a Zen 3 core on these shapes, where torch's MKL gave
55-90), on as many threads as torch's pool. On 100,000 NB101 cells (one thread, a 30-epoch model)
these took the fast path from ~6,900 to ~9,500 cells per CPU second.

``dtype="bfloat16"`` runs the large matrix products in bfloat16 (AMX/AVX-512-BF16 on recent Xeons,
several times faster), accumulating in float32; predictions then differ from float32 by a few 1e-3
relative — documented, opt-in, never the default.
"""

from __future__ import annotations

from contextlib import contextmanager

import numba
import numpy as np
import torch

DIRECT_CELLS = 16  # batches up to this many cells skip the state sharing (their kernels run on one thread)
_MIX = np.random.default_rng(20240607).integers(1, 2**62, size=64, dtype=np.int64) | 1


def _unique_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(representative row of each distinct row, id of every row) of an int64 matrix; ids follow
    the order in which the distinct rows first appear.

    Rows are hashed to one int64 (wrapping multiply-add with fixed odd multipliers), grouped by hash,
    and every row is then compared with its group's representative; a collision (never seen) falls
    back to the slow exact ``np.unique(axis=0)``.
    """
    n, w = keys.shape
    with np.errstate(over="ignore"):
        h = (keys * _MIX[:w][None, :]).sum(axis=1) if w <= len(_MIX) else None
    if h is not None:
        _, first, inv = np.unique(h, return_index=True, return_inverse=True)
        if not (keys == keys[first[inv]]).all():
            h = None
    if h is None:
        _, first, inv = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    # number the distinct rows in order of first appearance: the states of one cell get nearby ids,
    # so the next layer's aggregation reads its neighbours' rows almost sequentially instead of at
    # random (in hash order it was bound by memory latency)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inv.ravel()]


def _norm_adjacency(a: np.ndarray) -> np.ndarray:
    """DenseGCNConv's normalisation: self-loops set to 1, ``D^-1/2 (A) D^-1/2``, degrees clamped at 1."""
    a = a.astype(np.float32, copy=True)
    v = a.shape[1]
    a[:, np.arange(v), np.arange(v)] = 1.0
    d = np.clip(a.sum(axis=-1), 1.0, None) ** -0.5
    return (d[:, :, None] * a * d[:, None, :]).astype(np.float32)


#: new states aggregated per block and per thread: big enough for an efficient (and, with threads,
#: well-split) product, small enough to still be in cache when it is multiplied
_ROWS = 4096


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
def _aggregate(rowptr, col, val, z, bias, valid, lo, out):
    """New states ``lo .. lo + len(out)`` into ``out`` (0 for padding states)."""
    for i in numba.prange(out.shape[0]):
        if valid[lo + i]:
            _csr_sum(out[i], bias, rowptr, col, val, z, lo + i)
            _relu(out[i])
        else:
            out[i] = 0.0


@numba.njit(cache=True, nogil=True)
def _live_columns(buf, live):
    """``live[q]`` = 1 where column ``q`` of ``buf`` has a non-zero entry (ReLU output: positive)."""
    live[:] = 0
    for i in range(buf.shape[0]):
        for q in range(buf.shape[1]):
            live[q] |= buf[i, q] != 0.0


@numba.njit(cache=True, nogil=True, parallel=True)
def _take_columns(buf, keep, out):
    """``out = buf[:, keep]``."""
    for i in numba.prange(buf.shape[0]):
        for k in range(keep.shape[0]):
            out[i, k] = buf[i, keep[k]]


@numba.njit(cache=True, nogil=True, fastmath=True, parallel=True)
def _aggregate_readout(rowptr, col, val, z, bias, valid, head_w, out):
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
def _small_layer(a, z, bias, mask, out):
    """One layer of a few dense cells: ``out[c, i]`` from ``a[c, i]`` and ``z[c]``, 0 where masked."""
    for c in range(z.shape[0]):
        for i in range(z.shape[1]):
            if mask[c, i] != 0.0:
                _dense_sum(out[c, i], bias, a[c, i], z[c])
                _relu(out[c, i])
            else:
                out[c, i] = 0.0


@numba.njit(cache=True, nogil=True, fastmath=True)
def _small_layer_readout(a, z, bias, mask, head_w, out):
    """:func:`_small_layer` fused with the readout: ``out[c, i] = head_w · (that state)``."""
    buf = np.empty(z.shape[2], np.float32)
    for c in range(z.shape[0]):
        for i in range(z.shape[1]):
            out[c, i] = 0.0
            if mask[c, i] != 0.0:
                _dense_sum(buf, bias, a[c, i], z[c])
                out[c, i] = _relu_dot(buf, head_w)


_BLAS = None


def _buffer(ws: dict, key: str, rows: int, cols: int) -> np.ndarray:
    """A ``(rows, cols)`` float32 array on the memory of ``ws[key]``, grown when too small: the
    chunks of a batch reuse their ~250 MB state arrays instead of paying fresh pages' faults."""
    flat = ws.get(key)
    if flat is None or flat.size < rows * cols:
        flat = ws[key] = np.empty(max(rows * cols, 1), np.float32)
    return flat[:rows * cols].reshape(rows, cols)


@contextmanager
def _blas_threads(n: int):
    """NumPy's BLAS (it runs the float32 products: OpenBLAS reached ~88 GFLOP/s on one Zen 3 core
    on these shapes where torch's MKL reached 55-90) on ``n`` threads, as torch's pool, then restored."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    with _BLAS.limit(limits=n, user_api="blas"):
        yield


class DenseGCN:
    """The weights of a trained GCN as plain tensors, evaluated with state deduplication."""

    def __init__(self, state: dict[str, torch.Tensor], layers: int, global_node: bool) -> None:
        self.weights = [state[f"convs.{i}.lin.weight"].detach().float().T.contiguous() for i in range(layers)]
        self.biases = [state[f"convs.{i}.bias"].detach().float() for i in range(layers)]
        self.head_w = state["head.weight"].detach().float().reshape(-1)
        self.head_b = float(state["head.bias"].detach().float().reshape(-1)[0])
        self.global_node = global_node
        self._biases_np = [b.numpy() for b in self.biases]
        self._head_w_np = self.head_w.numpy()
        self._weights_np = [w.numpy() for w in self.weights]
        self._lowp: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def __call__(self, x: np.ndarray, a: np.ndarray, mask: np.ndarray, dtype: str = "float32",
                 workspace: dict | None = None) -> np.ndarray:
        """Network output (standardised log-latency) of ``(N, V, F)`` features, ``(N, V, V)`` adjacency
        and ``(N, V)`` mask, as :func:`leti.predict.features.graph_tensors` gives them. Calls given the
        same ``workspace`` dict reuse its arrays (for the chunks of one batch)."""
        n, v, f = x.shape
        if n == 0:
            return np.zeros(0)
        mm_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        norm = _norm_adjacency(a)
        valid = mask.astype(bool)
        if n <= DIRECT_CELLS:
            return self._direct(x, norm, valid, mm_dtype)
        with _blas_threads(torch.get_num_threads()):
            return self._shared(x, norm, valid, mm_dtype, {} if workspace is None else workspace)

    def _shared(self, x: np.ndarray, norm: np.ndarray, valid: np.ndarray, mm_dtype: torch.dtype,
                ws: dict) -> np.ndarray:
        """The network evaluated once per distinct vertex state (see the module's docstring)."""
        n, v, f = x.shape
        # coefficient codes: equal float32 bits <=> equal coefficient; 0 = no edge
        coef_bits = np.where(norm != 0, norm.view(np.int32).astype(np.int64), 0)
        flat_mask = valid.reshape(-1)
        # layer 0 ids: distinct feature rows (padding rows get their own state: all zero)
        x_rows = np.concatenate([x.reshape(n * v, f), flat_mask[:, None]], axis=1).astype(np.float32)
        first, ids = _unique_rows(x_rows.view(np.int32).astype(np.int64))
        h0 = torch.from_numpy(np.ascontiguousarray(x_rows[first, :f]))  # states of layer 0
        z = self._matmul(h0, self.weights[0], mm_dtype).numpy()  # per state of the layer below
        ids = ids.reshape(n, v)
        last = len(self.weights) - 1
        for layer in range(last + 1):
            readout_only = layer == last and self.global_node
            # ids of this layer: multiset of (coefficient, neighbour id) per vertex, plus the mask
            pair = np.where(coef_bits != 0, (coef_bits << 32) | ids[:, None, :], -1)  # (n, v, v)
            if readout_only:
                pair = pair[:, v - 1:, :]
            k = pair.shape[1]
            keys = np.concatenate([np.sort(pair, axis=2).reshape(n * k, v),
                                   valid[:, v - k:].reshape(n * k, 1).astype(np.int64)], axis=1)
            first, new_ids = _unique_rows(keys)
            cell, vert = np.divmod(first, k)
            vert = vert + (v - k)
            # each representative's neighbourhood (a handful of states of the layer below) as CSR
            coef = norm[cell, vert] * valid[cell, vert][:, None]  # padding vertices: all-zero states
            row, j = np.nonzero(coef)
            csr = (np.searchsorted(row, np.arange(len(first) + 1)).astype(np.int64), ids[cell[row], j].astype(np.int64),
                   coef[row, j].astype(np.float32), z, self._biases_np[layer], valid[cell, vert])
            ids = new_ids.reshape(n, k)
            if layer == last:
                s = np.empty(len(first))
                _aggregate_readout(*csr, self._head_w_np, s)  # readout per state (it is linear)
                break
            z = self._aggregate_matmul(csr, len(first), layer + 1, mm_dtype, ws)
        return self._pool(s[ids], valid)

    def _aggregate_matmul(self, csr: tuple, states: int, layer: int, mm_dtype: torch.dtype, ws: dict) -> np.ndarray:
        """``z = H W[layer]`` for the ``states`` new states ``H`` that ``csr`` aggregates, a block of
        rows at a time: the block of ``H`` stays in cache between its aggregation and its product,
        and the whole ``H`` is never stored. Columns of the block that are zero in every row (ReLU
        units dead for all these states: a third of them in trained 4×600 models) are left out of
        the product, with the matching rows of ``W``: the same sum without its zero terms."""
        if mm_dtype != torch.float32:
            return self._aggregate_matmul_lowp(csr, states, layer, mm_dtype)
        w = self._weights_np[layer]
        z = _buffer(ws, f"z{layer % 2}", states, w.shape[1])  # layer l reads the other one
        rows = _ROWS * torch.get_num_threads()
        buf = _buffer(ws, "block", min(rows, states), csr[3].shape[1])
        live = np.empty(buf.shape[1], np.uint8)
        for lo in range(0, states, rows):
            m = min(rows, states - lo)
            _aggregate(*csr, lo, buf[:m])
            _live_columns(buf[:m], live)
            keep = np.flatnonzero(live)
            if len(keep) > 0.9 * len(live):
                np.matmul(buf[:m], w, out=z[lo:lo + m])
                continue
            packed = _buffer(ws, "packed", m, len(keep))
            _take_columns(buf[:m], keep, packed)
            np.matmul(packed, w[keep], out=z[lo:lo + m])
        return z

    def _aggregate_matmul_lowp(self, csr: tuple, states: int, layer: int, mm_dtype: torch.dtype) -> np.ndarray:
        """:meth:`_aggregate_matmul` with the products in ``mm_dtype`` (bfloat16), all columns."""
        w = self.weights[layer]
        z = torch.empty((states, w.shape[1]), dtype=torch.float32)
        rows = _ROWS * torch.get_num_threads()
        buf = np.empty((min(rows, states), csr[3].shape[1]), np.float32)
        tbuf = torch.from_numpy(buf)
        for lo in range(0, states, rows):
            m = min(rows, states - lo)
            _aggregate(*csr, lo, buf[:m])
            self._matmul(tbuf[:m], w, mm_dtype, out=z[lo:lo + m])
        return z.numpy()

    def _direct(self, x: np.ndarray, norm: np.ndarray, valid: np.ndarray, mm_dtype: torch.dtype) -> np.ndarray:
        """Plain dense layers, for a few cells (state sharing does not pay for its bookkeeping): one
        product and one small compiled kernel per layer (fewer calls than torch's bmm/add/relu/mul)."""
        n, v, f = x.shape
        h = torch.from_numpy(np.ascontiguousarray(x, np.float32).reshape(n * v, f))
        maskf = valid.astype(np.float32)
        last = len(self.weights) - 1
        for layer, (w, b) in enumerate(zip(self.weights, self._biases_np)):
            z = self._matmul(h, w, mm_dtype).numpy().reshape(n, v, -1)
            if layer == last:
                s = np.empty((n, v))
                _small_layer_readout(norm, z, b, maskf, self._head_w_np, s)
                break
            out = np.empty_like(z)
            _small_layer(norm, z, b, maskf, out)
            h = torch.from_numpy(out.reshape(n * v, -1))
        return self._pool(s, valid)

    def _pool(self, s: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """The network output from each vertex's readout ``s`` (N, k): the global node's (the last
        vertex), or the mean over the cell's vertices, plus the head's bias."""
        if self.global_node:
            return s[:, -1] + self.head_b
        return np.where(valid, s, 0.0).sum(axis=1) / np.maximum(valid.sum(axis=1), 1) + self.head_b

    def _matmul(self, h: torch.Tensor, w: torch.Tensor, dtype: torch.dtype,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """``h @ w`` (into ``out`` when given); in ``dtype`` for the wide products only (inputs of more
        than 64 features), float32 for the narrow first layer."""
        if dtype == torch.float32 or h.shape[-1] <= 64:
            return torch.matmul(h, w, out=out)
        key = (id(w), dtype)
        if key not in self._lowp:  # convert each weight matrix once, not per call
            self._lowp[key] = w.to(dtype)
        z = (h.to(dtype) @ self._lowp[key]).float()
        if out is None:
            return z
        out.copy_(z)
        return out
