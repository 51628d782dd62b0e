"""``.tflite`` flatbuffer → engine :class:`Graph`.

The flatbuffer is read with the schema classes generated from TFLite's ``schema.fbs`` that ship
with ``ai_edge_litert`` (light to import: no TensorFlow). Each TFLite builtin op has a small
translator in :data:`TRANSLATORS` (``@translates("CONV_2D", "conv2d")``, naming the engine
ops it emits); an op without one raises :class:`ConversionError` naming it and
listing the supported ones. Only float32 models are accepted (quantized tensors are refused).

Layout changes done here, once: conv weights OHWI → HWIO, depthwise ``(1, kh, kw, C·M)`` →
``(kh, kw, C·M)``, fully-connected ``(out, in)`` → ``(in, out)``; LSTM gate matrices are stacked
into ``(I, 4H)`` / ``(H, 4H)`` in the order i, f, g, o.
"""


from __future__ import annotations

import os

import numpy as np

from leti.engine.convert.tflite_base import _DTYPES, TRANSLATORS, _Ctx, _padding, _schema, translates
from leti.engine.graph import Graph
from leti.errors import ConversionError, CorruptModelError


@translates("CONV_2D", "conv2d", "grouped_conv2d")
def _conv(c: _Ctx):
    o = c.options("Conv2DOptions")
    ins = c.ins()
    w = c.need_const(ins[1], "conv weights")
    bias = [c.names[ins[2]]] if len(ins) > 2 and ins[2] >= 0 else []
    cin = c.shape(ins[0])[3]
    if w.shape[3] != cin:
        from leti.engine.convert.tflite_extra import grouped_conv

        return grouped_conv(c, o, w, cin, bias)
    inputs = [c.names[ins[0]], c.new_const(c.names[ins[1]] + "/hwio", w.transpose(1, 2, 3, 0))] + bias
    c.add("conv2d", inputs, strides=[o.StrideH(), o.StrideW()], dilations=[o.DilationHFactor(), o.DilationWFactor()],
          padding=_padding(o.Padding()), activation=c.act(o.FusedActivationFunction()))


@translates("DEPTHWISE_CONV_2D", "depthwise_conv2d")
def _depthwise(c: _Ctx):
    o = c.options("DepthwiseConv2DOptions")
    ins = c.ins()
    w = c.need_const(ins[1], "depthwise weights")
    cin = c.shape(ins[0])[3]
    inputs = [c.names[ins[0]], c.new_const(c.names[ins[1]] + "/hwc", w.reshape(w.shape[1:]))]
    if len(ins) > 2 and ins[2] >= 0:
        inputs.append(c.names[ins[2]])
    c.add("depthwise_conv2d", inputs, multiplier=w.shape[3] // cin, strides=[o.StrideH(), o.StrideW()],
          dilations=[o.DilationHFactor(), o.DilationWFactor()], padding=_padding(o.Padding()),
          activation=c.act(o.FusedActivationFunction()))


@translates("FULLY_CONNECTED", "reshape", "fully_connected")
def _fully_connected(c: _Ctx):
    o = c.options("FullyConnectedOptions")
    ins = c.ins()
    w = c.need_const(ins[1], "fully-connected weights")
    x = c.names[ins[0]]
    xs = c.shape(ins[0])
    if len(xs) != 2 and not o.KeepNumDims():
        flat = f"{x}/flat"
        c.g.add_tensor(flat, (int(np.prod(xs)) // w.shape[1], w.shape[1]))
        c.g.add_node("reshape", [x], [flat], shape=[-1, int(w.shape[1])])
        x = flat
    inputs = [x, c.new_const(c.names[ins[1]] + "/io", w.T)]
    if len(ins) > 2 and ins[2] >= 0:
        inputs.append(c.names[ins[2]])
    c.add("fully_connected", inputs, activation=c.act(o.FusedActivationFunction()))


def _pool(kind: str):
    def tr(c: _Ctx):
        o = c.options("Pool2DOptions")
        c.add(kind, [c.names[c.ins()[0]]], kernel=[o.FilterHeight(), o.FilterWidth()],
              strides=[o.StrideH(), o.StrideW()], padding=_padding(o.Padding()),
              activation=c.act(o.FusedActivationFunction()))

    return tr


def _binary(kind: str, opts: str):
    def tr(c: _Ctx):
        o = c.options(opts)
        c.add(kind, [c.names[i] for i in c.ins()], activation=c.act(o.FusedActivationFunction()))

    return tr


@translates("CONCATENATION", "concat")
def _concat(c: _Ctx):
    o = c.options("ConcatenationOptions")
    c.add("concat", [c.names[i] for i in c.ins()], axis=o.Axis(), activation=c.act(o.FusedActivationFunction()))


@translates("SQUEEZE", "reshape")
@translates("RESHAPE", "reshape")
def _reshape(c: _Ctx):
    ins = c.ins()
    target = c.const(ins[1]) if len(ins) > 1 and c.op.OpcodeIndex() >= 0 else None
    if target is not None and target.ndim == 1 and target.size:  # a shape computed at conversion time
        shape = [int(v) for v in target]
    else:
        shape = list(c.shape(c.outs()[0]))
    c.add("reshape", [c.names[ins[0]]], shape=shape)


@translates("MEAN", "mean")
def _mean(c: _Ctx):
    o = c.options("ReducerOptions")
    ins = c.ins()
    axes = c.need_const(ins[1], "mean axes").reshape(-1)
    c.add("mean", [c.names[ins[0]]], axes=[int(a) for a in axes], keepdims=bool(o.KeepDims()))


@translates("PADV2", "pad")
@translates("PAD", "pad")
def _pad(c: _Ctx):
    ins = c.ins()
    pads = c.need_const(ins[1], "paddings")
    value = 0.0
    if len(ins) > 2:
        value = float(c.need_const(ins[2], "pad value").reshape(-1)[0])
    c.add("pad", [c.names[ins[0]]], pads=[[int(a), int(b)] for a, b in pads], value=value)


@translates("SOFTMAX", "softmax")
def _softmax(c: _Ctx):
    c.add("softmax", [c.names[c.ins()[0]]], beta=float(c.options("SoftmaxOptions").Beta()))


def _unary(kind: str):
    return lambda c: c.add(kind, [c.names[c.ins()[0]]])


@translates("SLICE", "slice")
def _slice(c: _Ctx):
    ins = c.ins()
    begin = c.need_const(ins[1], "slice begin").reshape(-1)
    size = c.need_const(ins[2], "slice size").reshape(-1)
    c.add("slice", [c.names[ins[0]]], begin=[int(v) for v in begin], size=[int(v) for v in size])


@translates("STRIDED_SLICE", "slice")
def _strided_slice(c: _Ctx):
    o = c.options("StridedSliceOptions")
    ins = c.ins()
    begin = c.need_const(ins[1], "strided_slice begin").reshape(-1)
    end = c.need_const(ins[2], "strided_slice end").reshape(-1)
    strides = c.need_const(ins[3], "strided_slice strides").reshape(-1)
    shape = c.shape(ins[0])
    if (strides != 1).any() or o.EllipsisMask() or o.NewAxisMask() or o.ShrinkAxisMask():
        raise ConversionError(f"{c.source}: STRIDED_SLICE is supported only with unit strides and no masks "
                              "other than begin/end")
    b, s = [], []
    for ax, d in enumerate(shape):
        lo = 0 if o.BeginMask() >> ax & 1 else int(begin[ax]) % (d + 1) if begin[ax] < 0 else int(begin[ax])
        hi = d if o.EndMask() >> ax & 1 else (int(end[ax]) + d if end[ax] < 0 else min(int(end[ax]), d))
        b.append(lo)
        s.append(hi - lo)
    c.add("slice", [c.names[ins[0]]], begin=b, size=s)


def _split_into_slices(c: _Ctx, src: int, sizes: list[int], axis: int) -> None:
    """One ``slice`` node per output of a split along ``axis`` (NB101's channel truncation keeps the first
    part of a ``SPLIT_V``; the unused remainder is dropped with the dead nodes)."""
    shape, outs = c.shape(src), c.outs()
    rank = len(shape)
    if not -rank <= axis < rank:
        raise ConversionError(f"{c.source}: split axis {axis} is out of range for rank {rank}")
    axis %= rank
    if sizes.count(-1) == 1:
        sizes[sizes.index(-1)] = shape[axis] - (sum(sizes) + 1)
    if len(sizes) != len(outs) or min(sizes, default=0) < 0 or sum(sizes) != shape[axis]:
        raise ConversionError(f"{c.source}: split sizes {sizes} do not divide a dimension of {shape[axis]} "
                              f"into {len(outs)} outputs")
    start = 0
    for size, o in zip(sizes, outs):
        begin, extent = [0] * rank, [-1] * rank
        begin[axis], extent[axis] = start, size
        name = c.names[o]
        c.g.add_node("slice", [c.names[src]], [name], name=name, begin=begin, size=extent)
        start += size


@translates("SPLIT_V", "slice")
def _split_v(c: _Ctx):
    ins = c.ins()
    sizes = [int(v) for v in c.need_const(ins[1], "SPLIT_V size_splits").reshape(-1)]
    axis = int(c.need_const(ins[2], "SPLIT_V axis").reshape(-1)[0])
    _split_into_slices(c, ins[0], sizes, axis)


@translates("SPLIT", "slice")
def _split(c: _Ctx):
    ins = c.ins()
    axis = int(c.need_const(ins[0], "SPLIT axis").reshape(-1)[0])
    n, shape = len(c.outs()), c.shape(ins[1])
    d = shape[axis % len(shape)] if -len(shape) <= axis < len(shape) else 0
    if n == 0 or d % n:
        raise ConversionError(f"{c.source}: SPLIT of a dimension of {d} into {n} equal parts")
    _split_into_slices(c, ins[1], [d // n] * n, axis)


@translates("UNIDIRECTIONAL_SEQUENCE_LSTM", "lstm")
def _lstm(c: _Ctx):
    o = c.options("UnidirectionalSequenceLSTMOptions")
    ins = c.ins() + [-1] * 24
    if any(ins[i] >= 0 for i in (9, 10, 11, 16, 17, 20, 21, 22, 23)):
        raise ConversionError(f"{c.source}: LSTM with peepholes, projection or layer norm is not supported")
    if o.FusedActivationFunction() != 4 or o.CellClip() or o.ProjClip():  # 4 = TANH
        raise ConversionError(f"{c.source}: only the standard tanh LSTM without clipping is supported")
    if ins[1] < 0:
        raise ConversionError(f"{c.source}: coupled input-forget (CIFG) LSTM is not supported")
    wx = np.concatenate([c.need_const(ins[i], "LSTM weights") for i in (1, 2, 3, 4)], axis=0)  # (4H, I)
    wh = np.concatenate([c.need_const(ins[i], "LSTM weights") for i in (5, 6, 7, 8)], axis=0)  # (4H, H)
    b = np.concatenate([c.need_const(ins[i], "LSTM bias") for i in (12, 13, 14, 15)])
    x = c.names[ins[0]]
    if o.TimeMajor():
        raise ConversionError(f"{c.source}: time-major LSTM is not supported")
    out_shape = c.shape(c.outs()[0])
    base = c.names[c.outs()[0]]
    c.add("lstm", [x, c.new_const(base + "/w", wx.T), c.new_const(base + "/r", wh.T), c.new_const(base + "/b", b)],
          return_sequences=len(out_shape) == 3)


translates("MAX_POOL_2D", "max_pool2d")(_pool("max_pool2d"))
translates("AVERAGE_POOL_2D", "avg_pool2d")(_pool("avg_pool2d"))
translates("ADD", "add")(_binary("add", "AddOptions"))
translates("MUL", "mul")(_binary("mul", "MulOptions"))
translates("ADD_N", "add_n")(lambda c: c.add("add_n", [c.names[i] for i in c.ins()]))
translates("RELU", "relu")(_unary("relu"))
translates("RELU6", "relu6")(_unary("relu6"))


def from_tflite(source: str | os.PathLike | bytes) -> Graph:
    """Convert a float32 ``.tflite`` model (path or bytes) into an engine graph."""
    from leti.engine.convert import map_source

    buf, name = map_source(source)  # a file mapped: its weights become views of it, not copies
    s = _schema()
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise CorruptModelError(f"{name}: not a TFLite flatbuffer (no 'TFL3' identifier)")
    try:
        model = s.Model.GetRootAs(buf, 0)
        if model.SubgraphsLength() < 1:
            raise CorruptModelError(f"{name}: the model has no subgraph")
        if model.SubgraphsLength() > 1:
            raise ConversionError(f"{name}: models with {model.SubgraphsLength()} subgraphs (control flow) "
                                  "are not supported")
        return _convert(model, model.Subgraphs(0), buf, name)
    except (ConversionError, CorruptModelError):
        raise
    except Exception as exc:  # flatbuffers raises struct/index errors on malformed data
        raise CorruptModelError(f"{name}: malformed TFLite flatbuffer ({type(exc).__name__}: {exc})") from None


def _builtin_names() -> dict[int, str]:
    s = _schema()
    return {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}


def _convert(model, sub, buf: bytes, source: str) -> Graph:
    from leti.engine.convert.quantized import is_quantized, refuse_quantized, tensor_type_names

    tensor_types = tensor_type_names()
    g = Graph()
    names: list[str] = []
    for i in range(sub.TensorsLength()):
        t = sub.Tensors(i)
        raw = (t.Name() or b"").decode("utf-8", "replace") or f"tensor{i}"
        name = raw if raw not in g.tensors else f"{raw}#{i}"
        dtype = _DTYPES.get(t.Type())
        if is_quantized(t, tensor_types):
            # no int8/fp16 kernels yet: one line naming every quantized tensor and its op (the whole model is scanned
            # only here, not for every float model: a third of an any-model prediction's import); it raises
            refuse_quantized(buf, source)
        if dtype is None:
            raise ConversionError(f"{source}: tensor {raw!r} is quantized or of unsupported type {t.Type()}; "
                                  "only float models convert")
        shape = tuple(int(v) for v in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        data = None
        b = model.Buffers(t.Buffer())
        if b is not None and b.DataLength() > 0:
            data = b.DataAsNumpy().view(np.dtype(dtype).newbyteorder("<")).reshape(shape)
        elif b is not None and b.Offset() > 1:
            data = np.frombuffer(buf, dtype=np.dtype(dtype).newbyteorder("<"), count=int(np.prod(shape)),
                                 offset=b.Offset()).reshape(shape)
        if data is not None:
            g.add_constant(name, data if data.dtype == np.dtype(dtype) else data.astype(dtype))
        else:
            g.add_tensor(name, shape, dtype)
        names.append(name)
    g.inputs = [names[int(i)] for i in sub.InputsAsNumpy()]
    g.outputs = [names[int(i)] for i in sub.OutputsAsNumpy()]
    from leti.engine.convert.tflite_extra import FOLDERS, fold

    builtin = _builtin_names()
    ctx = _Ctx(model, sub, g, names, source)
    opnames = []
    for k in range(sub.OperatorsLength()):
        code = model.OperatorCodes(sub.Operators(k).OpcodeIndex())
        opnames.append(builtin.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM"))
    missing = sorted({n for n in opnames if n not in TRANSLATORS and n not in FOLDERS and n != "SHAPE"})
    if missing:
        raise ConversionError(f"{source}: unsupported TFLite ops: {', '.join(missing)} (supported: "
                              f"{', '.join(sorted(TRANSLATORS))})")
    for k, opname in enumerate(opnames):
        ctx.op = sub.Operators(k)
        if fold(ctx, opname):
            continue
        if opname not in TRANSLATORS:
            raise ConversionError(f"{source}: TFLite op {opname} is supported only on constant inputs")
        TRANSLATORS.get(opname)(ctx)
    # variable tensors (LSTM states) and unused constants are dropped
    from leti.engine.passes import remove_dead

    g, _ = remove_dead(g)
    g.metadata = {"producer": "leti.engine.convert.from_tflite", "source": os.path.basename(source)}
    g.validate()
    return g



from leti.engine.convert import tflite_extra  # noqa: E402,F401  (its translators join TRANSLATORS)
