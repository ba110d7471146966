"""Shared fixtures: paths, the shared development data, and isolated settings per test."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

import legal_graph
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
        llm_cache=False,  # a scripted reply per call: a test that repeats a call scripts it twice
        # The evidence gate is calibrated on the real embedder's cosines; the fake embedders of the
        # unit tests have another scale, so it is off here and the gate's own tests set it.
        lean_gate=0.0,
        # RERANKER=auto would try the real cross-encoder (importing torch, and loading the model
        # wherever it is cached, as in CI) on every hybrid search; the reranker tests set it.
        reranker="hybrid",
    )
    legal_graph.reset_caches()
    yield s
    legal_graph.reset_caches()


class BagOfWordsEmbedder:
    """Deterministic hashed bag-of-words embeddings, L2-normalised: texts sharing words have a
    higher cosine (a fast stand-in for the real model in unit tests)."""

    name = "fake-bow"
    dim = 256

    def __init__(self) -> None:
        self.calls = 0

    def embed_documents(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z]{3,}", t.lower()):
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
            norm = np.linalg.norm(out[i])
            out[i] = out[i] / norm if norm else out[i]
        return out

    def embed_query(self, text):
        return self.embed_documents([text])[0]


@pytest.fixture
def fresh_rag_caches():
    """rag_utils' cached clients, stores and BM25 indexes forgotten before and after the test."""
    import legal_graph
    import rag_utils

    rag_utils.reset_caches()
    legal_graph.reset_caches()
    yield
    rag_utils.reset_caches()
    legal_graph.reset_caches()


@pytest.fixture
def fake(monkeypatch, fresh_rag_caches):
    """The fake embedder in place of rag_utils.get_embedder."""
    import rag_utils

    emb = BagOfWordsEmbedder()
    monkeypatch.setattr(rag_utils, "get_embedder", lambda settings=None: emb)
    return emb
