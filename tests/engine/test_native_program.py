"""Runs of C-kernel steps executed as one native program (backends/cpu/native.py, csrc/program.c): the same
outputs, bit for bit, as the same steps run one by one, at one and two threads."""

import contextlib

import numpy as np
import pytest

from leti.engine import ops
from leti.engine.backends.cpu import CPUBackend, ckernels, native
from leti.engine.backends.cpu.native import Program
from leti.engine.graph import Graph
from leti.engine.reference import run_reference
from leti.engine.session import Session
from tests.engine.conftest import rel_err


@contextlib.contextmanager
def _restored(*switches):
    """Each ``ckernels.set_*`` switch given back the value it had on entry, however the block ends."""
    old = [switch(None) for switch in switches]
    try:
        yield
    finally:
        for switch, value in zip(switches, old):
            switch(value)

needs_program = pytest.mark.skipif(ckernels.program_runner() is None or not ckernels.program_runner()[1],
                                   reason=f"LETI's C kernels or OpenMP unavailable here: {ckernels.reason}")


class _Chain:
    """A graph built node by node; each node's output shape is inferred by its op."""

    def __init__(self, x_shape, rng):
        self.g, self.rng, self.last, self.n = Graph(), rng, "x", 0
        self.g.add_tensor("x", x_shape)
        self.g.inputs = ["x"]

    def add(self, op, consts=(), inputs=None, **attrs):
        g = self.g
        ins = list(inputs or [self.last])
        names = [g.add_constant(f"c{self.n}_{i}", np.asarray(c, np.float32)) for i, c in enumerate(consts)]
        shapes = [g.tensors[t].shape for t in ins] + [np.shape(c) for c in consts]
        out = f"t{self.n}"
        self.n += 1
        g.add_tensor(out, ops.get(op).infer(shapes, attrs)[0])
        g.add_node(op, ins + names, [out], **attrs)
        self.last = out
        return out

    def w(self, *shape, scale=0.3):
        return self.rng.standard_normal(shape).astype(np.float32) * scale

    def graph(self):
        self.g.outputs = [self.last]
        return self.g


def _network(rng, nb):
    """A stem window over RGB (padded), 1x1 products, depthwise 3x3 at strides 1 and 2, a product with a residual
    added in its epilogue, a grouped 3x3 convolution, a dilated one (a column matrix, then a product), a fully
    connected layer over every pixel, a global mean."""
    c = _Chain((nb, 19, 17, 3), rng)
    c.add("conv2d", [c.w(3, 3, 3, 16), c.w(16)], strides=[2, 2], padding="same", activation="relu")
    c.add("conv2d", [c.w(1, 1, 16, 24), c.w(24)], padding="same", activation="relu6")
    c.add("depthwise_conv2d", [c.w(3, 3, 24), c.w(24)], strides=[1, 1], padding="same", activation="relu6")
    skip = c.add("conv2d", [c.w(1, 1, 24, 24), c.w(24)], padding="same")
    c.add("depthwise_conv2d", [c.w(3, 3, 24), c.w(24)], strides=[1, 1], padding="same", activation="relu")
    y = c.add("conv2d", [c.w(1, 1, 24, 24), c.w(24)], padding="same")
    c.add("add", inputs=[y, skip])  # fused into the product's epilogue (passes.fuse_residual_adds)
    c.add("depthwise_conv2d", [c.w(3, 3, 24), c.w(24)], strides=[2, 2], padding="same", activation="relu6")
    c.add("grouped_conv2d", [c.w(3, 3, 8, 24), c.w(24)], strides=[1, 1], padding="same", groups=3,
          activation="relu")
    c.add("conv2d", [c.w(3, 3, 24, 24, scale=0.1), c.w(24)], dilations=[2, 2], padding="same")  # im2col + product
    c.add("fully_connected", [c.w(24, 40), c.w(40)], activation="relu")
    c.add("mean", axes=[1, 2], keepdims=False)
    return c.graph()


def _sessions(g, threads):
    fused = Session(g, backends=(CPUBackend(threads=threads),)).resize()
    single = Session(g, backends=(CPUBackend(threads=threads, native=False),)).resize()
    assert not any(isinstance(p, Program) for p in single._program)
    return fused, single


@needs_program
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("nb", [1, 2])
def test_native_program_matches_the_steps_run_one_by_one(rng, threads, nb):
    g = _network(rng, nb)
    fused, single = _sessions(g, threads)
    assert len(fused._program) == 1 and isinstance(fused._program[0], Program)
    # the stem and the grouped window: per image the window over the input in place (AVX2), or a padded copy and the
    # window (AVX-512: four records for one step at nb = 2); the dilated convolution: its column matrix and a product
    per_image = 2 if ckernels.set_avx512(None) else 1
    assert fused._program[0].steps == len(fused.steps) - 2 + 2 * per_image * nb + 1
    assert "im2col" in [st.scheme.name for st in fused.steps]
    for _ in range(2):  # a second run over the same buffers
        x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
        a, b = fused.run({"x": x})[g.outputs[0]], single.run({"x": x})[g.outputs[0]]
        assert np.array_equal(a, b)
        assert rel_err(a, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k, n", [(37, 30), (64, 1000)])
def test_native_head_matches_reference(rng, threads, k, n):
    """A classifier's head: the global mean, a fully connected layer at batch 1 (a matrix-vector product; outputs
    split in fours, a remainder) and a softmax, in the program's own C (not the numba kernels': another summation
    order, so equal to rounding)."""
    c = _Chain((1, 5, 7, k), rng)
    c.add("mean", axes=[1, 2], keepdims=False)
    c.add("fully_connected", [c.w(k, n), c.w(n)], activation="relu6")
    c.add("fully_connected", [c.w(n, 13, scale=0.05), c.w(13)])
    c.add("softmax", beta=1.5)
    g = c.graph()
    fused, single = _sessions(g, threads)
    assert len(fused._program) == 1 and fused._program[0].steps == 4
    x = rng.standard_normal((1, 5, 7, k)).astype(np.float32) * 3
    a, b = fused.run({"x": x})[g.outputs[0]], single.run({"x": x})[g.outputs[0]]
    assert np.allclose(a, b, rtol=1e-5, atol=1e-7) and abs(a.sum() - 1) < 1e-5
    assert rel_err(a, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("split", [None, 0])
def test_products_split_by_weight_panels_match_row_splits(rng, split):
    """At two threads a product with more columns than rows and weights as large as its input and output together
    (ckernels.set_weights_split) splits its panels (on pairs of them) instead of its rows: 56 x 512 -> 520 (33 panels:
    16 + 17) by default, and with the threshold at 0 also 56 x 64 -> 368 (23 panels: 12 + 11); the outputs equal the
    numba steps' bit for bit, and the reference."""
    c = _Chain((1, 7, 8, 512), rng)
    c.add("conv2d", [c.w(1, 1, 512, 520, scale=0.05), c.w(520)], padding="same", activation="relu6")
    c.add("conv2d", [c.w(1, 1, 520, 64, scale=0.05), c.w(64)], padding="same")
    c.add("conv2d", [c.w(1, 1, 64, 368), c.w(368)], padding="same", activation="relu")
    g = c.graph()
    with _restored(ckernels.set_weights_split):
        ckernels.set_weights_split(split)
        fused, single = _sessions(g, 2)
        x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
        a, b = fused.run({"x": x})[g.outputs[0]], single.run({"x": x})[g.outputs[0]]
    assert np.array_equal(a, b)
    assert rel_err(a, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("threads", [2, 3])
def test_panel_split_products_cut_into_row_chunks_give_the_panel_chunks_bit_for_bit(rng, threads):
    """A product split by weight panels (196 rows x 512 -> 520 columns, 33 panels) cuts each thread's share of the
    panels into chunks of rows (csrc/program.c, ckernels.set_panel_rows; 196 rows: 4 chunks per thread at 8 stolen
    chunks, 1 at 1), or the panels into chunks, or chooses by the share's size (the default): the same output bit for
    bit, the numba steps' and the reference's."""
    c = _Chain((1, 14, 14, 512), rng)
    c.add("conv2d", [c.w(1, 1, 512, 520, scale=0.05), c.w(520)], padding="same", activation="relu6")
    g = c.graph()
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
    outs = {}
    assert ckernels.set_panel_rows(None) == 2  # the default: by the share's size against the L2
    with _restored(ckernels.set_panel_rows, ckernels.set_steal_chunks):
        for rows in (True, False, 2):
            for k in (8, 1):
                assert ckernels.set_panel_rows(rows) == rows and ckernels.set_steal_chunks(k) == k
                fused, single = _sessions(g, threads)
                outs[rows, k] = fused.run({"x": x})[g.outputs[0]]
    assert ckernels.set_panel_rows(None) == 2
    assert all(np.array_equal(outs[True, 8], o) for o in outs.values())
    assert np.array_equal(outs[True, 8], single.run({"x": x})[g.outputs[0]])
    assert rel_err(outs[True, 8], run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("threads", [2, 3])
def test_steps_cut_into_stolen_chunks_give_the_fixed_split_bit_for_bit(rng, threads):
    """On two or more threads each step is cut into threads x K chunks that idle threads take from the others
    (csrc/program.c, ckernels.set_steal_chunks): for K = 1 (fixed parts), 3 and 8 — more chunks than the 1-pixel
    mean, the 3-row maps or a 2-panel product have parts — the network's output is the same bit for bit, equals the
    numba steps', and the reference."""
    g = _network(rng, 1)
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
    outs = {}
    with _restored(ckernels.set_steal_chunks):
        for k in (1, 3, 8):
            assert ckernels.set_steal_chunks(k) == k
            fused, single = _sessions(g, threads)
            outs[k] = fused.run({"x": x})[g.outputs[0]]
    assert np.array_equal(outs[1], outs[3]) and np.array_equal(outs[1], outs[8])
    assert np.array_equal(outs[8], single.run({"x": x})[g.outputs[0]])
    assert rel_err(outs[8], run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("threads", [2, 3])
def test_steps_waiting_on_finished_chunks_give_the_barriers_output_bit_for_bit(rng, threads):
    """Each step waits for the one before by counting its finished chunks (csrc/program.c, ckernels.set_step_waits),
    so a thread that took every chunk goes on without a descheduled one, which later passes the steps it missed. On
    this 2-core host three threads are descheduled in turn: thirty runs each way, stolen chunks or fixed parts, all
    give the barriers' output bit for bit, and the reference's."""
    g = _network(rng, 1)
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
    outs = {}
    with _restored(ckernels.set_step_waits, ckernels.set_steal_chunks):
        for waits in (False, True):
            for k in (1, 8):
                assert ckernels.set_step_waits(waits) is waits and ckernels.set_steal_chunks(k) == k
                fused, _ = _sessions(g, threads)
                outs[waits, k] = [fused.run({"x": x})[g.outputs[0]].copy() for _ in range(30)]
    first = outs[False, 1][0]
    assert all(np.array_equal(first, o) for runs in outs.values() for o in runs)
    assert rel_err(first, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("nb", [1, 2])
def test_grouped_windows_split_by_rows_and_groups_match_row_splits(rng, nb):
    """At two threads a grouped window splits its rows x groups over the threads (csrc/gemm.c leti_conv_window_units;
    ckernels.set_window_units): a 7x7 map of 5 groups (35 units: 17 + 18, the split inside row 3) and a stride-2 one of
    3 rows; the outputs equal the row split's and the numba steps' bit for bit, and the reference."""
    c = _Chain((nb, 7, 7, 40), rng)
    c.add("grouped_conv2d", [c.w(3, 3, 8, 40), c.w(40)], strides=[1, 1], padding="same", groups=5, activation="relu")
    c.add("grouped_conv2d", [c.w(3, 3, 8, 20, scale=0.2), c.w(20)], strides=[2, 2], padding="same", groups=5)
    g = c.graph()
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
    outs = {}
    with _restored(ckernels.set_window_units):
        for units in (True, False):
            ckernels.set_window_units(units)
            fused, single = _sessions(g, 2)
            outs[units] = fused.run({"x": x})[g.outputs[0]]
        b = single.run({"x": x})[g.outputs[0]]
    assert np.array_equal(outs[True], outs[False]) and np.array_equal(outs[True], b)
    assert rel_err(outs[True], run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("nb", [1, 2])
def test_one_pixel_convolutions_run_as_the_packed_gemv(rng, threads, nb):
    """A squeeze-excite's 1×1 convolutions on the pooled 1×1 map (and a 1×1 classifier convolution) are
    matrix-vector products over packed panels at batch 1 (odd sizes: a partial last panel, an odd k), products
    at batch 2; both paths give the reference's outputs."""
    from leti.engine.backends.cpu import native

    c = _Chain((nb, 6, 5, 37), rng)
    c.add("mean", axes=[1, 2], keepdims=True)
    c.add("conv2d", [c.w(1, 1, 37, 9), c.w(9)], padding="same", activation="relu")
    c.add("conv2d", [c.w(1, 1, 9, 37), c.w(37)], padding="same")
    c.add("conv2d", [c.w(1, 1, 37, 1001, scale=0.05), c.w(1001)], padding="valid", activation="relu6")
    g = c.graph()
    fused, single = _sessions(g, threads)
    kinds = fused._program[0].table[:, 0].tolist()
    assert kinds.count(native.GEMV) == (3 if nb == 1 else 0)
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32) * 3
    a, b = fused.run({"x": x})[g.outputs[0]], single.run({"x": x})[g.outputs[0]]
    ref = run_reference(g, {"x": x})[g.outputs[0]]
    assert rel_err(a, ref) < 1e-4 and rel_err(b, ref) < 1e-4


# one xdist worker runs every parameter (make test: --dist loadgroup): numba compiles the kernels once, not once per
# worker at the same moment (the disk cache is only written when a compile ends)
@pytest.mark.xdist_group("numba-jit")
@needs_program
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("nb, c_in", [(1, 16), (2, 13)])
def test_native_pooling_sums_and_concatenations(rng, threads, nb, c_in):
    """An NB101-like cell: max pooling at strides 1 and 2, average pooling (taps inside the input only), a sum with
    an activation, a concatenation along channels; a channel count that is not a multiple of 8 takes the scalar
    tails."""
    c = _Chain((nb, 11, 9, c_in), rng)
    a = c.add("conv2d", [c.w(1, 1, c_in, c_in), c.w(c_in)], padding="same", activation="relu")
    p = c.add("max_pool2d", inputs=[a], kernel=[3, 3], strides=[1, 1], padding="same")
    q = c.add("avg_pool2d", inputs=[a], kernel=[3, 3], strides=[1, 1], padding="same")
    r = c.add("add", inputs=[p, q], activation="relu6")
    u = c.add("concat", inputs=[a, r, p], axis=-1)
    u = c.add("pad", inputs=[u], pads=[[0, 0], [1, 2], [0, 1], [0, 0]])  # zeros around the map: a copy per image
    v = c.add("max_pool2d", inputs=[u], kernel=[3, 3], strides=[2, 2], padding="same")
    c.add("avg_pool2d", inputs=[v], kernel=[2, 3], strides=[2, 2], padding="same")
    g = c.graph()
    fused, single = _sessions(g, threads)
    # concat: a record per input; pad: one per image
    assert len(fused._program) == 1 and fused._program[0].steps == len(fused.steps) + 2 + nb - 1
    for _ in range(2):
        x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
        a_, b_ = fused.run({"x": x})[g.outputs[0]], single.run({"x": x})[g.outputs[0]]
        assert np.allclose(a_, b_, rtol=1e-6, atol=1e-6)
        assert rel_err(a_, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_native_winograd_matches_the_numba_transforms(rng, monkeypatch, threads, n):
    """F(2x2), F(3x3), F(4x4) (alpha 4, 5, 6) from 29 channels to 21 (the transforms' blocks of 16 channels, of 8, and a
    masked tail), two images, tiles cut by the map's edge, in blocks of tiles, with a residual added after the output
    transform."""
    from leti.engine.backends.cpu import conv

    monkeypatch.setattr(conv, "WINOGRAD_BLOCK_MIN", 8)
    monkeypatch.setattr(conv, "WINOGRAD_BLOCK_BYTES", 9 * (n + 2) ** 2 * (29 + 21) * 4)  # 9 tiles a block
    c = _Chain((2, 13, 11, 29), rng)
    skip = c.add("conv2d", [c.w(1, 1, 29, 21), c.w(21)], padding="same")
    y = c.add("conv2d", [c.w(3, 3, 29, 21, scale=0.2), c.w(21)], inputs=["x"], padding="same", activation="relu")
    c.add("add", inputs=[y, skip], activation="relu6")
    g = c.graph()
    opts = dict(conv_scheme="winograd", winograd_max_tile=n)
    fused = Session(g, backends=(CPUBackend(threads=threads),), **opts).resize()
    single = Session(g, backends=(CPUBackend(threads=threads, native=False),), **opts).resize()
    wino = [st for st in fused.steps if st.scheme.name == "winograd"]
    assert len(wino) == 1 and len(fused._program) == 1
    n = wino[0].scheme.params["n"]  # the largest tile up to n that the cost model prefers
    tiles = 2 * -(-13 // n) * -(-11 // n)
    assert fused._program[0].steps == 1 + 3 * -(-tiles // 9) + 1  # the 1x1, three records a block, the residual
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
    a, b = fused.run({"x": x})[g.outputs[0]], single.run({"x": x})[g.outputs[0]]
    assert np.allclose(a, b, rtol=1e-5, atol=1e-5)
    assert rel_err(a, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
def test_an_op_without_records_splits_the_program(rng):
    c = _Chain((1, 12, 12, 8), rng)
    c.add("conv2d", [c.w(1, 1, 8, 16), c.w(16)], padding="same", activation="relu")
    c.add("resize_nearest", scale=[2, 2])  # no record: the steps before and after it make two programs
    c.add("conv2d", [c.w(1, 1, 16, 16), c.w(16)], padding="same")
    g = c.graph()
    s = Session(g, backends=(CPUBackend(threads=1),)).resize()
    assert [type(p).__name__ for p in s._program] == ["Program", "BoundStep", "Program"]
    x = rng.standard_normal((1, 12, 12, 8)).astype(np.float32)
    assert rel_err(s.run({"x": x})[g.outputs[0]], run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
def test_a_strided_constant_operand_keeps_its_run_step_by_step(rng):
    """A kernel reads its operands in place as C-ordered float32: a run with a strided constant (here a transposed
    view concatenated to a map) is not made a program, and the steps give the right answer one by one."""
    c = _Chain((1, 4, 5, 6), rng)
    a = c.add("conv2d", [c.w(1, 1, 6, 3), c.w(3)], padding="same")
    strided = np.ascontiguousarray(rng.standard_normal((2, 5, 4, 1)).astype(np.float32)).transpose(3, 2, 1, 0)
    assert not strided.flags.c_contiguous
    k = c.g.add_constant("strided", strided)
    c.add("concat", inputs=[a, k], axis=-1)
    g = c.graph()
    s = Session(g, backends=(CPUBackend(threads=1),)).resize()
    assert not any(isinstance(p, Program) for p in s._program)
    x = rng.standard_normal((1, 4, 5, 6)).astype(np.float32)
    assert rel_err(s.run({"x": x})[g.outputs[0]], run_reference(g, {"x": x})[g.outputs[0]]) < 1e-5


def test_a_library_built_without_openmp_runs_steps_one_by_one(monkeypatch, tmp_path, rng):
    """A compiler without OpenMP still builds the kernels; programs are then not made (they would run on one thread)."""
    if ckernels._cpu_supported():
        pytest.skip(f"no AVX2/FMA here: {ckernels._cpu_supported()}")
    ckernels.library()  # the real library first: its symbols stay the ones numba resolves in this process
    try:
        monkeypatch.delenv("LETI_BLAS", raising=False)
        monkeypatch.setenv("LETI_CACHE_DIR", str(tmp_path))
        monkeypatch.setattr(ckernels, "OPENMP", ("-fno-such-openmp-flag",))  # the first compile fails
        monkeypatch.setattr(ckernels, "FLAGS", ("-O0", *ckernels.FLAGS[1:]))  # 10 s to build, not 45
        ckernels.library.cache_clear()
        ckernels.program_runner.cache_clear()
        assert ckernels.library() is not None
        runner = ckernels.program_runner()
        assert runner is not None and runner[1] is False
        c = _Chain((1, 6, 6, 8), rng)
        c.add("conv2d", [c.w(1, 1, 8, 8), c.w(8)], padding="same")
        s = Session(c.graph(), backends=(CPUBackend(threads=2),)).resize()
        assert not any(isinstance(p, Program) for p in s._program)
    finally:
        monkeypatch.undo()
        ckernels.library.cache_clear()
        ckernels.program_runner.cache_clear()
        ckernels.library()


def _all_in_one_program(fused):
    assert len(fused._program) == 1 and isinstance(fused._program[0], Program), \
        [getattr(p, "op", "program") for p in fused._program]


def _same_as_steps_and_reference(g, fused, single, rng, rtol=1e-5):
    for _ in range(2):
        x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32) * 2
        a, b = fused.run({"x": x})[g.outputs[0]], single.run({"x": x})[g.outputs[0]]
        assert np.allclose(a, b, rtol=rtol, atol=1e-6), np.max(np.abs(a - b))
        assert rel_err(a, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("nb", [1, 2])
def test_native_activations_and_broadcast_products(rng, threads, nb):
    """Activations as ops of their own (sigmoid, hard-swish, hard-sigmoid, relu6, relu), a squeeze-excite product
    (a channel vector per image: at batch 2 each image its own), a product by a scalar, a sum with a channel vector,
    a same-shape product (swish) and an unfolded batch norm: each a record of csrc/pointwise.c, all in one program.
    20 channels: two vectors and a masked tail."""
    c = _Chain((nb, 9, 11, 20), rng)
    x = c.add("conv2d", [c.w(1, 1, 20, 20), c.w(20)], padding="same")
    s = c.add("sigmoid")
    c.add("mul", inputs=[x, s])  # swish
    h = c.add("hard_swish")
    c.add("mean", axes=[1, 2], keepdims=True)
    c.add("hard_sigmoid", alpha=0.2, beta=0.5)
    c.add("mul", inputs=[c.last, h])  # the squeeze-excite scaling, the vector first
    c.add("mul", [np.float32(0.7)])
    c.add("add", [c.w(1, 1, 1, 20)], activation="relu6")
    c.add("sigmoid")
    c.add("batch_norm", [c.w(20) + 1, c.w(20), c.w(20), np.abs(c.w(20)) + 0.5], epsilon=1e-3)
    c.add("relu")
    c.add("relu6")
    g = c.graph()
    fused, single = _sessions(g, threads)
    _all_in_one_program(fused)
    assert {"sigmoid", "hard_swish", "hard_sigmoid", "mul", "batch_norm", "relu", "relu6"} <= {
        st.op for st in fused.steps}
    _same_as_steps_and_reference(g, fused, single, rng)


@needs_program
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k, stride, dilation, ch, padding", [
    (5, 1, 1, 20, "same"), (5, 2, 1, 72, "same"), (7, 2, 1, 13, "same"), (5, 1, 2, 16, "same"), (7, 1, 1, 8, "valid"),
    (3, 1, 1, 8, "same")])
def test_native_depthwise_of_any_window(rng, threads, k, stride, dilation, ch, padding):
    """Depthwise windows other than the 3×3 kernel's (and a 3×3 with its kernel forced out: the generic loop's strips
    of four interior pixels and its border pixels), at batch 2, against the numba kernel and the reference."""
    c = _Chain((2, 15, 18, ch), rng)
    c.add("depthwise_conv2d", [c.w(k, k, ch), c.w(ch)], strides=[stride, stride], dilations=[dilation, dilation],
          padding=padding, activation="relu6")
    g = c.graph()
    fused, single = _sessions(g, threads)
    _all_in_one_program(fused)
    if k == 3:  # the generic record on a 3x3 window
        from leti.engine.backends.cpu import native
        st = fused.steps[0]
        w = g.constants[st.inputs[1]]
        rec = native.dwconv(st.in_views[0], w, g.constants[st.inputs[2]], True, st.out_views[0], 1, 1, 1, 1, 1, 1, 2)
        assert rec[0][0] == native.DWCONV_K
        fused._program = [Program(rec, ckernels.program_runner()[0])]
    _same_as_steps_and_reference(g, fused, single, rng)


@needs_program
@pytest.mark.parametrize("threads", [1, 2])
def test_native_channel_shuffle_slices_sums_and_concat(rng, threads):
    """ShuffleNet's channel shuffle (a swap of the last two axes between reshapes), channel slices, a sum of three
    tensors with an activation and a concatenation with one: one program. (The sum reads its first input twice: its
    output must not take over that buffer, passes.inplace_candidates; before, both paths gave a wrong sum.)"""
    c = _Chain((2, 6, 5, 28), rng)
    c.add("conv2d", [c.w(1, 1, 28, 28), c.w(28)], padding="same")
    c.add("reshape", shape=[2, 6, 5, 2, 14])
    c.add("transpose", perm=[0, 1, 2, 4, 3])
    t = c.add("reshape", shape=[2, 6, 5, 28])
    a = c.add("slice", inputs=[t], begin=[0, 0, 0, 0], size=[-1, -1, -1, 14])
    b = c.add("slice", inputs=[t], begin=[0, 0, 0, 14], size=[-1, -1, -1, 14])
    s = c.add("add_n", inputs=[a, b, a], activation="relu")
    c.add("concat", inputs=[s, b], axis=-1, activation="relu6")
    g = c.graph()
    fused, single = _sessions(g, threads)
    _all_in_one_program(fused)
    _same_as_steps_and_reference(g, fused, single, rng)


@needs_program
@pytest.mark.parametrize("threads", [1, 2])
def test_the_step_clock_times_each_step_inside_the_running_program(rng, threads):
    """``Session.profile(in_run=True)``: a native program's steps timed by its step clock (``leti_set_step_clock``)
    inside whole runs: every record's time positive, together no more than the run's wall time, each step given its
    own records' time, and the clock unset afterwards (the runs after it write nothing)."""
    import time

    g = _network(rng, 1)
    fused, _ = _sessions(g, threads)
    prog = fused._program[0]
    assert len(prog.owners) == prog.steps and set(map(id, prog.owners)) <= set(map(id, fused.steps))
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
    fused.run({"x": x})
    for b in fused.backends:
        b.begin_run()
    try:
        t0 = time.perf_counter()
        secs = prog.clocked()
        wall = time.perf_counter() - t0
    finally:
        for b in fused.backends:
            b.end_run()
    assert secs.shape == (prog.steps,) and (secs > 0).all() and secs.sum() <= wall
    rows = fused.profile({"x": x}, runs=3, in_run=True)
    owned = {id(o) for o in prog.owners}
    for st, row in zip(fused.steps, rows):
        assert (row["ms"] > 0) == (id(st) in owned), (st.name, row["ms"])
    before = prog._clock.copy()
    y = fused.run({"x": x})[g.outputs[0]]
    assert np.array_equal(prog._clock, before)  # unset: a plain run writes no clock
    assert rel_err(y, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


def _expand_depthwise(rng, h, w, c_in, c_mid, stride, padding, read_twice=False):
    """MobileNet v2's expansion: a 1x1 convolution, then a 3x3 depthwise convolution over its output and a 1x1
    projection; with ``read_twice`` the expansion's output is also added to the depthwise output (stride 1)."""
    c = _Chain((1, h, w, c_in), rng)
    mid = c.add("conv2d", [c.w(1, 1, c_in, c_mid), c.w(c_mid)], padding="same", activation="relu6")
    d = c.add("depthwise_conv2d", [c.w(3, 3, c_mid), c.w(c_mid)], strides=[stride, stride], padding=padding,
              activation="relu6")
    if read_twice:
        c.add("add", inputs=[d, mid])
    c.add("conv2d", [c.w(1, 1, c_mid, 8), c.w(8)], padding="same")
    return c.graph()


def _fused_records(session) -> int:
    return sum(int(p.table[i, 0] == native.GEMM_DWCONV) for p in session._program if isinstance(p, Program)
               for i in range(p.steps))


@needs_program
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("h, w, c_in, c_mid, stride, padding", [(23, 17, 16, 96, 2, "same"), (20, 21, 24, 40, 1, "same"),
                                                                (19, 16, 8, 32, 2, "valid"), (9, 30, 5, 24, 1, "valid"),
                                                                (14, 20, 300, 32, 1, "same")])
def test_a_product_fused_into_the_depthwise_convolution_after_it_gives_the_same_bits(
        rng, monkeypatch, threads, h, w, c_in, c_mid, stride, padding):
    """A 1x1 convolution whose output only a 3x3 depthwise convolution reads runs inside it, band by band
    (csrc/program.c STEP_GEMM_DWCONV): bands of one output row (the rows two bands share moved, not computed again), of
    several, and the whole product at once give the unfused program's output bit for bit, at one to three threads
    (parts that compute their first rows' inputs themselves), odd sizes, channels in partial vectors, padded or not, and
    k = 300 (more than one k block: the bands take the whole product's order, whole k or k blocks, on AVX2 too)."""
    monkeypatch.setattr(native, "FUSE_MIN_BYTES", 0)
    monkeypatch.setattr(native, "FUSE_MIN_ROWS_THREADED", 0)
    monkeypatch.setattr(native, "FUSE_WIDE_ROWS_THREADED", 0)
    g = _expand_depthwise(rng, h, w, c_in, c_mid, stride, padding)
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
    plain = Session(g, backends=(CPUBackend(threads=threads, fuse=False),)).resize()
    fused = Session(g, backends=(CPUBackend(threads=threads),)).resize()
    assert _fused_records(plain) == 0 and _fused_records(fused) == 1
    want = plain.run({"x": x})[g.outputs[0]].copy()
    with _restored(ckernels.set_fuse_band_kb):
        for kb in (1, 16, 0):
            assert ckernels.set_fuse_band_kb(kb) == kb
            for _ in range(2):
                assert np.array_equal(fused.run({"x": x})[g.outputs[0]], want), kb
    assert rel_err(want, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_product_output_stays_out_of_the_arena_and_a_step_by_step_run_still_has_it(rng, monkeypatch, threads):
    """The fused pair never stores the product's output, so the memory plan leaves it out (Session._bind): the arena
    shrinks by about that tensor, and the tensor gets pages of its own, which the fused program never touches but a
    step-by-step run (the per-op profile) writes and reads: both give the unfused program's bits."""
    monkeypatch.setattr(native, "FUSE_MIN_BYTES", 0)
    monkeypatch.setattr(native, "FUSE_MIN_ROWS_THREADED", 0)
    monkeypatch.setattr(native, "FUSE_WIDE_ROWS_THREADED", 0)
    g = _expand_depthwise(rng, 24, 20, 16, 96, 2, "same")
    x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
    plain = Session(g, backends=(CPUBackend(threads=threads, fuse=False),)).resize()
    fused = Session(g, backends=(CPUBackend(threads=threads),)).resize()
    assert _fused_records(fused) == 1
    expansion = next(st for st in fused.steps if st.op == "depthwise_conv2d").inputs[0]
    assert expansion in plain.memory["host"].offsets and expansion not in fused.memory["host"].offsets
    saved = plain.memory["host"].arena_bytes - fused.memory["host"].arena_bytes
    assert saved >= 0.9 * fused._views[expansion].nbytes, (saved, fused._views[expansion].nbytes)
    want = plain.run({"x": x})[g.outputs[0]].copy()
    assert np.array_equal(fused.run({"x": x})[g.outputs[0]], want)
    fused._views[expansion][...] = np.nan  # whatever the side pages hold, a fused run never reads them
    assert np.array_equal(fused.run({"x": x})[g.outputs[0]], want)
    fused.profile({"x": x}, runs=2)  # each step on its own: the product writes its output, the depthwise reads it
    assert np.isfinite(fused._views[expansion]).all()
    assert np.array_equal(fused.run({"x": x})[g.outputs[0]], want)
    # a 3x3 convolution before a depthwise one (a stem) is no product: its output stays in the arena, as it is stored
    c = _Chain((1, 24, 20, 3), rng)
    stem = c.add("conv2d", [c.w(3, 3, 3, 32), c.w(32)], strides=[2, 2], padding="same", activation="relu6")
    c.add("depthwise_conv2d", [c.w(3, 3, 32), c.w(32)], padding="same", activation="relu6")
    s = Session(c.graph(), backends=(CPUBackend(threads=threads),)).resize()
    assert stem in s.memory["host"].offsets and _fused_records(s) == 0


@needs_program
def test_a_product_read_by_another_step_or_too_small_is_not_fused(rng, monkeypatch):
    """The fusion never computes a tensor another step reads: the expansion's output added to the depthwise output stays
    a product of its own; under FUSE_MIN_BYTES (what fits L2) nothing fuses; at 0 the same graph without the add does."""
    x_shape = (1, 12, 12, 8)
    x = rng.standard_normal(x_shape).astype(np.float32)
    shared = _expand_depthwise(rng, 12, 12, 8, 16, 1, "same", read_twice=True)
    alone = _expand_depthwise(rng, 12, 12, 8, 16, 1, "same")
    assert _fused_records(Session(alone, backends=(CPUBackend(threads=1),)).resize()) == 0  # 9 KB < FUSE_MIN_BYTES
    monkeypatch.setattr(native, "FUSE_MIN_BYTES", 0)
    assert _fused_records(Session(alone, backends=(CPUBackend(threads=1),)).resize()) == 1
    s = Session(shared, backends=(CPUBackend(threads=1),)).resize()
    assert _fused_records(s) == 0
    assert rel_err(s.run({"x": x})[shared.outputs[0]], run_reference(shared, {"x": x})[shared.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("threads", [2, 3])
def test_on_more_than_one_thread_a_pair_over_few_rows_is_not_fused(rng, monkeypatch, threads):
    """On more than one thread a pair fuses only from FUSE_MIN_ROWS_THREADED input rows (its parts, one per thread,
    compute the rows they share twice and cannot be stolen), and below FUSE_WIDE_ROWS_THREADED only a product of at most
    FUSE_MAX_K_THREADED inner products; one thread fuses any. The memory plan follows the same rule: the unfused
    product's output has its place in the arena, and both give the same output as ever."""
    monkeypatch.setattr(native, "FUSE_MIN_BYTES", 0)
    monkeypatch.setattr(native, "FUSE_MIN_ROWS_THREADED", 20)
    monkeypatch.setattr(native, "FUSE_WIDE_ROWS_THREADED", 24)
    for h, k, fused_on_many in ((19, 8, 0), (20, 8, 1), (20, 48, 0), (24, 48, 1)):
        g = _expand_depthwise(rng, h, 16, k, 32, 1, "same")
        x = rng.standard_normal(g.tensors["x"].shape).astype(np.float32)
        one = Session(g, backends=(CPUBackend(threads=1),)).resize()
        many = Session(g, backends=(CPUBackend(threads=threads),)).resize()
        assert _fused_records(one) == 1 and _fused_records(many) == fused_on_many, (h, k)
        expansion = next(st for st in many.steps if st.op == "depthwise_conv2d").inputs[0]
        assert (expansion in many.memory["host"].offsets) == (not fused_on_many)
        want = one.run({"x": x})[g.outputs[0]].copy()
        assert np.array_equal(many.run({"x": x})[g.outputs[0]], want), (h, k)
        assert rel_err(want, run_reference(g, {"x": x})[g.outputs[0]]) < 1e-4


@needs_program
@pytest.mark.parametrize("c, beta", [(1000, 1.0), (13, 2.5), (7, 1.0)])
def test_native_softmax_matches_the_numba_step_and_the_reference(rng, c, beta):
    """The program's softmax (csrc/pointwise.c, leti_softmax_rows: eight lanes through exp8, a masked tail) over rows of
    1000 (a classifier), 13 and 7 (only the tail) outputs: the numba step's values and the reference's within 1e-6,
    each row summing to 1; an input far below the row's maximum gives 0, not a denormal or NaN."""
    ch = _Chain((3, c), rng)
    ch.add("softmax", beta=beta)
    g = ch.graph()
    x = rng.standard_normal((3, c)).astype(np.float32) * 4
    x[1, c - 1] = -1e4
    fused, single = _sessions(g, 1)
    assert any(isinstance(p, Program) for p in fused._program)
    a = fused.run({"x": x})[g.outputs[0]]
    assert np.abs(a - single.run({"x": x})[g.outputs[0]]).max() < 1e-6
    assert np.abs(a - run_reference(g, {"x": x})[g.outputs[0]]).max() < 1e-6
    assert np.allclose(a.sum(axis=1), 1.0, atol=1e-5) and a[1, c - 1] == 0.0 and np.isfinite(a).all()
