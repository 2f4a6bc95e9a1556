"""Shared paths: the repository's configs and fixtures (the tests run from a clone)."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def configs() -> Path:
    return REPO / "configs"
