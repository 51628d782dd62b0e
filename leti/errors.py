"""Typed errors of LETI. Library code raises these; the CLI turns them into one-line messages.

Every error carries a message that says *what* went wrong and *where* (a file, a cell, a device), so
the CLI can print ``error: <message>`` and exit non-zero without a traceback.
"""


class LetiError(Exception):
    """Base class of every error LETI raises on purpose."""

    exit_code = 1


class InvalidCellError(LetiError, ValueError):
    """A cell (adjacency matrix + ops) violates the search-space rules."""

    exit_code = 2


class ConversionError(LetiError):
    """A model could not be built or converted."""


class CorruptModelError(LetiError):
    """A model file is unreadable, truncated or fails validation."""


class DatasetError(LetiError, ValueError):
    """A table or dataset lacks required columns or has malformed values."""

    exit_code = 2


class DeviceError(LetiError):
    """A measurement device failed, disconnected or printed output that cannot be parsed."""
