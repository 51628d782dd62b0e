"""Hybrid scheduling: the exact DP against brute force, the beam fallback, and sessions planned
with the analytic model on two CPU backends of different thread counts (CI has no GPU)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from leti.cli import app
from leti.engine.backends.cpu import CPUBackend
from leti.engine.convert.from_cell import from_cell, write_leti
from leti.engine.cost import AnalyticCostModel, TransferModel
from leti.engine.hybrid import Problem, brute_force, evaluate, solve
from leti.engine.reference import run_reference
from leti.engine.session import Session
from tests.engine.conftest import RICH, SMALL, rel_err

PARAMS = {"cpu:t1": {"flops": 1e9, "t_schedule_ms": 0.0, "bandwidth": 1e9},
          "cpu:t2": {"flops": 2e9, "t_schedule_ms": 0.0, "bandwidth": 1e9}}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LETI_CACHE_DIR", str(tmp_path / "cache"))


class OtherDomainCPU(CPUBackend):
    """A CPU backend whose tensors live in their own memory domain: a stand-in for a second device,
    so plans must pay for transfers (the data really is copied between two host arenas)."""

    name = "cpu2"
    memory_domain = "host2"


class NoConvCPU(CPUBackend):
    """Declines convolutions (MNN: onCreate returns null), so another backend must take them."""

    name = "noconv"

    def create_execution(self, ctx):
        return None if ctx.node.op == "conv2d" else super().create_execution(ctx)


def _random_problem(rng, n_nodes: int, n_backends: int, domains, decline=0.15):
    """A random DAG in topological order: node i reads 1-2 earlier tensors (or the input)."""
    tensors, inputs, outputs = ["x"], [], []
    for i in range(n_nodes):
        k = min(len(tensors), int(rng.integers(1, 3)))
        inputs.append(list(rng.choice(tensors, size=k, replace=False)))
        outputs.append([f"t{i}"])
        tensors.append(f"t{i}")
    costs = [[None if rng.random() < decline else float(rng.uniform(0.1, 2.0)) for _ in range(n_backends)]
             for _ in range(n_nodes)]
    for row in costs:
        if all(c is None for c in row):
            row[0] = 1.0
    nbytes = {t: int(rng.integers(1, 50)) * 1000 for t in tensors}
    lat = {(a, b): float(rng.uniform(0.0, 0.5)) for a in set(domains) | {"host"} for b in set(domains) | {"host"}}
    return Problem([f"n{i}" for i in range(n_nodes)], ["op"] * n_nodes, inputs, outputs, nbytes, ["x"],
                   [f"t{n_nodes - 1}"], [f"b{k}" for k in range(n_backends)], list(domains), costs,
                   lambda n, s, d: lat[(s, d)] + n * 1e-5)


@pytest.mark.parametrize("seed", range(12))
def test_dp_is_optimal_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    domains = [["host", "gpu"], ["host", "gpu", "gpu"], ["host", "host", "gpu"]][seed % 3]
    p = _random_problem(rng, n_nodes=int(rng.integers(3, 8)), n_backends=len(domains), domains=domains)
    dp, bf = solve(p), brute_force(p)
    assert dp.exact
    assert dp.total_ms == pytest.approx(bf.total_ms, abs=1e-9)
    assert evaluate(p, dp.backend_index)[0] == pytest.approx(dp.total_ms)
    assert all(p.costs[i][b] is not None for i, b in enumerate(dp.backend_index))  # declines respected


def test_chain_dp_and_beam_heuristic():
    rng = np.random.default_rng(7)
    p = _random_problem(rng, n_nodes=9, n_backends=3, domains=["host", "gpu", "dsp"], decline=0.0)
    exact = solve(p)
    beam = solve(p, max_states=1)
    assert exact.exact and not beam.exact
    assert beam.total_ms >= exact.total_ms - 1e-12
    assert beam.total_ms == pytest.approx(evaluate(p, beam.backend_index)[0])
    # a pure chain keeps at most one state per domain
    chain = Problem(["a", "b", "c"], ["op"] * 3, [["x"], ["a"], ["b"]], [["a"], ["b"], ["c"]],
                    {t: 4000 for t in "xabc"}, ["x"], ["c"], ["cpu", "gpu"], ["host", "gpu"],
                    [[1.0, 0.2], [1.0, 0.2], [0.1, 5.0]], lambda n, s, d: 0.3)
    plan = solve(chain)
    assert plan.backend_index == [1, 1, 0] and plan.max_states <= 2
    assert plan.total_ms == pytest.approx(0.3 + 0.4 + 0.3 + 0.1)  # in, two gpu ops, back, cpu op


def _x(g, seed=0):
    return np.random.default_rng(seed).standard_normal(g.tensors["input"].shape).astype(np.float32)


def test_two_cpu_backends_of_different_thread_counts():
    g = from_cell(RICH, kind="cell", input_shape=(8, 8, 8))
    x = _x(g)
    ref = run_reference(g, {"input": x})[g.outputs[0]]
    cm = AnalyticCostModel(params=PARAMS)
    s = Session(g, backends=["cpu:1", "cpu:2"], cost_model=cm).resize()
    assert {st.backend.cost_key for st in s.steps} == {"cpu:t2"}  # twice the FLOPS wins every op
    assert s.plan.exact and not s.plan.transfers
    assert s.plan.total_ms == pytest.approx(sum(s.plan.op_ms))
    assert rel_err(s.run(x)[g.outputs[0]], ref) < 1e-4
    # the calibrated model (microbenchmarks on this machine) plans too, and the plan runs correctly
    s2 = Session(g, backends=["cpu:1", "cpu:2"], cost_model=AnalyticCostModel()).resize()
    assert len(s2.plan.backend_index) == len(s2.graph.nodes) and s2.plan.total_ms > 0
    assert rel_err(s2.run(x)[g.outputs[0]], ref) < 1e-4
    text = s.plan.format()
    assert "cpu:t2" in text and "cpu:t1=" in text and "predicted total" in text


def test_transfers_decide_between_domains():
    g = from_cell(RICH, kind="cell", input_shape=(8, 8, 8))
    x = _x(g, 1)
    ref = run_reference(g, {"input": x})[g.outputs[0]]
    params = {"cpu:t1": PARAMS["cpu:t1"], "cpu2:t1": {"flops": 1.5e9, "t_schedule_ms": 0.0, "bandwidth": 1e9}}
    b1, b2 = CPUBackend(threads=1), OtherDomainCPU(threads=1)
    # free transfers: the faster domain takes every op; costly transfers: staying on the host wins
    cheap = AnalyticCostModel(params=params, transfers=TransferModel({("host", "host2"): (0.0, 1e15),
                                                                     ("host2", "host"): (0.0, 1e15)}))
    s = Session(g, backends=[b1, b2], cost_model=cheap).resize()
    assert {st.backend.name for st in s.steps if st.op != "copy"} == {"cpu2"}
    copies = [st for st in s.steps if st.op == "copy"]
    assert len(copies) == len(s.plan.transfers) == 2  # the input in, the output back
    assert rel_err(s.run(x)[g.outputs[0]], ref) < 1e-4
    dear = AnalyticCostModel(params=params, transfers=TransferModel({("host", "host2"): (1.0, 1e9),
                                                                    ("host2", "host"): (1.0, 1e9)}))
    s = Session(g, backends=[b1, b2], cost_model=dear).resize()
    assert {st.backend.name for st in s.steps} == {"cpu"} and not s.plan.transfers
    # mixed: costs that favour the other domain for some ops only give a split plan that still runs
    mixed = AnalyticCostModel(params=params, transfers=TransferModel({("host", "host2"): (1e-4, 1e12),
                                                                     ("host2", "host"): (1e-4, 1e12)}))
    s = Session(g, backends=[b1, b2], cost_model=mixed).resize()
    assert rel_err(s.run(x)[g.outputs[0]], ref) < 1e-4
    assert s.plan.total_ms == pytest.approx(evaluate(s.plan.problem, s.plan.backend_index)[0])


def test_declined_ops_fall_back():
    g = from_cell(SMALL, kind="cell", input_shape=(8, 8, 8))
    x = _x(g, 2)
    ref = run_reference(g, {"input": x})[g.outputs[0]]
    fast = {"noconv:t2": {"flops": 1e12, "t_schedule_ms": 0.0, "bandwidth": 1e9}, **PARAMS}
    s = Session(g, backends=[NoConvCPU(threads=2), CPUBackend(threads=1)], cost_model=AnalyticCostModel(params=fast))
    s.resize()
    conv_rows = [i for i, n in enumerate(s.graph.nodes) if n.op == "conv2d"]
    assert conv_rows and all(s.plan.problem.costs[i][0] is None for i in conv_rows)
    assert {st.backend.name for st in s.steps if st.op == "conv2d"} == {"cpu"}
    assert {st.backend.name for st in s.steps if st.op != "conv2d"} == {"noconv"}
    assert rel_err(s.run(x)[g.outputs[0]], ref) < 1e-4
    plain = Session(g, backends=[NoConvCPU(threads=1), "cpu"]).resize()  # no plan: MNN's list order
    assert {st.backend.name for st in plain.steps if st.op == "conv2d"} == {"cpu"}


def test_cli_plan_and_auto(tmp_path):
    runner = CliRunner()
    path = write_leti(SMALL, tmp_path / "c.leti", input_shape=(8, 8, 8))
    r = runner.invoke(app, ["engine", "plan", str(path), "--backend", "cpu:1,cpu:2", "--no-calibrate"])
    assert r.exit_code == 0, r.output
    assert "predicted total" in r.output and "cpu:t" in r.output
    r = runner.invoke(app, ["engine", "plan", str(path), "--backend", "cpu:1,cpu:2", "--json", "--batch", "2"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["exact"] and set(d["assignment"].values()) <= {"cpu:t1", "cpu:t2"} and d["predicted_ms"] > 0
    r = runner.invoke(app, ["engine", "run", str(path), "--backend", "auto", "--runs", "2", "--warmup", "1", "--json"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.output.strip().splitlines()[-1])
    assert stats["predicted_ms"] > 0 and stats["backends"]
    table = tmp_path / "costs.json"
    r = runner.invoke(app, ["engine", "profile", str(path), "--backend", "cpu:1", "--runs", "2", "--table", str(table)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["engine", "plan", str(path), "--backend", "cpu:1,cpu:2", "--table", str(table), "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["engine", "plan", str(path), "--table", str(tmp_path / "nope.json")])
    assert r.exit_code != 0 and "cannot read op table" in str(r.exception)
