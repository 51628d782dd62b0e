import itertools
import os
import sys

import numpy as np
import pytest

from leti.engine.memory import Step, plan_memory


def _check_no_overlap(plan, steps, sizes, inputs, outputs):
    """Brute force: two tensors live at the same step share bytes only if they are one buffer."""
    end = len(steps)
    first = {t: 0 for t in inputs}
    last = {t: 0 for t in inputs}
    for s, st in enumerate(steps):
        for t in st.writes:
            first[t] = s
            last.setdefault(t, s)
        for t in st.reads:
            last[t] = s
    for t in outputs:
        last[t] = end
    same = {}
    for a, b in plan.inplace.items():
        same[a] = b
    for st in steps:
        same.update(st.aliases)

    def root(t):
        while t in same:
            t = same[t]
        return t

    for a, b in itertools.combinations(sizes, 2):
        if root(a) == root(b):
            continue
        if first[a] <= last[b] and first[b] <= last[a]:
            ra = (plan.offsets[a], plan.offsets[a] + sizes[a])
            rb = (plan.offsets[b], plan.offsets[b] + sizes[b])
            assert ra[1] <= rb[0] or rb[1] <= ra[0], (a, b)


def test_chain_reuses_two_buffers_besides_the_input():
    steps = [Step(f"s{i}", [f"t{i}"], [f"t{i + 1}"]) for i in range(6)]
    sizes = {f"t{i}": 1024 for i in range(7)}
    plan = plan_memory(steps, sizes, ["t0"], ["t6"])
    assert plan.arena_bytes == 3 * 1024 == plan.lower_bound_bytes  # input kept + two ping-pong buffers
    assert plan.naive_bytes == 7 * 1024
    _check_no_overlap(plan, steps, sizes, ["t0"], ["t6"])


def test_inplace_only_for_the_last_reader():
    steps = [Step("a", ["x"], ["y"]),
             Step("b", ["y"], ["z"], inplace={"z": ("y",)}),  # y is read again later: refused
             Step("c", ["y", "z"], ["w"], inplace={"w": ("y",)})]  # last reader of y: granted
    sizes = {"x": 640, "y": 640, "z": 640, "w": 640}
    plan = plan_memory(steps, sizes, ["x"], ["w"])
    assert plan.inplace == {"w": "y"}
    assert plan.offsets["w"] == plan.offsets["y"] != plan.offsets["z"]
    _check_no_overlap(plan, steps, sizes, ["x"], ["w"])


def test_random_dags_are_valid_and_bounded(rng=np.random.default_rng(0)):
    for trial in range(30):
        n = int(rng.integers(3, 25))
        sizes = {"t0": int(rng.integers(1, 5000))}
        steps = []
        for i in range(1, n):
            reads = sorted({f"t{int(j)}" for j in rng.integers(0, i, size=int(rng.integers(1, 3)))})
            sizes[f"t{i}"] = int(rng.integers(1, 5000))
            inplace = {f"t{i}": (reads[0],)} if rng.random() < 0.5 and sizes[reads[0]] == sizes[f"t{i}"] else {}
            steps.append(Step(f"s{i}", reads, [f"t{i}"], scratch=[int(rng.integers(0, 3000))], inplace=inplace))
        plan = plan_memory(steps, sizes, ["t0"], [f"t{n - 1}"])
        _check_no_overlap(plan, steps, sizes, ["t0"], [f"t{n - 1}"])
        assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.naive_bytes


def test_graph_inputs_are_never_overwritten():
    steps = [Step("a", ["x"], ["y"], inplace={"y": ("x",)})]
    plan = plan_memory(steps, {"x": 64, "y": 64}, ["x"], ["y"])
    assert plan.inplace == {} and plan.offsets["x"] != plan.offsets["y"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system():
    """Blocks freed below a live one stay in the process until trimmed; the trim returns their pages."""
    import ctypes

    from leti.engine.memory import return_freed_heap

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    return_freed_heap()
    blocks = [libc.malloc(64 << 10) for _ in range(1024)]  # 64 MiB in heap-sized blocks (under the mmap threshold)
    for b in blocks:
        libc.memset(b, 1, 64 << 10)
    pin = libc.malloc(64 << 10)  # a live block above them: the heap's top cannot shrink past it
    for b in blocks:
        libc.free(b)
    before = rss_mib()
    assert return_freed_heap() is True
    after = rss_mib()
    libc.free(pin)
    assert before - after > 32, (before, after)
