import math

import numpy as np
import pytest

from leti.errors import DatasetError
from leti.predict import metrics


def test_acc_at_k_hand_computed():
    y = [10.0, 10.0, 10.0, 20.0]
    p = [11.0, 10.9, 8.5, 21.5]  # |err| = 1.0 (exactly 10%), 0.9, 1.5, 1.5 (7.5% of 20)
    assert metrics.acc_at(y, p, 0.10) == 0.75
    assert metrics.acc_at(y, p, 0.05) == 0.0
    assert metrics.score_all(y, p)["acc@10%"] == 0.75


def test_r2_rmse_rmspe_hand_computed():
    y = np.array([1.0, 2.0, 3.0, 4.0])
    p = np.array([1.0, 2.0, 3.0, 5.0])
    assert metrics.r2(y, p) == pytest.approx(1 - 1 / 5)
    assert metrics.rmse(y, p) == pytest.approx(0.5)
    assert metrics.rmspe(y, p) == pytest.approx(math.sqrt((0.25**2) / 4))
    assert metrics.r2(y, np.full(4, 2.5)) == pytest.approx(0.0)


def test_rank_correlations():
    y = [1.0, 2.0, 3.0, 4.0]
    assert metrics.spearman(y, [10, 20, 30, 40]) == pytest.approx(1.0)
    assert metrics.kendall(y, [40, 30, 20, 10]) == pytest.approx(-1.0)
    # one swapped pair of 6: tau = (5 - 1) / 6
    assert metrics.kendall(y, [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert metrics.spearman(y, [1, 3, 2, 4]) == pytest.approx(1 - 6 * 2 / (4 * 15))


def test_bad_input():
    with pytest.raises(DatasetError):
        metrics.r2([1.0, 2.0], [1.0])
    with pytest.raises(DatasetError):
        metrics.acc_at([], [])
