"""Hybrid scheduling: a backend for every op that minimises the predicted latency of the whole run,
transfers included (MNN's backend evaluation, per op instead of per session).

**Objective.** Ops run one after another, so a plan costs the sum of its ops' costs on their
backends, plus the cost model's fixed cost of a run (the same for every plan), plus one transfer for every (tensor, memory domain) pair where a tensor is read outside
the domain that produced it (the session makes exactly one copy per pair), plus the copies of
graph outputs back to the host. Graph inputs start on the host. Backends that share a memory domain
(two CPU backends) exchange tensors for free.

**Exact dynamic programme** over the topological order. After each op the state is, for every
*live* tensor (produced, with a reader still to come, or a graph output), its producer's domain and
the set of domains it has been copied to. Two partial plans with the same state have the same
future, so only the cheaper one is kept: the result is optimal. For a chain one tensor is live, so
there are at most D states (D domains); NB101 cells keep a handful of tensors live.

**Heuristic** when the graph does not allow it: if more than ``max_states`` states survive a step,
only the ``max_states`` cheapest are kept (a beam search) and the plan is marked ``exact=False``.

**Fallback.** A backend that declines an op (``create_execution`` returns ``None``) is no choice
for that op; the session's MNN fallback then also covers ops a plan could not place.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

INF = float("inf")


@dataclass
class Problem:
    """What the solver needs; ``costs[i][b]`` is None when backend ``b`` declines node ``i``."""

    names: list[str]
    ops: list[str]
    inputs: list[list[str]]  # non-constant tensors each node reads
    outputs: list[list[str]]
    nbytes: dict[str, int]
    graph_inputs: list[str]
    graph_outputs: list[str]
    backends: list[str]  # cost keys, for printing
    domains: list[str]  # memory domain of each backend
    costs: list[list[float | None]]
    transfer: Callable[[int, str, str], float]
    schemes: list[str] = field(default_factory=list)
    overhead: float = 0.0  # fixed cost of a run (the same for every assignment)


@dataclass
class Plan:
    backend_index: list[int]
    total_ms: float
    op_ms: list[float]
    transfers: list[tuple[str, str, str, float]]  # tensor, from, to, ms
    exact: bool
    max_states: int
    problem: Problem

    def assignment(self) -> dict[str, str]:
        return {n: self.problem.backends[b] for n, b in zip(self.problem.names, self.backend_index)}

    def summary(self) -> dict:
        per = {}
        for b in self.backend_index:
            per[self.problem.backends[b]] = per.get(self.problem.backends[b], 0) + 1
        return {"predicted_ms": self.total_ms, "ops_per_backend": per, "transfers": len(self.transfers),
                "transfer_ms": sum(t[3] for t in self.transfers), "exact": self.exact,
                "max_live_states": self.max_states}

    def format(self) -> str:
        p = self.problem
        w = max([len(n) for n in p.names] + [4])
        w = min(w, 48)
        lines = [f"{'#':>3} {'node':{w}} {'op':16} {'scheme':16} {'backend':10} {'ms':>9}  alternatives"]
        for i, b in enumerate(self.backend_index):
            alts = ", ".join(f"{p.backends[k]}={c:.4f}" if c is not None else f"{p.backends[k]}=declines"
                             for k, c in enumerate(p.costs[i]) if k != b)
            scheme = p.schemes[i] if p.schemes else ""
            lines.append(f"{i:3d} {p.names[i][-w:]:{w}} {p.ops[i]:16} {scheme:16} {p.backends[b]:10} "
                         f"{self.op_ms[i]:9.4f}  {alts}")
        for t, a, c, ms in self.transfers:
            lines.append(f"    transfer {t} {a} -> {c}: {ms:.4f} ms")
        if p.overhead:
            lines.append(f"    fixed cost of a run: {p.overhead:.4f} ms")
        s = self.summary()
        lines.append(f"predicted total {self.total_ms:.4f} ms ({s['transfers']} transfers, {s['transfer_ms']:.4f} ms); "
                     f"{'exact' if self.exact else 'beam heuristic'} (at most {self.max_states} live states)")
        return "\n".join(lines)


def evaluate(p: Problem, assignment) -> tuple[float, list[float], list[tuple[str, str, str, float]]]:
    """Predicted latency of one assignment (the objective the solver minimises)."""
    src = {t: "host" for t in p.graph_inputs}
    present = {t: {"host"} for t in p.graph_inputs}
    total, op_ms, moves = 0.0, [], []
    for i, b in enumerate(assignment):
        c = p.costs[i][b]
        if c is None:
            return INF, [], []
        d = p.domains[b]
        total += c
        op_ms.append(c)
        for t in dict.fromkeys(p.inputs[i]):
            if d not in present[t]:
                ms = p.transfer(p.nbytes[t], src[t], d)
                moves.append((t, src[t], d, ms))
                total += ms
                present[t].add(d)
        for t in p.outputs[i]:
            src[t], present[t] = d, {d}
    for t in p.graph_outputs:
        if t in present and "host" not in present[t]:
            ms = p.transfer(p.nbytes[t], src[t], "host")
            moves.append((t, src[t], "host", ms))
            total += ms
    return total + p.overhead, op_ms, moves


def brute_force(p: Problem) -> Plan:
    """Every assignment (tests only: exponential)."""
    best, best_a = INF, None
    for a in itertools.product(range(len(p.backends)), repeat=len(p.names)):
        c = evaluate(p, a)[0]
        if c < best - 1e-12:
            best, best_a = c, a
    if best_a is None:
        raise ValueError("no backend accepts some node")
    total, op_ms, moves = evaluate(p, best_a)
    return Plan(list(best_a), total, op_ms, moves, True, 0, p)


def solve(p: Problem, max_states: int = 4096) -> Plan:
    """The plan of least predicted latency (module docstring); exact unless a beam was needed."""
    doms = sorted(set(p.domains))
    bit = {d: 1 << k for k, d in enumerate(doms)}
    n = len(p.names)
    last = {}
    for i, ins in enumerate(p.inputs):
        for t in ins:
            last[t] = i
    for t in p.graph_outputs:
        last[t] = n
    live: list[str] = [t for t in p.graph_inputs if last.get(t, -1) >= 0]
    host = doms.index("host") if "host" in doms else -1
    if host < 0:
        doms.append("host")
        bit["host"] = 1 << len(bit)
        host = len(doms) - 1
    start = tuple((host, bit["host"]) for _ in live)
    layers: list[dict] = []
    states = {start: (0.0, None, -1)}
    exact, widest = True, 1
    for i in range(n):
        pos = {t: k for k, t in enumerate(live)}
        new_live = [t for t in live if last[t] > i] + [t for t in p.outputs[i] if last.get(t, -1) > i]
        nxt: dict = {}
        reads = list(dict.fromkeys(p.inputs[i]))
        for key, (cost, _, _) in states.items():
            for b, c in enumerate(p.costs[i]):
                if c is None:
                    continue
                d = p.domains[b]
                entry = dict(zip(live, key))
                total = cost + c
                for t in reads:
                    s, mask = entry[t] if t in entry else (host, bit["host"])
                    if not mask & bit[d]:
                        total += p.transfer(p.nbytes[t], doms[s], d)
                        entry[t] = (s, mask | bit[d])
                for t in p.outputs[i]:
                    entry[t] = (doms.index(d), bit[d])
                nk = tuple(entry[t] for t in new_live)
                if nk not in nxt or total < nxt[nk][0] - 1e-12:
                    nxt[nk] = (total, key, b)
        if not nxt:
            raise ValueError(f"no backend accepts node {p.names[i]!r}")
        if len(nxt) > max_states:
            exact = False
            nxt = dict(sorted(nxt.items(), key=lambda kv: kv[1][0])[:max_states])
        widest = max(widest, len(nxt))
        layers.append(nxt)
        states, live = nxt, new_live
        del pos
    # graph outputs back to the host
    best_key, best = None, INF
    for key, (cost, _, _) in states.items():
        entry = dict(zip(live, key))
        total = cost
        for t in p.graph_outputs:
            if t in entry and not entry[t][1] & bit["host"]:
                total += p.transfer(p.nbytes[t], doms[entry[t][0]], "host")
        if total < best - 1e-12:
            best, best_key = total, key
    choice = []
    key = best_key
    for i in range(n - 1, -1, -1):
        _, prev, b = layers[i][key]
        choice.append(b)
        key = prev
    choice.reverse()
    total, op_ms, moves = evaluate(p, choice)
    return Plan(choice, total, op_ms, moves, exact, widest, p)


def plan_session(session, ctxs, attempt, max_states: int = 4096) -> Plan:
    """Build the :class:`Problem` of a session being resized and solve it (called by ``resize``)."""
    from leti.engine.cost.spec import op_spec

    g, cm = session.graph, session.cost_model
    costs, schemes = [], []
    for i, _ in enumerate(g.nodes):
        row = []
        for b, backend in enumerate(session.backends):
            ex, ctx = attempt(i, b)
            if ex is None:
                row.append(None)
            elif ex.alias:
                row.append(0.0)  # a view: nothing runs
            else:
                row.append(float(cm.op_cost(op_spec(ctx), backend)))
        costs.append(row)
        schemes.append(str(ctxs[i].scheme))
    nbytes = {t: int(np.prod(s, dtype=np.int64)) * np.dtype(g.tensors[t].dtype).itemsize
              for t, s in session.shapes.items() if t in g.tensors}
    prob = Problem([n.name for n in g.nodes], [n.op for n in g.nodes],
                   [[t for t in n.inputs if t not in g.constants] for n in g.nodes],
                   [list(n.outputs) for n in g.nodes], nbytes, list(g.inputs),
                   [t for t in g.outputs if t not in g.constants], [b.cost_key for b in session.backends],
                   [b.memory_domain for b in session.backends], costs, cm.transfer_cost, schemes,
                   float(cm.run_overhead(session.backends)))
    return solve(prob, max_states)
