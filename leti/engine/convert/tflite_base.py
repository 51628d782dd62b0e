"""What every TFLite translator shares: the reading context (:class:`_Ctx`), the :data:`TRANSLATORS`
registry and its :func:`translates` decorator. ``from_tflite`` and ``tflite_extra`` both register into it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from leti.engine.graph import Graph
from leti.errors import ConversionError
from leti.registry import Registry

_DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 9: "int8"}
_ACT = {0: "none", 1: "relu", 3: "relu6"}


def _schema():
    from ai_edge_litert import schema_py_generated as s

    return s


class _Ctx:
    def __init__(self, model, sub, graph: Graph, names: list[str], source: str):
        self.s = _schema()
        self.model, self.sub, self.g, self.names, self.source = model, sub, graph, names, source

    def tensor(self, i: int):
        return self.sub.Tensors(i)

    def shape(self, i: int) -> tuple[int, ...]:
        t = self.tensor(i)
        return tuple(int(v) for v in t.ShapeAsNumpy()) if t.ShapeLength() else ()

    def const(self, i: int) -> np.ndarray | None:
        if i < 0:
            return None
        return self.g.constants.get(self.names[i])

    def need_const(self, i: int, what: str) -> np.ndarray:
        v = self.const(i)
        if v is None:
            raise ConversionError(f"{self.source}: {what} must be a constant tensor")
        return v

    def options(self, cls_name: str):
        raw = self.op.BuiltinOptions()
        opt = getattr(self.s, cls_name)()
        if raw is not None:
            opt.Init(raw.Bytes, raw.Pos)
        return opt

    def act(self, code: int) -> str:
        if code not in _ACT:
            raise ConversionError(f"{self.source}: fused activation {code} is not supported (only none, relu, relu6)")
        return _ACT[code]

    def ins(self) -> list[int]:
        return [int(v) for v in self.op.InputsAsNumpy()] if self.op.InputsLength() else []

    def outs(self) -> list[int]:
        return [int(v) for v in self.op.OutputsAsNumpy()]

    def add(self, op: str, inputs: list[str], **attrs):
        out = [self.names[i] for i in self.outs()]
        self.g.add_node(op, inputs, out, name=out[0], **attrs)

    def new_const(self, name: str, value: np.ndarray) -> str:
        if name in self.g.tensors:
            name = f"{name}#{len(self.g.tensors)}"
        # a view of the mapped file where it is one (weights transposed to HWIO, not copied): packing reads it once and
        # the session then releases the file's pages (memory.release_mapped_weights)
        return self.g.add_constant(name, np.asarray(value))


@dataclass(frozen=True)
class Translator:
    """Turns one TFLite builtin op into engine nodes; ``ops`` names the engine ops it may emit."""

    emit: Callable[[_Ctx], None]
    ops: tuple[str, ...]

    def __call__(self, c: _Ctx) -> None:
        self.emit(c)


#: TFLite builtin op name -> its :class:`Translator`.
TRANSLATORS: Registry[Translator] = Registry("TFLite op", error=ConversionError)


def translates(tflite_op: str, *ops: str):
    """Decorator: the function translates ``tflite_op`` into the engine ops ``ops``."""

    def add(fn):
        TRANSLATORS.register(tflite_op)(Translator(fn, ops))
        return fn

    return add


def _padding(code: int) -> str:
    return "same" if code == 0 else "valid"
