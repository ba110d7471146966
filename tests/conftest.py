"""Shared fixtures: paths, the shared development data, and isolated settings per test."""

from __future__ import annotations

from pathlib import Path

import pytest

import settings as settings_mod

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    """../shared/data (development data, not part of the product); skips when absent."""
    if not (SHARED_DATA / "corpus" / "passages.jsonl").exists():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture
def tmp_settings(tmp_path: Path) -> settings_mod.Settings:
    """Settings that write only below tmp_path (own Chroma folder, own LLM cache)."""
    s = settings_mod.Settings.from_env(
        env={},
        chroma_dir=str(tmp_path / "chroma_db"),
        llm_cache_path=str(tmp_path / "llm_cache.sqlite"),
    )
    settings_mod.set_settings(s)
    yield s
    settings_mod.set_settings(None)
