"""Converters into the engine's :class:`~leti.engine.graph.Graph`, the one graph representation of
every model LETI reads: LETI cells/networks (``from_cell``), ``.tflite`` flatbuffers
(``from_tflite``), Keras models (:mod:`leti.models.keras_import`: through TFLite, in memory) and ``.onnx`` files
(``from_onnx``, LETI's own importer), plus ``.leti`` files themselves.

:func:`load_model` is the single entry point: it picks an importer from :data:`IMPORTERS` by the
file suffix (or takes a Keras model object), so a new format is one registered function.
Importers import their converter when used: reading a ``.leti`` file never imports TensorFlow, onnx or torch.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from leti.errors import ConversionError, CorruptModelError
from leti.registry import Registry

#: Suffix (``".onnx"``) -> ``importer(path) -> Graph``; each imports its converter when first used.
#: Keras files (and Keras model objects) are imported by :mod:`leti.models.keras_import`, which owns the
#: Keras → TFLite conversion and registers itself here when first asked for.
IMPORTERS: Registry = Registry("model format", error=ConversionError,
                               lazy={".keras": "leti.models.keras_import", ".h5": "leti.models.keras_import"})


@IMPORTERS.register(".tflite")
def _tflite(path):
    from leti.engine.convert.from_tflite import from_tflite

    return from_tflite(path)


@IMPORTERS.register(".onnx")
def _onnx(path):
    from leti.engine.convert.from_onnx import from_onnx

    return from_onnx(path)


@IMPORTERS.register(".leti")
def _leti(path):
    from leti.engine import format as fmt

    return fmt.load(path)


def read_source(source: str | os.PathLike | bytes) -> tuple[bytes, str]:
    """The bytes of a model given as a path or as bytes, and the name to report it by."""
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), "<bytes>"
    try:
        return Path(source).read_bytes(), str(source)
    except OSError as exc:
        raise CorruptModelError(f"{source}: cannot read ({exc.strerror})") from None


def map_source(source: str | os.PathLike | bytes) -> tuple[bytes | mmap.mmap, str]:
    """As :func:`read_source`, but a file is mapped read-only instead of read: weights parsed out of it can be views of
    the file, which a session releases once it has packed them (:func:`leti.engine.memory.release_mapped_weights`)."""
    if isinstance(source, (bytes, bytearray)):
        return read_source(source)
    try:
        with open(source, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b"", str(source)
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), str(source)
    except OSError as exc:
        raise CorruptModelError(f"{source}: cannot read ({exc.strerror})") from None


#: The suffixes :func:`load_model` reads.
MODEL_SUFFIXES = (".tflite", ".keras", ".h5", ".onnx", ".leti")


def load_model(model) -> "Graph":  # noqa: F821  (Graph: leti.engine.graph)
    """Any float CNN as an engine graph: a path to a ``.tflite``, ``.keras``/``.h5``, ``.onnx`` or
    ``.leti`` file, or a Keras model object. Raises :class:`ConversionError` for an unknown format
    or unsupported ops (all of them listed), :class:`CorruptModelError` for an unreadable file."""
    if not isinstance(model, (str, os.PathLike)):
        if hasattr(model, "layers") and hasattr(model, "inputs"):
            return IMPORTERS.get(".keras")(model)
        raise ConversionError(f"cannot load a model from a {type(model).__name__}; give a path "
                              f"({', '.join(MODEL_SUFFIXES)}) or a Keras model")
    path = Path(model)
    suffix = path.suffix.lower()
    if suffix not in IMPORTERS:
        raise ConversionError(f"{path}: unknown model format {suffix or '(no suffix)'!r}; "
                              f"known: {', '.join(MODEL_SUFFIXES)}")
    return IMPORTERS.get(suffix)(path)
