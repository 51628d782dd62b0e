"""LETI: latency estimation for neural networks on phones and other devices.

Packages: :mod:`leti.generate` (search spaces, costs, models), :mod:`leti.device` (measurement),
:mod:`leti.predict` (latency predictors) and :mod:`leti.engine` (LETI's inference engine).
"""

import os as _os

# TensorFlow's C++ info logs (oneDNN notices, converter chatter) drown the CLI's own output.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"


def __getattr__(name: str):
    """``leti.load_predictor`` without importing the predictor stack (torch, boosting) on ``import leti``."""
    if name == "load_predictor":
        from leti.predict import load_predictor

        return load_predictor
    raise AttributeError(f"module 'leti' has no attribute {name!r}")
