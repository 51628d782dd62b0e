import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def golden() -> dict:
    """NAS-Bench-101 facts (copied from shared/golden/nb101.json with its README)."""
    return json.loads((DATA / "nb101_golden.json").read_text())
