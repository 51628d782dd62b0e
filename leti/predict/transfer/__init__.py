"""Few-shot latency transfer: a new device's predictor from N measurements and other devices' data.

Measuring 1,000 cells on every new device is what keeps latency-aware NAS off most of them; the
latencies other devices already measured carry most of the answer. A transfer predictor is fitted on N
target cells *and* a :class:`~leti.predict.transfer.data.Sources` (other devices' latencies, joined by
cell), then saved and loaded like any LETI predictor (``leti predict`` reads it).

* ``transfer-ridge`` (:mod:`.ridge`) — Bayesian linear model in log-latency space on the source
  devices' log-latencies of the same cells plus architecture features, hyperparameters by marginal
  likelihood on the N samples; gives a standard deviation.
* ``transfer-help`` (:mod:`.help`) — HELP's idea: a device is described by its latencies on the
  reference cells; a small torch network meta-trained over the source devices (and mixtures of them)
  maps architecture + device embedding to latency, then a Bayesian last layer adapts it to the target.
* ``transfer-boost`` (:mod:`.boost`) — for many target cells (~1,000): LETI's single-device boosting with
  each source's op-cost prediction of the cell as extra features.

:func:`~leti.predict.transfer.choose.choose` picks the cells worth measuring first.
"""

from leti.registry import Registry

#: transfer predictor families: name -> class (they need sources at fit time, so they live here; saved
#: ones load through :func:`leti.predict.base.load_predictor` like every other predictor)
TRANSFER = Registry("transfer predictor", lazy={"transfer-ridge": "leti.predict.transfer.ridge",
                                                 "transfer-help": "leti.predict.transfer.help",
                                                 "transfer-boost": "leti.predict.transfer.boost"})


def make_transfer(name: str, **params):
    """A new transfer predictor by registry name."""
    from leti.errors import LetiError

    cls = TRANSFER.get(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise LetiError(f"bad parameters for {name}: {exc}") from None
