"""``leti kernels build`` and ``leti kernels detect``: a device's kernel-level predictor and fusion rules."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from leti.errors import LetiError

kernels_app = typer.Typer(help="Kernel-level prediction of any model: measure a device's kernels and fusion rules.",
                          no_args_is_help=True)


def _open(device: str, threads: int):
    from leti.device.registry import KINDS, open_device
    from leti.predict.kernels.bench import RUNTIMES

    if threads < 1:
        raise LetiError(f"--threads must be a positive whole number, got {threads}")
    if device not in RUNTIMES or device not in KINDS:
        raise LetiError(f"--device {device!r}: kernels are measured on a device that runs models in this process: "
                        f"{', '.join(k for k in RUNTIMES if k in KINDS)}")
    return open_device(device, threads=threads)


@kernels_app.command("build")
def build_cmd(
    device: str = typer.Option("local", "--device", help="local (TFLite + XNNPACK) or engine (LETI's engine, CPU)."),
    budget_minutes: float = typer.Option(60.0, "--budget-minutes", help="Wall minutes for the whole build "
                                         "(conversion, measurement, fits), over every run of it."),
    out: Path = typer.Option(..., "--out", help="Folder of the predictor; a build there is continued."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler."),
    threads: int = typer.Option(1, "--threads", help="Threads the device runs a model with."),
    types: str = typer.Option("", "--types", help="Comma list of kernel types to sample (default: all)."),
    calibration: int = typer.Option(40, "--calibration", help="Multi-kernel calibration models (the overhead; "
                                    "none with --transfer-from)."),
    networks: Optional[int] = typer.Option(None, "--networks", help="Random whole networks timed end to end; with "
                                           "20 or more the overhead (per kernel type) is fitted on them, with fewer "
                                           "a transfer scales the source's (default 120 on TFLite, 60 on LETI's engine; "
                                           "8 with --transfer-from)."),
    detect: Optional[bool] = typer.Option(None, "--detect/--no-detect", help="Measure the fusion rules first (else: "
                                          "the runtime's rules known a priori, or the source's; default: detect, "
                                          "but not with --transfer-from)."),
    cache_probe: bool = typer.Option(True, "--cache-probe/--no-cache-probe", help="Measure what one-pixel kernels' "
                                     "weights cost once a network has pushed them out of the cache (a few seconds)."),
    cache_mb: float = typer.Option(0.0, "--cache-mb", help="MB of cache a model has to itself on the host the "
                                   "predictions are for, where the overhead's eviction term ramps (0: as the "
                                   "calibration networks had it; e.g. 24 for a quiet Zen 3 whose networks were "
                                   "timed under load)."),
    coverage: Optional[bool] = typer.Option(None, "--coverage/--no-coverage", help="Weigh each measured kernel by "
                                            "its closeness to real networks' kernels in the fits (default: as the "
                                            "build in --out was fitted; on for a new build)."),
    overhead: Optional[str] = typer.Option(None, "--overhead", help="The per-model overhead: fit (fitted on the "
                                           "calibration networks) or sum (none: the kernels' sum, the networks giving "
                                           "its spread); default: as the build in --out was fitted; fit for a new "
                                           "build."),
    transfer_from: Optional[Path] = typer.Option(None, "--transfer-from", help="Another device's kernel predictor "
                                                 "to adapt (kernel-level transfer): a few minutes of kernels, chosen "
                                                 "to correct its regressors per type, instead of an hour."),
) -> None:
    """Measure kernels of the device within a budget (adaptive sampling) and save its kernel predictor; with
    --transfer-from, adapt another device's kernel predictor to a few kernels measured here.

    Example: leti kernels build --device local --budget-minutes 60 --out kp/

    Example: leti kernels build --device engine --transfer-from kp/ --budget-minutes 5 --out kp_engine/
    """
    from leti.cli import output_folder
    from leti.cli.progress import progress
    from leti.predict.kernels.build import build_kernel_predictor, check_out
    from leti.predict.kernels.build_fit import OVERHEAD_FORMS

    if not budget_minutes > 0:
        raise LetiError(f"--budget-minutes must be above 0, got {budget_minutes:g}")
    if seed < 0 or calibration < 0 or (networks or 0) < 0:
        raise LetiError("--seed, --calibration and --networks must be zero or positive whole numbers")
    if cache_mb < 0 or (cache_mb and transfer_from is not None):
        raise LetiError(f"--cache-mb must be 0 or above and goes without --transfer-from, got {cache_mb:g}")
    if coverage is not None and transfer_from is not None:
        raise LetiError("--coverage/--no-coverage goes without --transfer-from (a transfer adapts the source's fits)")
    if overhead is not None and (transfer_from is not None or overhead not in OVERHEAD_FORMS):
        raise LetiError(f"--overhead takes {' or '.join(OVERHEAD_FORMS)}, and goes without --transfer-from; "
                        f"got {overhead!r}")
    check_out(out)
    dev = _open(device, threads)
    if transfer_from is not None:  # a source that cannot be adapted is refused before anything is written
        from leti.predict.kernels.bench import runtime_of
        from leti.predict.kernels.build_transfer import load_source

        load_source(transfer_from, dev.id, runtime_of(dev))
    output_folder(out)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    kinds = [t.strip() for t in types.split(",") if t.strip()] or None
    bar = progress()
    task = bar.add_task(f"kernels on {device}", total=int(budget_minutes * 60), start=False)

    def notify(spent: float, budget: float, what: str) -> None:
        if not bar.live.is_started:  # shown from the first step: a refused build prints its one error line only
            bar.start()
            bar.start_task(task)
        bar.update(task, completed=min(int(spent), int(budget)), description=f"{what[:40]:40s}")

    try:
        if transfer_from is not None:
            from leti.predict.kernels.build_transfer import TRANSFER_NETWORKS, build_transfer_predictor

            report = build_transfer_predictor(dev, out, budget_minutes, transfer_from, seed=seed, threads=threads,
                                              kernel_types=kinds, n_networks=TRANSFER_NETWORKS if networks is None
                                              else networks, detect=bool(detect), cache_probe=cache_probe,
                                              notify=notify)
        else:
            report = build_kernel_predictor(dev, out, budget_minutes, seed=seed, threads=threads, kernel_types=kinds,
                                            n_calibration=calibration, n_networks=networks,
                                            detect=detect is not False, cache_probe=cache_probe, cache_mb=cache_mb,
                                            coverage=coverage, overhead=overhead, notify=notify)
    finally:
        bar.stop()
    for note in report.notes:
        typer.echo(f"note: {note}")
    if report.pending:
        typer.echo(f"note: {report.pending} planned kernels wait for a larger --budget-minutes (rerun to continue)")
    typer.echo(f"wrote {out}: {report.summary()}")


@kernels_app.command("detect")
def detect_cmd(
    device: str = typer.Option("local", "--device", help="local (TFLite + XNNPACK) or engine (LETI's engine, CPU)."),
    out: Path = typer.Option(..., "--out", help="JSON file of the measured fusion rules (and the evidence)."),
    threads: int = typer.Option(1, "--threads", help="Threads the device runs a model with."),
    pairs: str = typer.Option("", "--pairs", help="Comma list of MAIN:FOLLOWER pairs (default: the common ones)."),
) -> None:
    """Detect which op pairs the device's runtime runs as one kernel, by timing A, B and A->B.

    Example: leti kernels detect --device local --out rules.json
    """
    from leti.cli import output_folder
    from leti.predict.kernels.detect import DEFAULT_PAIRS, detect_fusion

    if out.is_dir():
        raise LetiError(f"--out {out} is a folder; give the JSON file to write")
    chosen = DEFAULT_PAIRS
    if pairs.strip():
        chosen = tuple(tuple(p.split(":")) for p in pairs.split(",") if p.strip())
        from leti.models.kernel_models import BUILDABLE

        bad = [":".join(p) for p in chosen if len(p) != 2 or not set(p) <= set(BUILDABLE)]
        if bad:
            raise LetiError(f"--pairs expects MAIN:FOLLOWER items of kernel types ({', '.join(BUILDABLE)}), "
                            f"got {', '.join(bad)}")
    dev = _open(device, threads)
    output_folder(out.parent if str(out.parent) else Path("."), shown=out)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    evidence: list = []
    with dev:
        rules = detect_fusion(dev, chosen, evidence=evidence)
    for e in evidence:
        typer.echo(f"{e.main} -> {e.follower}: {e.verdict} (A {e.t_main:.4f} ms, B {e.t_follower:.4f} ms, "
                   f"A->B {e.t_pair:.4f} ms, empty {e.t_empty:.4f} ms)")
    doc = {**rules.to_dict(), "device": dev.id, "pairs": [e.to_dict() for e in evidence], "loadavg": os.getloadavg()}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out)
    fused = ", ".join(f"{m}+{f}" for m, fs in rules.fuse.items() for f in fs) or "none beyond the graph"
    typer.echo(f"wrote {out}: {rules.runtime} fuses {fused}")


def register(app: typer.Typer) -> None:
    app.add_typer(kernels_app, name="kernels")
