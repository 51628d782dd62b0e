"""LETI: latency estimation for neural networks on phones and other devices.

Packages: :mod:`leti.generate` (search spaces, costs, models), :mod:`leti.device` (measurement),
:mod:`leti.predict` (latency predictors) and :mod:`leti.engine` (LETI's inference engine).
"""

__version__ = "0.1.0"
