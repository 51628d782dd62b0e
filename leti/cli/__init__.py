"""The ``leti`` command line. Each sub-command is a thin wrapper over the library API.

Each command group is one module of this package with a ``register(app)`` function
(:data:`COMMAND_MODULES`): ``generate``, ``measure`` (devices, measure, export), ``predict`` (evaluate,
fit, predict), ``kernels`` (build, detect), ``engine``, ``demo`` and ``farm``. They parse options, call library functions and print; this
file assembles them and turns LETI's typed errors into one-line messages with a non-zero exit.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import typer

from leti.errors import LetiError


def _flags_read_as_flags() -> None:
    """Typer 0.29 (which vendors its own click) shows every boolean flag as ``--adaptive <bool>`` in
    the rich help: ``TyperOption.display_type_rich`` returns the type label without asking whether
    the option is a flag (the plain help, ``get_help_record``, does ask). A flag takes no value, so
    it gets no type label; everything else is left to typer."""
    try:
        from typer.core import TyperOption
    except ImportError:  # another typer layout: nothing to correct
        return
    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "_leti_flags", False):  # a typer without the method (e.g. 0.20): as it is
        return

    def display_type_rich(self, ctx):
        if getattr(self, "is_flag", False) and not getattr(self, "count", False) and self.metavar is None:
            return None
        return shown(self, ctx)

    display_type_rich._leti_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich


_flags_read_as_flags()

app = typer.Typer(
    name="leti",
    help="LETI: how long will this network take on that device?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

def output_folder(path: Path, option: str = "--out", shown: Path | None = None) -> Path:
    """Create ``path`` (a folder) and check a file can be written in it, before any work is done; a
    read-only place, a path under a regular file or under /proc raises one :class:`LetiError` line
    naming ``shown`` (the file the user gave, when ``path`` is its folder) or ``path``."""
    import os
    import tempfile

    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".leti-write-test-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, (FileExistsError, NotADirectoryError)):
            reason = "a part of the path is a file, not a folder"
        raise LetiError(f"{option} {shown or path}: cannot write there ({reason})") from None
    return path


@app.callback()
def _root() -> None:
    """LETI: how long will this network take on that device?"""


#: Packages whose ``cli`` module registers commands, in help order.
COMMAND_MODULES = ("leti.cli.generate", "leti.cli.measure", "leti.cli.predict", "leti.cli.kernels", "leti.cli.engine",
                   "leti.cli.demo", "leti.cli.farm")

for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as exc:  # a package without commands yet
        if exc.name != _name:
            raise
        continue
    _module.register(app)


def main() -> None:
    """Entry point that reports LETI errors as one line on stderr (usage errors are typer's)."""
    try:
        app()
    except LetiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
