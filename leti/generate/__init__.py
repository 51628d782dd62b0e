"""Search spaces, cells, analytic costs and model builders."""

from leti.generate.cell import Cell, OPS
from leti.generate.nb101_hash import nb101_hash

__all__ = ["Cell", "OPS", "nb101_hash"]
