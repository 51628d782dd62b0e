"""Converters into the engine's :class:`~leti.engine.graph.Graph`: from LETI cells/networks
(``from_cell``, no TensorFlow) and from ``.tflite`` flatbuffers (``from_tflite``)."""
