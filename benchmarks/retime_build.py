"""Time part of a kernel build again after the runtime changed (issue 16): the items of a build store that the
change can have moved, measured with the build's own protocol and stored in place of their old measurement; and
``--add TYPE=N``: N more kernels of one type drawn by the build's sampler (a type the build left thin); and
``--networks-total N``: more calibration networks, up to N in all.

Every ratio is to the build's reference kernel, and the store converts ratios to milliseconds with one build-wide
reference time (the median of the items' reference means): a change that moves the reference itself (session 18:
the engine's native programs made the reference convolution 1.8x faster) needs every item re-timed, the
calibration chains and the probes included (``--calibration --probes``).

Why: a kernel build is ~45 minutes of measurement. When the engine changes in a way that moves only some kernels
(session 15: the GEMM fetches the next panel of weights ahead, which speeds up products whose weights are not in
the core's caches), re-timing those kernels and the calibration networks keeps the rest of the build, whose
kernels run the same code as before. Everything else about the store (plan, rounds, spent budget) is left as it
was; refit afterwards with ``leti kernels build ... --budget-minutes <the spent budget>``.

    PYTHONPATH=. python benchmarks/retime_build.py --store kp/kernels.sqlite --device engine \\
        --kernels-min-weights 512000 --networks
    PYTHONPATH=. python benchmarks/retime_build.py --store kp/kernels.sqlite --device engine \\
        --kernel-types grouped_conv2d --narrow-tail-max 72 --networks      (session 16: narrow panels, groups of 8)
    PYTHONPATH=. python benchmarks/retime_build.py --store kp/kernels.sqlite --device engine \\
        --winograd-multipass --networks                                    (session 16: Winograd in tile blocks)
    PYTHONPATH=. python benchmarks/retime_build.py --store kp/kernels.sqlite --device engine \
        --one-pixel-products --networks --calibration                      (session 21: the packed matrix-vector product)
    PYTHONPATH=. python benchmarks/retime_build.py --store kp/kernels.sqlite --device engine \
        --measured-before 2026-11-28                                       (session 21: another host)

Items are re-split as they are timed (the kernel rows stored with a network are the current split's). Added
kernels join the store's last round with origin ``added`` (the refit uses them like any other).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def narrow_tail(k: dict, c_max: int) -> bool:
    """A convolution kernel that session 16's engine runs differently: a last weight panel of at most 8 columns
    over 12 or more rows takes 12-row tiles, a strided 1×1 window reads its input in place."""
    if k["kernel_type"] not in ("conv2d", "grouped_conv2d"):
        return False
    n, rows = int(k["output_c"]), int(k["output_h"]) * int(k["output_w"])
    return (n <= c_max and 1 <= n % 16 <= 8 and rows >= 12) or (int(k["kernel_h"]) == 1 and int(k["stride"]) > 1)


def winograd_multipass(k: dict) -> bool:
    """A convolution that session 16's blocked Winograd runs in more than one pass at some tile size (F(2×2) to
    F(4×4)); a superset of the kernels the change touches, since the scheme and tile are chosen at run time."""
    from leti.engine.backends.cpu.conv import winograd_block

    if k["kernel_type"] != "conv2d" or int(k["stride"]) != 1 or int(k["kernel_h"]) not in (3, 5, 7):
        return False
    oh, ow, ic, oc, kh = (int(k[c]) for c in ("output_h", "output_w", "input_c", "output_c", "kernel_h"))
    for n in (2, 3, 4):
        tiles = -(-oh // n) * -(-ow // n)
        if winograd_block(tiles, n + kh - 1, ic, oc) < tiles:
            return True
    return False


def one_pixel_product(k: dict) -> bool:
    """A product with one input row at batch 1 that session 21's engine runs as the packed matrix-vector product: a
    fully connected layer on one pixel, a stride-1 1×1 convolution on a 1×1 map."""
    one = int(k["output_h"]) * int(k["output_w"]) == 1
    return one and (k["kernel_type"] == "dense" or (k["kernel_type"] == "conv2d" and int(k["kernel_h"]) == 1
                                                    and int(k["kernel_w"]) == 1 and int(k["stride"]) == 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="a kernel build's kernels.sqlite (changed in place)")
    ap.add_argument("--device", default="engine")
    ap.add_argument("--kernels-min-weights", type=float, default=None,
                    help="re-time the single-kernel items with at least this many bytes of weights")
    ap.add_argument("--kernel-types", default="", metavar="T1,T2",
                    help="re-time every single-kernel item of these kernel types")
    ap.add_argument("--narrow-tail-max", type=int, default=None, metavar="C",
                    help="re-time the convolutions with at most C output channels whose last weight panel holds at "
                         "most 8 columns (C mod 16 in 1..8), and the strided 1x1 convolutions")
    ap.add_argument("--winograd-multipass", action="store_true",
                    help="re-time the stride-1 square-window convolutions whose Winograd tiles take more than one "
                         "pass under the engine's tile blocks (leti.engine.backends.cpu.conv.winograd_block)")
    ap.add_argument("--one-pixel-products", action="store_true",
                    help="re-time the fully connected layers and 1x1 convolutions with one output pixel (batch 1)")
    ap.add_argument("--measured-before", default=None, metavar="YYYY-MM-DD",
                    help="re-time every item (kernels, chains, networks, probes) measured before this day: the host "
                         "changed (session 21: a Zen 5 runs the reference kernel in 0.059 ms, session 19's host 0.078)")
    ap.add_argument("--networks", action="store_true", help="re-time every calibration network")
    ap.add_argument("--calibration", action="store_true", help="re-time every calibration chain")
    ap.add_argument("--probes", action="store_true",
                    help="re-time the near-empty probes (the per-invoke cost subtracted from every kernel)")
    ap.add_argument("--add", action="append", default=[], metavar="TYPE=N",
                    help="draw N more kernels of TYPE with the build's sampler and measure them (repeatable)")
    ap.add_argument("--networks-total", type=int, default=None, metavar="N",
                    help="plan and measure calibration networks up to N in all (the build's own seed draws them)")
    ap.add_argument("--seed", type=int, default=15, help="the sampler's seed for --add")
    args = ap.parse_args(argv)

    import numpy as np

    from leti.device.registry import open_device
    from leti.predict.kernels.bench import KERNEL_PROTOCOL, KernelBench
    from leti.predict.kernels.build_store import BuildStore
    from leti.predict.kernels.build import _items
    from leti.predict.kernels.sampler import KernelConfig, KernelSampler
    from leti.predict.kernels.split import FusionRules

    if not args.store.is_file():
        print(f"error: {args.store}: no such build store", file=sys.stderr)
        return 2
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    with BuildStore(args.store) as store, open_device(args.device, threads=1) as dev:
        bench = KernelBench(dev, args.store.parent / ".work", KERNEL_PROTOCOL)
        bench.rules = FusionRules.from_dict(store.get("rules"))
        todo = []  # (kind, item row as a dict, its old ratio or None for an added kernel)
        types = {t for t in args.kernel_types.split(",") if t}
        old_host = lambda r: args.measured_before is not None and str(r["measured_at"]) < args.measured_before  # noqa: E731
        for r in store.measured("kernel").to_dict("records"):
            k = r["kernels"][0]
            if (old_host(r) or (args.kernels_min_weights is not None
                 and float(k.get("bytes_weights", 0.0)) >= args.kernels_min_weights)
                    or k["kernel_type"] in types
                    or (args.narrow_tail_max is not None and narrow_tail(k, args.narrow_tail_max))
                    or (args.winograd_multipass and winograd_multipass(k))
                    or (args.one_pixel_products and one_pixel_product(k))):
                todo.append(("kernel", r, r["ratio"]))
        for kind, every in (("network", args.networks), ("calibration", args.calibration), ("probe", args.probes)):
            todo += [(kind, r, r["ratio"]) for r in store.measured(kind).to_dict("records") if every or old_host(r)]
        if args.add:
            sampler, rng = KernelSampler(), np.random.default_rng(args.seed)
            for spec in args.add:
                t, _, n = spec.partition("=")
                if t not in sampler.kernel_types or not n.isdigit():
                    print(f"error: --add {spec!r}: want TYPE=N with TYPE one of {', '.join(sampler.kernel_types)}",
                          file=sys.stderr)
                    return 2
                before = {r["id"] for r in store.pending("kernel")}
                store.plan("kernel", _items(sampler.draw(t, int(n), rng), "added"), max(len(store.rounds()) - 1, 0))
                todo += [("added", r, None) for r in store.pending("kernel") if r["id"] not in before]
        if args.networks_total is not None:
            from leti.predict.kernels.build import plan_networks

            before = {r["id"] for r in store.pending("network")}
            plan_networks(store, args.networks_total, int((store.get("identity") or {}).get("seed", 0)))
            todo += [("added network", r, None) for r in store.pending("network") if r["id"] not in before]
        print(f"re-timing {len(todo)} items of {args.store}", flush=True)
        moved: dict[str, list[float]] = {}
        for i, (kind, r, old) in enumerate(todo):
            start = time.perf_counter()
            try:
                if kind.endswith("network"):
                    timed = bench.network(r["config"]["params"], stem=r["name"])
                elif kind == "calibration":
                    timed = bench.chain([KernelConfig.from_dict(d) for d in r["config"]["steps"]],
                                        seed=int(r["config"]["seed"]), stem=r["name"])
                else:
                    timed = bench.kernel(KernelConfig.from_dict(r["config"]), seed=int(r["id"]), stem=r["name"])
            except Exception as exc:  # noqa: BLE001 - one model that cannot be built or run is reported, not fatal
                msg = f"{type(exc).__name__}: {str(exc)[:300]}"
                if old is None:  # a new kernel: recorded as failed, as the build records it
                    store.failed(int(r["id"]), msg, time.perf_counter() - start)
                else:  # a re-time: the old measurement stays
                    print(f"  {r['name']}: kept its old measurement ({msg})", flush=True)
                continue
            store.done(int(r["id"]), timed.kernels, timed.measurement, time.perf_counter() - start)
            moved.setdefault(kind, []).append(timed.measurement.ratio / (old or 1.0))
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{len(todo)}", flush=True)
        bench.close()
    for kind, m in moved.items():
        q = np.percentile(m, [10, 50, 90])
        what = "ratio to the reference" if kind.startswith("added") else "new / old ratio"
        print(f"{kind}: {len(m)} items, {what} 10 % {q[0]:.3f}, median {q[1]:.3f}, 90 % {q[2]:.3f}")
    print(f"{time.perf_counter() - t0:.0f} s; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
