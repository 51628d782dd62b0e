"""Cost models for the engine's hybrid scheduler: one interface (:class:`CostModel`), MNN's
analytic model (:class:`AnalyticCostModel`), the learned one (:class:`LearnedCostModel`: a per-op
lookup table filled by profiling plus a regressor over op configurations) and transfer costs."""

from leti.engine.cost.analytic import AnalyticCostModel
from leti.engine.cost.base import CostModel
from leti.engine.cost.learned import LearnedCostModel, LeastSquares, OpTable
from leti.engine.cost.spec import OpSpec, op_spec
from leti.engine.cost.transfer import TransferModel, measure_transfer

__all__ = ["AnalyticCostModel", "CostModel", "LearnedCostModel", "LeastSquares", "OpSpec", "OpTable",
           "TransferModel", "measure_transfer", "op_spec"]
