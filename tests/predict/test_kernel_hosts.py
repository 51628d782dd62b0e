"""A kernel predictor knows the machines its kernels were timed on: a build records them, the predictor carries them,
and a prediction made on another machine widens its interval and says so (``leti.device.host``)."""

import json

import numpy as np
import pandas as pd
import pytest

import leti
from leti.device import host as host_mod
from leti.predict.kernels.build_store import BuildStore
from leti.predict.kernels.model import OTHER_HOST_LOG_STD, Z90, load_kernel_predictor
from tests.predict.test_kernel_split import leti_cli, se_block_net, synthetic_predictor


class _M:  # what BuildStore.done reads of a measurement
    ratio, ratio_std, ref_ms, mean_ms, runs = 2.0, 0.01, 0.15, 0.3, 20


def test_host_identity_is_a_digest_that_names_the_cpu():
    me = host_mod.host_identity()
    assert set(me) == {"id", "cpu", "cores"} and len(me["id"]) == 16 and int(me["id"], 16) >= 0
    assert me["cpu"] and me["cpu"] == host_mod.cpu_name() and me == host_mod.host_identity()


def test_a_build_store_records_each_machine_it_measured_on_once(tmp_path, monkeypatch):
    rows = pd.DataFrame({"kernel_type": ["relu"]})
    with BuildStore(tmp_path / "k.sqlite") as store:
        assert store.hosts() == []
        store.plan("kernel", [(f"k{i}", "initial", "relu", {"i": i}) for i in range(3)], 0)
        ids = [item["id"] for item in store.pending()]
        store.done(ids[0], rows, _M(), 0.1)
        store.done(ids[1], rows, _M(), 0.1)
        me = host_mod.host_identity()
        assert store.hosts() == [me]
    other = {"id": "0123456789abcdef", "cpu": "Another CPU", "cores": 2}
    monkeypatch.setattr(host_mod, "host_identity", lambda: other)
    with BuildStore(tmp_path / "k.sqlite") as store:  # the build continued on another machine
        store.done(ids[2], rows, _M(), 0.1)
        assert store.hosts() == [me, other]


def test_a_prediction_on_another_machine_is_wider_and_says_so(tmp_path):
    nets = [se_block_net(w, r) for w, r in ((8, 16), (16, 24), (24, 32))]
    kp, _ = synthetic_predictor(tmp_path, nets)
    model = se_block_net(12, 20)
    plain = leti.predict_model_latency(model, kp)
    assert plain.host == "unrecorded" and load_kernel_predictor(kp).hosts == []
    manifest = json.loads((kp / "manifest.json").read_text())
    for hosts, expect in (([host_mod.host_identity()], "this"),
                          ([{"id": "fedcba9876543210", "cpu": "Some other CPU", "cores": 8}], "other")):
        (kp / "manifest.json").write_text(json.dumps({**manifest, "hosts": hosts}))
        pred = load_kernel_predictor(kp)
        assert pred.hosts == hosts and pred.host == expect
        r = leti.predict_model_latency(model, pred)
        assert r.host == expect and r.latency_ms == pytest.approx(plain.latency_ms)  # the same estimate
        sigma0, sigma = np.log(plain.high_ms / plain.latency_ms) / Z90, np.log(r.high_ms / r.latency_ms) / Z90
        if expect == "this":
            assert sigma == pytest.approx(sigma0) and r.std_ms == pytest.approx(plain.std_ms)
        else:  # the spread between machines added in quadrature
            assert sigma == pytest.approx(np.hypot(sigma0, OTHER_HOST_LOG_STD), rel=1e-6) and r.low_ms < plain.low_ms
    # the CLI: --json carries the host's standing, and a note on stderr says the prediction is another machine's
    from leti.models.keras_import import keras_to_tflite

    f = tmp_path / "m.tflite"
    f.write_bytes(keras_to_tflite(model))
    j = leti_cli("predict", "--model", str(f), "--predictor", str(kp), "--json")
    assert j.returncode == 0, j.stderr
    assert json.loads(j.stdout)["host"] == "other" and "timed on another machine (Some other CPU)" in j.stderr
