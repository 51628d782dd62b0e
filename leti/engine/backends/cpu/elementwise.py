"""CPU executions of the activations, element-wise math, transpose, upsampling and grouped convolution that
imported models bring (:mod:`leti.engine.ops.nonlinear`, ``binary``, ``unary_math``,
``transpose``, ``grouped_conv2d``): NumPy with ``out=`` into the planned buffers; a grouped
convolution runs LETI's grouped window kernel (every group of an output row in one C call), or, without
the C kernels or for a dilated window, the CPU ``conv2d`` execution of each group on a contiguous channel
slice."""

from __future__ import annotations

import math

import numba
import numpy as np

from leti.engine.backends.base import Execution, OpContext, executions_of
from leti.engine.backends.cpu import ckernels, native
from leti.engine.backends.cpu import gemm as G
from leti.engine.backends.cpu import kernels as K
from leti.engine.graph import Node
from leti.engine.ops import get
from leti.engine.ops.conv2d import geometry
from leti.engine.ops.grouped_conv2d import groups_of
from leti.engine.ops.transpose import perm_of
from leti.engine.schedule import ScheduleOptions

EXECUTIONS = executions_of("cpu")
_NO_RESIDUAL = np.zeros((1, 1), np.float32)


def _unary(name, body):
    def factory(ctx: OpContext, be):
        attrs = ctx.attrs
        alpha, beta = float(attrs.get("alpha", 1 / 6)), float(attrs.get("beta", 0.5))
        records = None
        if name in native.UNARY_CODE:  # the activations real networks put between convolutions: a program's loop

            def records(ins, outs, scratch):
                return native.unary(ins[0], outs[0], name, alpha, beta)

        return Execution(lambda ins, outs, scratch: body(ins[0], outs[0], attrs), native=records)

    return factory


def _sigmoid(x, y, attrs):
    np.negative(x, out=y)
    np.exp(y, out=y)
    y += 1.0
    np.reciprocal(y, out=y)


def _hard_sigmoid(x, y, attrs):
    np.multiply(x, np.float32(attrs.get("alpha", 1 / 6)), out=y)
    y += np.float32(attrs.get("beta", 0.5))
    np.clip(y, 0.0, 1.0, out=y)


def _hard_swish(x, y, attrs):
    t = x + np.float32(3.0)  # a temporary: y may alias x
    np.clip(t, 0.0, 6.0, out=t)
    t *= np.float32(1 / 6)
    np.multiply(x, t, out=y)


def _gelu(x, y, attrs):
    if attrs.get("approximate", False):
        t = x * x * x
        t *= np.float32(0.044715)
        t += x
        t *= np.float32(math.sqrt(2 / math.pi))
        np.tanh(t, out=t)
    else:
        from scipy.special import erf

        t = erf(x * np.float32(1 / math.sqrt(2.0)))
    t += 1.0
    t *= 0.5
    np.multiply(x, t, out=y)


def _rsqrt(x, y, attrs):
    # a negative input gives NaN and zero gives inf, as TFLite's kernels do: silently (NumPy would warn)
    with np.errstate(invalid="ignore", divide="ignore"):
        np.sqrt(x, out=y)
        np.reciprocal(y, out=y)


def _sqrt(x, y, attrs):
    with np.errstate(invalid="ignore"):
        np.sqrt(x, out=y)


UNARY = {"sigmoid": _sigmoid, "hard_sigmoid": _hard_sigmoid, "hard_swish": _hard_swish, "gelu": _gelu,
         "tanh": lambda x, y, a: np.tanh(x, out=y), "rsqrt": _rsqrt, "sqrt": _sqrt,
         "neg": lambda x, y, a: np.negative(x, out=y), "exp": lambda x, y, a: np.exp(x, out=y),
         "abs": lambda x, y, a: np.abs(x, out=y)}
for _name, _body in UNARY.items():
    EXECUTIONS.register(_name)(_unary(_name, _body))


def _squared_difference(a, b, out):
    np.subtract(a, b, out=out)
    np.square(out, out=out)


BINARY = {"sub": np.subtract, "div": np.divide, "maximum": np.maximum, "minimum": np.minimum,
          "squared_difference": _squared_difference}


def _binary(fn):
    def factory(ctx: OpContext, be):
        return Execution(lambda ins, outs, scratch: fn(ins[0], ins[1], out=outs[0]))

    return factory


for _name, _fn in BINARY.items():
    EXECUTIONS.register(_name)(_binary(_fn))


@EXECUTIONS.register("transpose")
def transpose(ctx: OpContext, be):
    """A swap of the last two axes (the channel shuffle: (…, groups, c/groups) → (…, c/groups, groups)) by a
    numba loop over 3-D views; any other permutation by NumPy's copy."""
    shape = tuple(ctx.in_shapes[0])
    perm = perm_of(shape, ctx.attrs)

    def run_numpy(ins, outs, scratch):
        np.copyto(outs[0], ins[0].transpose(perm))

    k = len(shape) - 2
    if k < 0 or perm != [*range(k), k + 1, k]:
        return Execution(run_numpy)
    lead = int(np.prod(shape[:k], dtype=np.int64))
    p, q = shape[k], shape[k + 1]

    def run_swap(ins, outs, scratch):
        if outs[0].flags.c_contiguous:  # a planned buffer; a strided view (never planned so) is copied into
            K.swap_last_two(ins[0].reshape(lead, p, q), outs[0].reshape(lead, q, p))
        else:
            run_numpy(ins, outs, scratch)

    def records(ins, outs, scratch):
        return native.swap_last_two(ins[0].reshape(lead, p, q), outs[0].reshape(lead, q, p))

    return Execution(run_swap, native=records if 0 not in ctx.constants else None)


@EXECUTIONS.register("resize_nearest")
def resize_nearest(ctx: OpContext, be):
    from leti.engine.ops.resize_nearest import factors

    fh, fw = factors(ctx.attrs)
    n, h, w, c = ctx.in_shapes[0]

    def run(ins, outs, scratch):  # a broadcast copy into the (n, h, fh, w, fw, c) view of the output
        np.copyto(outs[0].reshape(n, h, fh, w, fw, c), ins[0].reshape(n, h, 1, w, 1, c))

    return Execution(run)


@EXECUTIONS.register("grouped_conv2d")
def grouped_conv2d(ctx: OpContext, be):
    from leti.engine.backends.cpu.conv import conv2d

    w = ctx.constants.get(1)
    if w is None:
        return None
    x_shape = tuple(ctx.in_shapes[0])
    g = groups_of(x_shape, w.shape, ctx.attrs)
    ci, co = w.shape[2], w.shape[3] // g
    bias = ctx.constants.get(2)
    fast = _grouped_window(ctx, w, bias, g, ci, co)
    if fast is not None:
        return fast
    attrs = {k: v for k, v in ctx.attrs.items() if k != "groups"}
    sub_in = x_shape[:3] + (ci,)
    sub_out = tuple(ctx.out_shapes[0][:3]) + (co,)
    spec = get("conv2d")
    parts = []
    for k in range(g):
        consts = {1: np.ascontiguousarray(w[..., k * co:(k + 1) * co])}
        shapes = [sub_in, consts[1].shape]
        if bias is not None:
            consts[2] = np.ascontiguousarray(bias[k * co:(k + 1) * co])
            shapes.append(consts[2].shape)
        node = Node(op="conv2d", inputs=[], outputs=[], name=f"{ctx.node.name}/g{k}", attrs=attrs)
        sub = OpContext(node, shapes, [sub_out], consts, spec.scheme(shapes, attrs, ScheduleOptions()),
                        ["float32"] * len(shapes))
        ex = conv2d(sub, be)
        if ex is None:
            return None
        parts.append(ex)
    in_bytes, out_bytes = 4 * math.prod(sub_in), 4 * math.prod(sub_out)
    inner = max((sum(p.scratch) for p in parts), default=0)
    offsets = [0]
    for p in parts[0].scratch:
        offsets.append(offsets[-1] + p)

    def run(ins, outs, scratch):
        xs = scratch[0].view(np.float32)[: math.prod(sub_in)].reshape(sub_in)
        ys = scratch[1].view(np.float32)[: math.prod(sub_out)].reshape(sub_out)
        inner_bufs = [scratch[2][offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
        for k, ex in enumerate(parts):
            np.copyto(xs, ins[0][..., k * ci:(k + 1) * ci])
            ex.run([xs], [ys], inner_bufs)
            np.copyto(outs[0][..., k * co:(k + 1) * co], ys)

    return Execution(run, scratch=(in_bytes, out_bytes, max(inner, 1)))


def _grouped_window(ctx: OpContext, w, bias, g: int, ci: int, co: int) -> Execution | None:
    """Every group in one C call per output row (``leti_conv_window`` with ``groups``): no per-group copies or Python
    steps. RegNetX-200MF's 3×3 convolutions over groups of 8 channels ran 2-5× faster than the loop over
    groups below it, which remains for dilated windows and hosts without LETI's C kernels."""
    pads, (oh, ow), (sh, sw), (dh, dw) = geometry(ctx.in_shapes[0], w.shape, ctx.attrs)
    if ckernels.library() is None or (dh, dw) != (1, 1) or len(ctx.in_shapes) > 3:
        return None
    kh, kw = w.shape[:2]
    stack = np.asarray(w, np.float32).reshape(kh * kw * ci, g, co).transpose(1, 0, 2)  # (g, k, co)
    bp = ckernels.pack(stack)
    has_bias = bias is not None
    bpad = (np.stack([ckernels.pad_bias(bias[k * co:(k + 1) * co], co) for k in range(g)]) if has_bias
            else np.zeros(1, np.float32))
    act = K.ACT_CODE[ctx.attrs.get("activation", "none")]
    pt, pl = pads[0], pads[2]
    hp, wp = G.padded_shape(ctx.in_shapes[0], oh, ow, kh, kw, sh, sw, pt, pl)
    c = g * ci

    def run(ins, outs, scratch):
        xp = G.padded_view(scratch, hp, wp, c)
        G.conv_window_leti(ins[0], xp, bp, outs[0], bpad, has_bias, _NO_RESIDUAL, False, g, kh, kw, sh, sw, pt, pl, act,
                           numba.get_num_threads())

    def records(ins, outs, scratch):
        return native.conv_window(ins[0], G.padded_view(scratch, hp, wp, c), bp, outs[0], bpad, has_bias, None, g,
                                  kh, kw, sh, sw, pt, pl, act)

    return Execution(run, scratch=(hp * wp * c * 4,), native=records)
