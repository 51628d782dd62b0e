"""One convolution timed over a range of channel counts: where a runtime's speed per FLOP jumps with the shape.

Each kernel is a single-kernel model timed with the kernel build's protocol against the build's reference kernel
(:class:`~leti.predict.kernels.bench.KernelBench`) and turned into ms the way the build does, so the figures sit on
the same scale as the store's kernels. Session 36 found with it that XNNPACK on an AVX-512 Zen 5 runs a product in
32-wide panels only when the last panel holds more than 16 channels (10×10×240 → N: 182-188 GFLOP/s for N ≡ 16
mod 32, 226-233 for N ≡ 0), which became the ``TILING_V3`` kernel features.

    PYTHONPATH=. python benchmarks/sweep_kernel_channels.py --store kp/ --pixels 10 --cin 240 --cout 16:512:16
    PYTHONPATH=. python benchmarks/sweep_kernel_channels.py --store kp/ --pixels 10 --cin 16:512:16 --cout 240
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def counts(text: str) -> list[int]:
    """``"240"``, ``"16,32,48"`` or ``"16:512:16"`` (start:stop:step, stop included)."""
    if ":" in text:
        a, b, c = (int(v) for v in text.split(":"))
        return list(range(a, b + 1, c))
    return [int(v) for v in text.split(",")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="a kernel build's folder (its kernels.sqlite)")
    ap.add_argument("--device", default="local")
    ap.add_argument("--pixels", type=counts, default=[10], help="input height = width (list or range)")
    ap.add_argument("--cin", type=counts, default=[240])
    ap.add_argument("--cout", type=counts, default=counts("16:512:16"))
    ap.add_argument("--kernel", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1, help="passes over the whole sweep (medians printed)")
    args = ap.parse_args(argv)

    from leti.device.registry import open_device
    from leti.errors import LetiError
    from leti.models.kernel_models import KernelConfig
    from leti.predict.kernels.bench import KernelBench
    from leti.predict.kernels.build_fit import invoke_ms, kernel_ms, reference_ms
    from leti.predict.kernels.build_store import BuildStore

    db = args.store / "kernels.sqlite"
    if not db.is_file():
        print(f"error: {db}: no kernel build store there", file=sys.stderr)
        return 2
    with BuildStore(db) as store:
        ref = reference_ms(store)
        empty = invoke_ms(store, ref)
    cases = [(h, ci, co) for h in args.pixels for ci in args.cin for co in args.cout]
    dev = open_device(args.device, threads=1)
    bench = KernelBench(dev, Path(os.environ.get("TMPDIR", "/tmp")) / f"sweep_{os.getpid()}")
    load0, times = os.getloadavg()[0], {c: [] for c in cases}
    try:
        for _ in range(args.repeats):
            for i, (h, ci, co) in enumerate(cases):
                cfg = KernelConfig.from_dict({"kernel_type": "conv2d", "input_h": h, "input_w": h, "input_c": ci,
                                              "output_c": co, "kernel": args.kernel, "stride": 1, "padding": "same",
                                              "activation": ""})
                try:
                    times[(h, ci, co)].append(kernel_ms(bench.kernel(cfg, seed=i, stem=f"k{i}").ratio, ref, empty))
                except LetiError as exc:
                    print(f"error: conv2d {h}x{h}x{ci}->{co}: {exc}", file=sys.stderr)
    finally:
        bench.close()
    print(f"{'pixels':>7}{'cin':>6}{'cout':>6}{'cout%32':>8}{'ms':>10}{'GFLOP/s':>9}")
    for (h, ci, co), ms in times.items():
        if not ms:
            continue
        med = sorted(ms)[len(ms) // 2]
        gf = 2.0 * h * h * ci * co * args.kernel ** 2 / med / 1e6
        print(f"{h:>5}^2{ci:>6}{co:>6}{co % 32:>8}{med:>10.4f}{gf:>9.1f}")
    print(f"reference kernel {ref:.4f} ms (the store's); load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{time.process_time():.0f} s of CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
