"""CPU executions of the non-convolution ops: NumPy with ``out=`` into planned buffers, numba for
pooling (:mod:`.pooling`) and the LSTM recurrence."""

from __future__ import annotations

import math

import numba
import numpy as np

from leti.engine.backends.base import Execution, OpContext, executions_of
from leti.engine.backends.cpu import native
from leti.engine.backends.cpu import kernels as K
from leti.engine.backends.cpu.conv import _bias_act, gemm_runner, gemv_execution
from leti.engine.backends.cpu.pooling import pool2d, pool_direct
from leti.engine.ops.batch_norm import scale_shift
from leti.engine.ops.pool import window
from leti.engine.ops.slice import bounds

EXECUTIONS = executions_of("cpu")


def _act_inplace(y: np.ndarray, act: str) -> None:
    if act == "relu":
        np.maximum(y, 0, out=y)
    elif act == "relu6":
        np.clip(y, 0, 6, out=y)


@EXECUTIONS.register("fully_connected")
def fully_connected(ctx: OpContext, be):
    w = ctx.constants.get(1)
    if w is None:
        return None
    k, n = w.shape
    b, has_bias, act = _bias_act(ctx, n)
    rows = int(np.prod(ctx.in_shapes[0])) // k
    if rows == 1:  # batch 1: a matrix-vector product
        return gemv_execution(w, b, has_bias, act)
    gemm = gemm_runner(np.asarray(w, dtype=np.float32), b, has_bias, act)

    def run(ins, outs, scratch):
        gemm(ins[0].reshape(rows, k), outs[0].reshape(rows, n))

    def records(ins, outs, scratch):
        return gemm.records(ins[0].reshape(rows, k), outs[0].reshape(rows, n))

    return Execution(run, native=records if hasattr(gemm, "records") else None)


def _pool(is_max: bool):
    def factory(ctx: OpContext, be):
        (kh, kw), (sh, sw), pads, (oh, ow) = window(ctx.in_shapes[0], ctx.attrs)
        act = K.ACT_CODE[ctx.attrs.get("activation", "none")]
        nb, h, w, c = ctx.in_shapes[0]
        def records(ins, outs, scratch):
            return native.pool2d(ins[0], outs[0], kh, kw, sh, sw, pads[0], pads[2], is_max, act)

        if is_max or sw == 1:  # the separable kernel (pooling.py); strided averages stay per pixel (faster there)

            def run_separable(ins, outs, scratch):
                pool2d(ins[0].reshape(nb, h * w * c), outs[0].reshape(nb, oh, ow * c), h, w, c, kh, kw, sh, sw,
                       pads[0], pads[2], is_max, act, numba.get_num_threads())

            return Execution(run_separable, native=records)

        def run(ins, outs, scratch):
            pool_direct(ins[0], outs[0], kh, kw, sh, sw, pads[0], pads[2], is_max, act)

        return Execution(run, native=records)

    return factory


def _broadcast(in_shapes, out_shape):
    """How a sum or product of two inputs reads them in a program (:func:`native.binary`): ``(full, mode, bstride)``
    with ``full`` the input of the output's shape and the other one of the same shape (mode 0), a channel vector per
    image or for all (1) or a scalar (2); None for any other broadcast."""
    out = tuple(out_shape)
    shapes = [tuple(s) for s in in_shapes]
    if len(shapes) != 2 or len(out) < 1:
        return None
    for full in (0, 1):
        if shapes[full] != out:
            continue
        other = shapes[1 - full]
        if other == out:
            return full, 0, 0
        if math.prod(other) == 1:
            return full, 2, 0
        o = (1,) * (len(out) - len(other)) + other
        if len(o) != len(out) or o[-1] != out[-1] or any(d != 1 for d in o[1:-1]) or o[0] not in (1, out[0]):
            return None
        return full, 1, 0 if o[0] == 1 else out[-1]
    return None


def _f32_constants(ctx: OpContext) -> dict[int, np.ndarray]:
    """The op's constant inputs as C-contiguous float32 copies of its own (what a program's record points at; not
    views of the model file, whose pages the session releases)."""
    return {i: np.array(v, np.float32) for i, v in ctx.constants.items()}


def _binary(ufunc):
    def factory(ctx: OpContext, be):
        act = ctx.attrs.get("activation", "none")

        def run(ins, outs, scratch):
            ufunc(ins[0], ins[1], out=outs[0])
            _act_inplace(outs[0], act)

        how = _broadcast(ctx.in_shapes, ctx.out_shapes[0]) if act in K.ACT_CODE else None
        if how is None or ufunc not in (np.add, np.multiply):
            return Execution(run)
        full, mode, bstride = how
        consts = _f32_constants(ctx)
        code = K.ACT_CODE[act]

        def records(ins, outs, scratch):
            a, b = consts.get(full, ins[full]), consts.get(1 - full, ins[1 - full])
            return native.binary(a, b, outs[0], None, mode, ufunc is np.multiply, code, bstride)

        return Execution(run, native=records)

    return factory


@EXECUTIONS.register("add_n")
def add_n(ctx: OpContext, be):
    act = ctx.attrs.get("activation", "none")

    def run(ins, outs, scratch):
        y = outs[0]
        if len(ins) == 1:
            np.copyto(y, ins[0])
        else:
            np.add(ins[0], ins[1], out=y)
            for x in ins[2:]:
                np.add(y, x, out=y)
        _act_inplace(y, act)

    def records(ins, outs, scratch):  # the sums in NumPy's order, the activation with the last
        y, last = outs[0], len(ins) - 1
        return [r for i in range(1, len(ins))
                for r in native.add(ins[0] if i == 1 else y, ins[i], y, K.ACT_CODE[act] if i == last else 0)]

    same = all(tuple(s) == tuple(ctx.out_shapes[0]) for s in ctx.in_shapes) and not ctx.constants
    return Execution(run, native=records if same and len(ctx.in_shapes) > 1 and act in K.ACT_CODE else None)


@EXECUTIONS.register("concat")
def concat(ctx: OpContext, be):
    axis = int(ctx.attrs.get("axis", -1)) % len(ctx.out_shapes[0])
    act = ctx.attrs.get("activation", "none")
    spans, pos = [], 0
    for s in ctx.in_shapes:
        spans.append((slice(None),) * axis + (slice(pos, pos + s[axis]),))
        pos += s[axis]

    def run(ins, outs, scratch):
        for x, idx in zip(ins, spans):
            np.copyto(outs[0][idx], x)
        _act_inplace(outs[0], act)

    def records(ins, outs, scratch):
        out = native.concat_channels(ins, outs[0])
        return out + native.unary(outs[0], outs[0], act) if act not in ("none", None) else out

    last = axis == len(ctx.out_shapes[0]) - 1 and act in K.ACT_CODE
    return Execution(run, native=records if last else None)


@EXECUTIONS.register("slice")
def slice_(ctx: OpContext, be):
    span = bounds(ctx.in_shapes[0], ctx.attrs)
    idx = tuple(slice(b, e) for b, e in span)

    def records(ins, outs, scratch):
        return native.slice_channels(ins[0], outs[0], span[-1][0])

    channels = bool(span) and all((b, e) == (0, d) for (b, e), d in zip(span[:-1], ctx.in_shapes[0]))
    return Execution(lambda ins, outs, scratch: np.copyto(outs[0], ins[0][idx]),
                     native=records if channels and 0 not in ctx.constants else None)


@EXECUTIONS.register("mean")
def mean(ctx: OpContext, be):
    from leti.engine.ops.mean import _axes

    shape = ctx.in_shapes[0]
    axes = tuple(_axes(shape, ctx.attrs))
    keep = bool(ctx.attrs.get("keepdims", False))
    if len(shape) == 4 and axes == (1, 2):  # global average pooling of an NHWC map
        nb, h, w, c = shape

        def run_spatial(ins, outs, scratch):
            K.spatial_mean(ins[0].reshape(nb, h * w, c), outs[0].reshape(nb, c))

        def records(ins, outs, scratch):
            return native.spatial_mean(ins[0].reshape(nb, h * w, c), outs[0].reshape(nb, c))

        return Execution(run_spatial, native=records)

    def run(ins, outs, scratch):
        np.mean(ins[0], axis=axes, keepdims=keep, out=outs[0])

    return Execution(run)


@EXECUTIONS.register("reshape")
def reshape(ctx: OpContext, be):
    return Execution(lambda ins, outs, scratch: None, alias=True)


@EXECUTIONS.register("pad")
def pad(ctx: OpContext, be):
    pads = [tuple(p) for p in ctx.attrs["pads"]]
    value = float(ctx.attrs.get("value", 0.0))
    inner = tuple(slice(a, a + d) for (a, _), d in zip(pads, ctx.in_shapes[0]))

    def run(ins, outs, scratch):
        outs[0].fill(value)
        np.copyto(outs[0][inner], ins[0])

    def records(ins, outs, scratch):
        return native.pad_nhwc(ins[0], outs[0], pads[1][0], pads[2][0])

    spatial = (len(pads) == 4 and pads[0] == (0, 0) and pads[3] == (0, 0) and value == 0.0
               and all(a >= 0 and b >= 0 for a, b in pads))  # zeros around an NHWC map: the program's copy
    return Execution(run, native=records if spatial else None)


@EXECUTIONS.register("softmax")
def softmax(ctx: OpContext, be):
    beta = np.float32(ctx.attrs.get("beta", 1.0))

    c = ctx.in_shapes[0][-1] if ctx.in_shapes[0] else 1

    def run(ins, outs, scratch):
        K.softmax_rows(ins[0].reshape(-1, c), beta, outs[0].reshape(-1, c))

    def records(ins, outs, scratch):
        return native.softmax_rows(ins[0].reshape(-1, c), beta, outs[0].reshape(-1, c))

    return Execution(run, native=records)


@EXECUTIONS.register("relu")
def relu(ctx: OpContext, be):
    return Execution(lambda ins, outs, scratch: np.maximum(ins[0], 0, out=outs[0]),
                     native=lambda ins, outs, scratch: native.unary(ins[0], outs[0], "relu"))


@EXECUTIONS.register("relu6")
def relu6(ctx: OpContext, be):
    return Execution(lambda ins, outs, scratch: np.clip(ins[0], 0, 6, out=outs[0]),
                     native=lambda ins, outs, scratch: native.unary(ins[0], outs[0], "relu6"))


@EXECUTIONS.register("batch_norm")
def batch_norm(ctx: OpContext, be):
    if any(i not in ctx.constants for i in range(1, 5)):
        return None
    scale, shift = scale_shift(*(ctx.constants[i] for i in range(1, 5)), float(ctx.attrs.get("epsilon", 1e-3)))
    scale, shift = scale.astype(np.float32), shift.astype(np.float32)

    def run(ins, outs, scratch):
        np.multiply(ins[0], scale, out=outs[0])
        outs[0] += shift

    def records(ins, outs, scratch):  # the product, then the shift, rounded after each as above
        return native.binary(ins[0], scale, outs[0], shift, 1, True, 0)

    per_channel = len(ctx.in_shapes[0]) >= 1 and scale.shape == (ctx.in_shapes[0][-1],) == shift.shape
    return Execution(run, native=records if per_channel else None)


@EXECUTIONS.register("lstm")
def lstm(ctx: OpContext, be):
    if any(i not in ctx.constants for i in (1, 2, 3)):
        return None
    w = np.ascontiguousarray(ctx.constants[1], dtype=np.float32)
    rt = np.ascontiguousarray(ctx.constants[2].T, dtype=np.float32)
    b = np.ascontiguousarray(ctx.constants[3], dtype=np.float32)
    n, t, i_dim = ctx.in_shapes[0]
    hd = rt.shape[1]
    seqs = bool(ctx.attrs.get("return_sequences", True))
    f4 = 4

    def run(ins, outs, scratch):
        gx = scratch[0].view(np.float32).reshape(n, t, 4 * hd)
        g2 = gx.reshape(n * t, 4 * hd)
        np.matmul(ins[0].reshape(n * t, i_dim), w, out=g2)  # input projections of all steps: one GEMM
        g2 += b
        h = scratch[1].view(np.float32).reshape(n, hd)
        c = scratch[2].view(np.float32).reshape(n, hd)
        h.fill(0.0)
        c.fill(0.0)
        seq = outs[0] if seqs else scratch[3].view(np.float32).reshape(n, t, hd)
        K.lstm_recurrence(gx, rt, seq, h, c)
        if not seqs:
            np.copyto(outs[0], h)

    scratch = (n * t * 4 * hd * f4, n * hd * f4, n * hd * f4) + (() if seqs else (n * t * hd * f4,))
    return Execution(run, scratch=scratch)


EXECUTIONS.register("max_pool2d")(_pool(True))
EXECUTIONS.register("avg_pool2d")(_pool(False))
EXECUTIONS.register("add")(_binary(np.add))
EXECUTIONS.register("mul")(_binary(np.multiply))
