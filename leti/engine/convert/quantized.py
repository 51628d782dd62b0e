"""Quantized ``.tflite`` models, as the engine sees them: refused, naming what is quantized.

The engine has float32 kernels only (int8 kernels are a later issue), so :func:`refuse_quantized` stops a
conversion with one line naming the quantized (or float16) tensors and the ops that use them, instead of
failing on the first such tensor; :func:`quantized_tensors` is the scan (also used by
:mod:`leti.models.quantize`).
"""

from __future__ import annotations

from leti.errors import ConversionError


#: TensorType names the engine has no kernels for (besides any tensor with a quantization scale)
QUANTIZED_TYPES = ("INT8", "UINT8", "INT16", "FLOAT16")


def tensor_type_names() -> dict[int, str]:
    """TFLite's TensorType codes -> names (``FLOAT32``, ``INT8``, ...)."""
    from ai_edge_litert import schema_py_generated as s

    return {v: k for k, v in vars(s.TensorType).items() if not k.startswith("_")}


def is_quantized(tensor, types: dict[int, str] | None = None) -> bool:
    """A flatbuffer ``Tensor`` with a quantization scale or of a :data:`QUANTIZED_TYPES` type."""
    q = tensor.Quantization()
    if q is not None and q.ScaleLength() > 0:
        return True
    return (types or tensor_type_names()).get(tensor.Type()) in QUANTIZED_TYPES


def quantized_tensors(buf: bytes) -> list[tuple[str, str, str]]:
    """(tensor name, type, first op using it) of every quantized (scale set) or int8/uint8/int16/float16 tensor."""
    from ai_edge_litert import schema_py_generated as s

    types = tensor_type_names()
    builtin = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    model = s.Model.GetRootAs(buf, 0)
    found = []
    for g in (model.Subgraphs(i) for i in range(model.SubgraphsLength())):
        hits = []
        for i in range(g.TensorsLength()):
            t = g.Tensors(i)
            if is_quantized(t, types):
                hits.append((i, (t.Name() or b"").decode("utf-8", "replace"), types.get(t.Type(), str(t.Type()))))
        if not hits:  # a float model (every call of an any-model prediction): the operators are not walked
            continue
        user: dict[int, str] = {}
        for op in (g.Operators(k) for k in range(g.OperatorsLength())):
            code = model.OperatorCodes(op.OpcodeIndex())
            name = builtin.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM")
            for i in [*(op.InputsAsNumpy() if op.InputsLength() else []),
                      *(op.OutputsAsNumpy() if op.OutputsLength() else [])]:
                user.setdefault(int(i), name)
        found += [(name, kind, user.get(i, "-")) for i, name, kind in hits]
    return found


def refuse_quantized(buf: bytes, name: str) -> None:
    """The engine has no int8/fp16 kernels yet: one line naming the quantized tensors and their ops."""
    found = quantized_tensors(buf)
    if found:
        ops = ", ".join(dict.fromkeys(op for _, _, op in found))
        kinds = "/".join(dict.fromkeys(kind for _, kind, _ in found))
        shown = ", ".join(f"{t!r} ({k})" for t, k, _ in found[:3]) + (", ..." if len(found) > 3 else "")
        raise ConversionError(f"{name}: a quantized model ({len(found)} {kinds} tensors: {shown}; ops {ops}); "
                              "the engine runs float32 models only until it has int8 kernels: convert the "
                              "fp32 .tflite instead")
