"""Retrieval layer: store naming, retrieval pooling/reranking, BM25 persistence, source diversity,
confidence, QA memory, the real default embedder, a real tiny cross-encoder and a real Chroma server.

Unit tests use a deterministic bag-of-words embedder (fast); tests marked slow load real models."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

import load_corpus
import nodes
import prompts
import rag_utils
from context import AgentContext
from question import Question

pytestmark = pytest.mark.usefixtures("fresh_rag_caches")

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PASSAGES = FIXTURES / "retrieval_passages.jsonl"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def loaded(tmp_settings, fake):
    """The fixture passages loaded into a temporary store with the fake embedder."""
    passages = load_corpus.read_passages(PASSAGES)
    assert load_corpus.load_passages(passages, tmp_settings, progress=False) == len(passages)
    return tmp_settings, passages


def _ids(docs):
    return [d["id"] for d in docs]


# ------------------------------------------------------------------------------------------------
# naming and import cost
# ------------------------------------------------------------------------------------------------


def test_import_loads_no_heavy_library():
    code = (
        "import sys, rag_utils, load_corpus; "
        "print([m for m in ('torch', 'chromadb', 'sentence_transformers', 'bm25s') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_collection_name_encodes_model_and_is_valid_for_chroma(tmp_settings, tmp_path):
    import chromadb

    assert rag_utils.collection_name(tmp_settings) == "passages__all-minilm-l6-v2"
    models = [
        "Alibaba-NLP/gte-large-en-v1.5",
        "sentence-transformers/all-mpnet-base-v2",
        str(tmp_path / "My Model..v2"),
        "x",
        "a" * 300,
    ]
    names = {rag_utils.collection_name(tmp_settings.replace(embedding_model=m)) for m in models}
    assert len(names) == len(models)
    assert "passages__all-minilm-l6-v2" not in names
    client = chromadb.EphemeralClient()
    for name in names:  # Chroma rejects invalid names
        client.get_or_create_collection(name, embedding_function=None)
    memory = rag_utils.collection_name(tmp_settings, prefix=rag_utils.MEMORY_PREFIX)
    assert memory.startswith("qa_memory__") and memory != rag_utils.collection_name(tmp_settings)


def test_changing_the_embedding_model_never_reads_the_old_index(loaded):
    settings, passages = loaded
    assert rag_utils.corpus_count(settings) == len(passages)
    other = settings.replace(embedding_model="someone/another-model")
    assert rag_utils.corpus_count(other) == 0
    assert rag_utils.get_store(other).name != rag_utils.get_store(settings).name


# ------------------------------------------------------------------------------------------------
# model loading errors
# ------------------------------------------------------------------------------------------------


def test_sha256_mismatch_is_a_clear_error_and_a_good_file_is_hashed_once(tmp_path, monkeypatch):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"weights")
    good = hashlib.sha256(b"weights").hexdigest()
    with pytest.raises(rag_utils.ModelLoadError, match="sha256 mismatch.*reinstall"):
        rag_utils.verify_sha256(f, "0" * 64)
    calls = []
    real = rag_utils.sha256_file
    monkeypatch.setattr(rag_utils, "sha256_file", lambda p: calls.append(p) or real(p))
    rag_utils.verify_sha256(f, good)
    rag_utils.verify_sha256(f, good)
    assert len(calls) == 1
    f.write_bytes(b"tampered!")  # a changed file is hashed again and rejected
    with pytest.raises(rag_utils.ModelLoadError):
        rag_utils.verify_sha256(f, good)


def test_unknown_embedding_model_fails_with_one_line_advice(tmp_settings):
    s = tmp_settings.replace(embedding_model="legalrag-tests/no-such-embedding-model")
    with pytest.raises(rag_utils.ModelLoadError) as info:
        rag_utils.get_embedder(s)
    msg = str(info.value)
    assert "\n" not in msg
    assert "legalrag-tests/no-such-embedding-model" in msg and "EMBEDDING_MODEL=default" in msg


def test_auto_reranker_without_a_cached_cross_encoder_does_not_load_torch(tmp_path):
    """Offline with no cross-encoder on disk (the default install), RERANKER=auto is hybrid and a
    run does not spend seconds importing sentence-transformers and torch to find that out."""
    code = (
        "import sys, rag_utils\n"
        "from settings import Settings\n"
        "print(rag_utils.resolve_reranker('auto', Settings.from_env(env={})))\n"
        "print('torch' in sys.modules, 'sentence_transformers' in sys.modules)\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
        cwd=Path(rag_utils.__file__).parent,
    ).stdout.split()  # fmt: skip
    assert out == ["hybrid", "False", "False"]


def test_unknown_reranker_name_is_rejected(tmp_settings):
    with pytest.raises(ValueError, match="unknown reranker"):
        rag_utils.resolve_reranker("colbert", tmp_settings)


# ------------------------------------------------------------------------------------------------
# retrieval
# ------------------------------------------------------------------------------------------------


def test_empty_store_returns_no_documents(tmp_settings, fake):
    assert rag_utils.retrieve_documents("negligence", k=5, settings=tmp_settings) == []


@pytest.mark.parametrize("reranker", ["none", "hybrid", "bm25"])
def test_results_have_the_documented_fields_and_order(loaded, reranker):
    settings, _ = loaded
    docs = rag_utils.retrieve_documents_multi_query(
        ["elements of negligence duty breach", "negligence per se statute"],
        k=5,
        reranker=reranker,
        settings=settings,
    )
    # BM25 alone returns only passages sharing a term with the primary query
    assert len(docs) == (3 if reranker == "bm25" else 5)
    for d in docs:
        assert {
            "id",
            "text",
            "source",
            "title",
            "metadata",
            "dense_score",
            "rerank_score",
            "rank",
        } <= set(d)
        assert d["metadata"]["reranker"] == reranker
        assert d["text"] and d["source"]
    assert [d["rank"] for d in docs] == list(range(1, len(docs) + 1))
    scores = [d["rerank_score"] for d in docs]
    assert scores == sorted(scores, reverse=True)
    assert docs[0]["id"] == "mbe_neg1"
    json.dumps(docs)  # JSON-able for the agent state
    if reranker == "none":  # the dense ranking: the cosine of the centred query ...
        emb = rag_utils.get_embedder(settings)
        q = rag_utils.dense_query_vectors(["elements of negligence duty breach"], settings)[1][0]
        assert scores == pytest.approx([float(q @ emb.embed_query(d["text"])) for d in docs])
        plain = rag_utils.retrieve_documents_multi_query(  # ... or of the query itself
            ["elements of negligence duty breach", "negligence per se statute"],
            k=5,
            reranker=reranker,
            settings=settings.replace(dense_centering=False),
        )
        assert [d["rerank_score"] for d in plain] == pytest.approx(
            [d["dense_score"] for d in plain]
        )
    if reranker == "hybrid":  # reciprocal rank fusion of two rankings
        assert docs[0]["rerank_score"] <= 2 / (rag_utils.RRF_K + 1) + 1e-12


@pytest.mark.parametrize(
    ("reranker", "fuse"), [("none", False), ("hybrid", False), ("bm25", False), ("hybrid", True)]
)
def test_a_retrieved_passage_has_only_the_keys_passage_declares(loaded, reranker, fuse):
    """rag_utils.Passage names every key a search returns: its stored fields always, its scores
    as the search sets them, never the stored vector."""
    settings, _ = loaded
    docs = rag_utils.retrieve_documents_multi_query(
        ["negligence duty breach"], k=3, reranker=reranker, settings=settings, fuse_keyword=fuse
    )
    declared = rag_utils.Passage.__required_keys__ | rag_utils.Passage.__optional_keys__
    assert rag_utils.Passage.__required_keys__ == {"id", "text", "source", "title", "metadata"}
    assert docs
    for d in docs:
        assert rag_utils.Passage.__required_keys__ <= set(d) <= declared - {"embedding"}
        assert ("rrf_score" in d) == (fuse and reranker != "bm25")


def test_pool_covers_every_query_without_duplicates(loaded):
    settings, _ = loaded
    store = rag_utils.get_store(settings)
    queries = ["miranda custodial interrogation", "adverse possession hostile continuous"]
    _, qvecs = rag_utils.dense_query_vectors(queries, settings)  # what dense search ranks with
    pool = rag_utils.candidate_pool(store, queries, qvecs, None, 2, set())
    assert len(pool) == len(set(pool)) == 4
    assert {"starter_miranda", "starter_adverse"} <= set(pool)
    # the final ranking is drawn from that pool and ordered by the primary (first) query
    s1 = settings.replace(overretrieve_factor=1)
    wide = rag_utils.candidate_pool(store, queries, qvecs, None, 3, set())
    docs = rag_utils.retrieve_documents_multi_query(queries, k=3, reranker="none", settings=s1)
    assert set(_ids(docs)) <= set(wide)
    assert docs[0]["id"] in {"starter_miranda", "caselaw_002"}
    flipped = rag_utils.retrieve_documents_multi_query(
        queries[::-1], k=3, reranker="none", settings=s1
    )
    assert flipped[0]["id"] in {"starter_adverse", "caselaw_006"}


def test_repeated_queries_are_deduplicated(loaded):
    settings, _ = loaded
    q = "preliminary injunction irreparable harm"
    docs = rag_utils.retrieve_documents_multi_query([q, q, q], k=10, settings=settings)
    assert len(_ids(docs)) == len(set(_ids(docs))) == 10


def test_exclude_ids_are_never_returned(loaded):
    settings, _ = loaded
    q = ["battery transferred intent bottle"]
    first = rag_utils.retrieve_documents_multi_query(q, k=3, reranker="hybrid", settings=settings)
    excluded = _ids(first)[:2]
    again = rag_utils.retrieve_documents_multi_query(
        q, k=3, exclude_ids=excluded, reranker="hybrid", settings=settings
    )
    assert len(again) == 3
    assert not set(excluded) & set(_ids(again))
    assert _ids(again)[0] == _ids(first)[2]


def test_bm25_only_ranks_lexical_matches(loaded):
    settings, _ = loaded
    docs = rag_utils.retrieve_documents(
        "burglary dwelling night", k=3, reranker="bm25", settings=settings
    )
    assert docs[0]["id"] == "starter_burglary"
    assert all(d["rerank_score"] > 0 for d in docs)


def test_bm25_index_is_persisted_and_rebuilt_when_the_collection_changes(loaded, monkeypatch):
    settings, _ = loaded
    builds = []
    real_build = rag_utils.Bm25Index.build.__func__
    monkeypatch.setattr(
        rag_utils.Bm25Index,
        "build",
        classmethod(lambda cls, ids, texts: builds.append(len(ids)) or real_build(cls, ids, texts)),
    )
    rag_utils.retrieve_documents("negligence", reranker="hybrid", settings=settings)
    assert builds == [24]
    folder = Path(settings.retrieval.chroma_dir) / "bm25" / rag_utils.collection_name(settings)
    assert (folder / "ids.json").exists()
    rag_utils.reset_caches()  # a new process: loads the saved index instead of rebuilding
    rag_utils.retrieve_documents("negligence", reranker="hybrid", settings=settings)
    assert builds == [24]
    extra = {
        "idx": "starter_zoning",
        "source": "starter",
        "title": "Zoning",
        "text": "Variances from zoning ordinances require unnecessary hardship.",
    }
    load_corpus.load_passages([extra], settings, progress=False)
    docs = rag_utils.retrieve_documents(
        "zoning variance hardship", k=1, reranker="bm25", settings=settings
    )
    assert builds == [24, 25]
    assert docs[0]["id"] == "starter_zoning"


def test_interleave_takes_three_study_and_two_caselaw_for_k5():
    study = [{"id": f"mbe_{i}", "source": "barexam_qa:mbe"} for i in range(6)]
    case = [{"id": f"caselaw_{i}", "source": "barexam_qa:caselaw"} for i in range(6)]
    ranked = case[:4] + study  # caselaw ranked first must not crowd out study material
    out = rag_utils.interleave_sources(ranked, 5)
    kinds = ["C" if rag_utils.source_type(d) == "caselaw" else "S" for d in out]
    assert kinds == ["S", "C", "S", "C", "S"]
    assert _ids(out) == ["mbe_0", "caselaw_0", "mbe_1", "caselaw_1", "mbe_2"]
    ten = rag_utils.interleave_sources(case + study, 10)
    assert sum(rag_utils.source_type(d) == "caselaw" for d in ten) == 4
    short = rag_utils.interleave_sources(study + case[:1], 5)  # one caselaw: study fills the rest
    assert sum(rag_utils.source_type(d) == "caselaw" for d in short) == 1 and len(short) == 5
    only = rag_utils.interleave_sources(case, 5)
    assert len(only) == 5


def test_source_diverse_retrieval_mixes_pools(loaded):
    settings, _ = loaded
    s = settings.replace(source_diverse_retrieval=True)
    docs = rag_utils.retrieve_documents("the court held negligence duty of care", k=5, settings=s)
    kinds = ["C" if rag_utils.source_type(d) == "caselaw" else "S" for d in docs]
    assert kinds == ["S", "C", "S", "C", "S"]
    assert [d["rank"] for d in docs] == [1, 2, 3, 4, 5]


# ------------------------------------------------------------------------------------------------
# rerankers
# ------------------------------------------------------------------------------------------------


def test_auto_falls_back_to_hybrid_and_logs_it(loaded, tmp_path, caplog):
    settings, _ = loaded
    s = settings.replace(reranker="auto", reranker_model=str(tmp_path / "no-cross-encoder"))
    with caplog.at_level(logging.INFO, logger="rag_utils"):
        docs = rag_utils.retrieve_documents("negligence", k=3, settings=s)
    assert {d["metadata"]["reranker"] for d in docs} == {"hybrid"}
    assert any("RERANKER=auto" in r.message and "hybrid" in r.message for r in caplog.records)


def test_explicit_cross_encoder_that_cannot_load_is_a_clear_error(loaded, tmp_path):
    settings, _ = loaded
    s = settings.replace(reranker="cross-encoder", reranker_model=str(tmp_path / "missing"))
    with pytest.raises(rag_utils.ModelLoadError, match="RERANKER=hybrid"):
        rag_utils.retrieve_documents("negligence", k=3, settings=s)


def make_tiny_cross_encoder(folder: Path) -> Path:
    """A randomly initialised 1-layer BERT cross-encoder saved like a hub model."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    words = sorted(
        {
            w
            for line in PASSAGES.read_text().splitlines()
            for w in re.findall(r"[a-z]+", json.loads(line)["text"].lower())
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n"
    )
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=5 + len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=256, num_labels=1,
    )  # fmt: skip
    BertForSequenceClassification(config).save_pretrained(folder)
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_cross_encoder_reranks_the_pool_with_a_real_model(loaded, tmp_path, caplog):
    from sentence_transformers import CrossEncoder

    settings, _ = loaded
    path = make_tiny_cross_encoder(tmp_path / "tiny-ce")
    s = settings.replace(reranker="cross-encoder", reranker_model=str(path))
    queries = ["negligence duty breach", "battery intent"]
    docs = rag_utils.retrieve_documents_multi_query(queries, k=5, settings=s)
    assert {d["metadata"]["reranker"] for d in docs} == {"cross-encoder"}
    store = rag_utils.get_store(s)
    _, qvecs = rag_utils.dense_query_vectors(queries, s)
    bm25 = rag_utils.get_bm25(s, store)  # it reranks the hybrid pool: dense and BM25 candidates
    pool = store.get(
        rag_utils.candidate_pool(
            store, queries, qvecs, bm25, 5 * s.retrieval.overretrieve_factor, set()
        )
    )
    ce = CrossEncoder(str(path), local_files_only=True)
    expected = dict(
        zip(
            _ids(pool), map(float, ce.predict([(queries[0], d["text"]) for d in pool])), strict=True
        )
    )
    for d in docs:  # the cross-encoder's score of the primary query, and the best five of the pool
        assert d["rerank_score"] == pytest.approx(expected[d["id"]], abs=1e-5)
    fifth = sorted(expected.values(), reverse=True)[4]
    assert min(d["rerank_score"] for d in docs) >= fifth - 1e-5
    # auto picks the cross-encoder when it loads offline
    rag_utils.reset_caches()
    with caplog.at_level(logging.INFO, logger="rag_utils"):
        assert rag_utils.resolve_reranker("auto", s.replace(reranker="auto")) == "cross-encoder"
    assert any("cross-encoder" in r.message for r in caplog.records)


@pytest.mark.slow
def test_the_agents_hybrid_steps_rank_with_the_configured_cross_encoder(loaded, tmp_path):
    """RERANKER reaches the agent: its steps are nearly all hybrid, and a hybrid step used to
    ignore a cross-encoder the user had set."""
    settings, _ = loaded
    path = make_tiny_cross_encoder(tmp_path / "tiny-ce")
    for reranker, hybrid_step in (
        ("cross-encoder", "cross-encoder"), ("auto", "cross-encoder"), ("hybrid", "hybrid"),
    ):  # fmt: skip
        rag_utils.reset_caches()
        ctx = AgentContext.from_settings(
            settings.replace(reranker=reranker, reranker_model=str(path))
        )
        docs = ctx.search("hybrid", ["negligence duty breach"], 3, [])
        assert {d["metadata"]["reranker"] for d in docs} == {hybrid_step}, reranker
        docs = ctx.search("dense", ["negligence duty breach"], 3, [])
        assert {d["metadata"]["reranker"] for d in docs} == {"none"}


def test_an_agent_step_with_a_cross_encoder_that_cannot_load_fails_not_silently(loaded, tmp_path):
    settings, _ = loaded
    missing = str(tmp_path / "missing")
    ctx = AgentContext.from_settings(
        settings.replace(reranker="cross-encoder", reranker_model=missing)
    )
    with pytest.raises(rag_utils.ModelLoadError, match="cross-encoder"):
        ctx.search("hybrid", ["negligence duty breach"], 3, [])
    rag_utils.reset_caches()
    ctx = AgentContext.from_settings(settings.replace(reranker="auto", reranker_model=missing))
    docs = ctx.search("hybrid", ["negligence duty breach"], 3, [])
    assert docs and {d["metadata"]["reranker"] for d in docs} == {"hybrid"}


# ------------------------------------------------------------------------------------------------
# confidence and QA memory
# ------------------------------------------------------------------------------------------------


def test_passage_cosines_of_stored_and_unstored_passages(loaded):
    settings, _ = loaded
    q = "elements of negligence duty breach"
    docs = rag_utils.retrieve_documents(q, k=5, reranker="hybrid", settings=settings)
    cos = rag_utils.passage_cosines(q, docs, settings)
    assert cos.mean() == pytest.approx(float(np.mean([d["dense_score"] for d in docs])), abs=1e-5)
    assert len(rag_utils.passage_cosines(q, [], settings)) == 0
    off = rag_utils.passage_cosines("zoning ordinance variance", docs, settings)
    assert off.mean() < cos.mean()
    outside = [{"id": "not-in-store", "text": "negligence duty breach elements"}]
    assert rag_utils.passage_cosines(q, outside, settings)[0] > 0.8


def test_qa_memory_roundtrip_threshold_and_clear(loaded):
    settings, passages = loaded
    assert rag_utils.check_memory("What are the elements of negligence?", settings=settings) is None
    source = {
        "id": "mbe_neg1",
        "title": "Negligence",
        "text": "x" * 2000,
        "ref": "[Query 1][Source 1]",
    }
    rag_utils.write_to_memory(
        "What are the elements of negligence?",
        "Duty, breach...",
        0.71,
        settings=settings,
        sources=[source],
    )
    hit = rag_utils.check_memory("what are the elements of NEGLIGENCE?", settings=settings)
    assert hit is not None
    assert hit["answer"] == "Duty, breach..." and hit["confidence"] == pytest.approx(0.71)
    assert hit["similarity"] > 0.99
    assert hit["sources"] == [{**source, "source": "", "text": "x" * rag_utils.MEMORY_SOURCE_CHARS}]
    assert datetime.fromisoformat(hit["timestamp"]).tzinfo is not None
    assert rag_utils.check_memory("Is adverse possession hostile?", settings=settings) is None
    near = "What are the elements of negligence and battery?"
    assert rag_utils.check_memory(near, settings=settings) is None  # below 0.92
    assert rag_utils.check_memory(near, settings=settings.replace(memory_threshold=0.5)) is not None
    assert rag_utils.corpus_count(settings) == len(passages)  # a separate collection
    assert rag_utils.clear_memory(settings) == 1
    assert rag_utils.check_memory("What are the elements of negligence?", settings=settings) is None
    assert rag_utils.clear_memory(settings) == 0


def test_a_memory_hit_keeps_the_sentence_and_pin_each_citation_rests_on(loaded):
    # A user's second run of a question printed [1] Adverse possession (...): "" for every source
    settings, _ = loaded
    cited = {"id": "p1", "title": "Adverse possession", "text": "Possession must be ...",
             "support": "Possession must be open and notorious.", "pin": "§ 2(a)", "ref": "[1]"}  # fmt: skip
    rag_utils.write_to_memory("What is adverse possession?", "A.", 0.7, settings, sources=[cited])
    hit = rag_utils.check_memory("What is adverse possession?", settings=settings)
    state = {"reading": {"recalled": hit}, "parsed": Question.read("What is adverse possession?")}
    record = nodes.memory_record(state)
    assert [(c.support, c.pin) for c in record.citations] == [(cited["support"], "§ 2(a)")]


def test_qa_memory_entries_are_used_only_under_the_provider_model_and_corpus_that_wrote_them(
    loaded,
):
    """An answer cached from one provider (a broken server, say) is never served to another, nor
    after the corpus changed; the same question can hold one entry per scope."""
    settings, _ = loaded
    q = "What are the elements of negligence?"
    broken = {"provider": "openai", "model": "gpt-x", "embedding_model": "fake", "corpus": "c:10"}
    healthy = {**broken, "provider": "local", "model": "qwen"}
    rag_utils.write_to_memory(q, "", 0.9, settings=settings, scope=broken)
    assert rag_utils.check_memory(q, settings=settings, scope=healthy) is None
    assert rag_utils.check_memory(q, settings=settings, scope={**broken, "corpus": "c:11"}) is None
    assert rag_utils.check_memory(q, settings=settings, scope=broken)["answer"] == ""
    rag_utils.write_to_memory(q, "Duty, breach.", 0.8, settings=settings, scope=healthy)
    assert rag_utils.check_memory(q, settings=settings, scope=healthy)["answer"] == "Duty, breach."
    assert rag_utils.memory_count(settings) == 2
    fp = rag_utils.corpus_fingerprint(settings)
    assert fp.endswith(f":{rag_utils.corpus_count(settings)}")


# ------------------------------------------------------------------------------------------------
# real default embedder
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_default_embedder_is_offline_verified_and_normalised(tmp_settings):
    emb = rag_utils.get_embedder(tmp_settings)
    assert emb.name == "all-MiniLM-L6-v2"
    assert rag_utils.get_embedder(tmp_settings) is emb  # cached
    vecs = emb.embed_documents(["Battery is an offensive contact.", "Consideration is a bargain."])
    assert vecs.shape == (2, 384) and vecs.dtype == np.float32
    assert np.linalg.norm(vecs, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    q = emb.embed_query("unwanted touching of another person")
    assert float(vecs[0] @ q) > float(vecs[1] @ q)


@pytest.mark.slow
def test_real_embedder_end_to_end_retrieval(tmp_settings):
    load_corpus.load_passages(load_corpus.read_passages(PASSAGES), tmp_settings, progress=False)
    for reranker in ("none", "hybrid"):
        docs = rag_utils.retrieve_documents_multi_query(
            ["What must a plaintiff prove to win a negligence case?", "duty of care"],
            k=3,
            reranker=reranker,
            settings=tmp_settings,
        )
        assert "mbe_neg1" in _ids(docs)
    docs = rag_utils.retrieve_documents(
        "standard for a temporary order stopping conduct before trial", k=2, settings=tmp_settings
    )
    assert "wex_inj" in _ids(docs)
    cos = rag_utils.passage_cosines("negligence elements", docs[:1], tmp_settings)
    assert 0.0 < cos[0] <= 1.0


# ------------------------------------------------------------------------------------------------
# Chroma server (HttpClient)
# ------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def chroma_server(tmp_path):
    exe = Path(sys.executable).parent / "chroma"
    if not exe.exists():
        exe = shutil.which("chroma")
    if not exe:
        pytest.skip("the chroma CLI is not installed")
    port = _free_port()
    log = open(tmp_path / "chroma.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            str(exe),
            "run",
            "--path",
            str(tmp_path / "server"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"chroma run exited: {(tmp_path / 'chroma.log').read_text()[-500:]}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        else:
            pytest.fail("chroma run did not start within 30 s")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.slow
def test_http_client_against_a_real_chroma_server(tmp_settings, fake, chroma_server, tmp_path):
    s = tmp_settings.replace(chroma_host="127.0.0.1", chroma_port=chroma_server)
    passages = load_corpus.read_passages(PASSAGES)
    assert load_corpus.load_passages(passages, s, progress=False) == len(passages)
    assert load_corpus.load_passages(passages, s, progress=False) == 0  # idempotent over HTTP
    assert rag_utils.corpus_count(s) == len(passages)
    assert not (
        Path(tmp_settings.retrieval.chroma_dir) / "chroma.sqlite3"
    ).exists()  # nothing local
    docs = rag_utils.retrieve_documents_multi_query(
        ["burglary dwelling night", "miranda"], k=3, reranker="hybrid", settings=s
    )
    assert docs[0]["id"] == "starter_burglary"
    rag_utils.write_to_memory("What is burglary?", "Breaking and entering...", 0.6, settings=s)
    assert rag_utils.check_memory("What is burglary?", settings=s)["answer"].startswith("Breaking")
    assert rag_utils.clear_memory(s) == 1
    assert (tmp_path / "server").exists()


def test_unreachable_chroma_server_is_a_clear_error(tmp_settings):
    s = tmp_settings.replace(chroma_host="127.0.0.1", chroma_port=_free_port())
    with pytest.raises(rag_utils.StoreError, match="CHROMA_HOST"):
        rag_utils.corpus_count(s)


# ------------------------------------------------------------------------------------------------
# A read-only index
# ------------------------------------------------------------------------------------------------

_READ_ONLY_SCRIPT = """
import json, logging, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
from conftest import BagOfWordsEmbedder
import load_corpus, rag_utils
from settings import Settings

emb = BagOfWordsEmbedder()
rag_utils.get_embedder = lambda settings=None: emb
out = {}
try:
    open(sys.argv[2] + "/probe", "w")
    out["os_denied_writes"] = False
except PermissionError:
    out["os_denied_writes"] = True
s = Settings.from_env(env={}, chroma_dir=sys.argv[2], reranker="hybrid")
out["read_only"] = rag_utils.is_read_only(s)
docs = rag_utils.retrieve_documents_multi_query(["negligence duty breach damages"], k=3, settings=s)
out["ids"] = [d["id"] for d in docs]
rag_utils.write_to_memory("What is negligence?", "an answer", 0.9, settings=s)
out["memory_hit"] = rag_utils.check_memory("What is negligence?", settings=s)
try:
    load_corpus.load_passages([{"idx": "new1", "text": "new text"}], s, progress=False)
    out["load"] = "loaded"
except rag_utils.StoreError as exc:
    out["load"] = str(exc)
empty = Settings.from_env(env={}, chroma_dir=sys.argv[3])
out["starter_added_to_empty"] = load_corpus.ensure_starter_index(empty)
print(json.dumps(out))
"""


def _tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def _set_writable(folder: Path, writable: bool) -> None:
    for p in [folder, *folder.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755 if writable else 0o555)
        else:
            p.chmod(0o644 if writable else 0o444)


def test_a_read_only_index_can_be_queried_and_writes_are_skipped(loaded, tmp_path):
    """chmod -R a-w on the Chroma folder (BM25 files included): retrieval works, the memory
    write-back, the BM25 save and the starter build are skipped with one warning, an explicit
    load fails with a clear error, and not one byte of the folder changes.

    Root ignores file modes, so as root the check runs under setpriv without CAP_DAC_OVERRIDE:
    the script first proves the OS really refuses writes to the folder."""
    settings, passages = loaded
    rag_utils.get_bm25(settings)  # saved with the current count ...
    load_corpus.load_passages(
        [{"idx": "extra1", "text": "Duty of care owed by landowners to invitees."}],
        settings,
        progress=False,
    )  # ... and now stale: a rebuild must not be saved
    rag_utils.reset_caches()
    chroma = Path(settings.retrieval.chroma_dir)
    empty = tmp_path / "empty_chroma"
    empty.mkdir()
    command = [sys.executable, "-c", _READ_ONLY_SCRIPT, str(REPO), str(chroma), str(empty)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: chmod cannot make the folder read-only")
        command = [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner", *command]
    before = _tree_state(chroma)
    _set_writable(chroma, False)
    _set_writable(empty, False)
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    finally:
        _set_writable(chroma, True)
        _set_writable(empty, True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["os_denied_writes"], "the folder was writable: the test would prove nothing"
    assert out["read_only"] is True
    assert out["ids"] and out["ids"][0] == "mbe_neg1"
    assert out["memory_hit"] is None  # the write-back was skipped
    assert "read-only" in out["load"] and "add 1 passages" in out["load"]
    assert out["starter_added_to_empty"] == 0
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    read_only_warnings = [w for w in warnings if "read-only" in w]
    assert len([w for w in read_only_warnings if str(chroma) in w]) == 1, proc.stderr
    assert _tree_state(chroma) == before  # nothing in the folder (BM25 included) changed
    assert list(empty.iterdir()) == []


def test_a_benchmark_label_in_the_title_field_never_reaches_a_reader(tmp_settings, fake, tmp_path):
    # Passages built from Bar Exam QA's evaluation logs carry "gold" (the answer's passage) or
    # "retrieved" as their title: shown as "[1] gold" it would point the reader at the answer.
    rows = [
        {"idx": "p_gold", "title": "gold", "text": "Negligence requires duty and breach."},
        {"idx": "p_ret", "title": "Retrieved", "text": "Negligence per se borrows a statute."},
        {"idx": "p_rule", "title": "Rule 1002", "text": "An original negligence writing rule."},
    ]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    passages = load_corpus.read_passages(path)
    assert [p["title"] for p in passages] == ["", "", "Rule 1002"]
    assert [p.get("provenance") for p in passages] == ["gold", "Retrieved", None]
    load_corpus.load_passages(passages, tmp_settings, progress=False)
    # A store loaded before the rule (the label stored as the title) reads as untitled too.
    store = rag_utils.get_store(tmp_settings)
    emb = rag_utils.get_embedder(tmp_settings)
    text = "Negligence old store passage."
    store.upsert(["p_old"], [text], [{"source": "x", "title": "gold"}], [emb.embed_query(text)])
    docs = rag_utils.retrieve_documents("negligence", k=4, settings=tmp_settings)
    assert {d["id"] for d in docs} == {"p_gold", "p_ret", "p_rule", "p_old"}
    evidence = prompts.format_evidence(docs)
    assert "gold" not in evidence.lower() and "retrieved" not in evidence.lower()
    assert "Rule 1002" in evidence


def test_dense_search_is_exact_and_the_same_in_every_run(loaded, monkeypatch):
    """Up to EXACT_SEARCH_MAX_PASSAGES the candidates are the exact nearest passages, so the same
    command gives the same ranking (HNSW's candidates differed from one process to the next)."""
    settings, passages = loaded
    store = rag_utils.get_store(settings)
    queries = ["negligence duty breach", "battery intent", "hearsay statement"]
    qvecs, rank_vecs = rag_utils.dense_query_vectors(queries, settings, store)
    every = store.get([p["idx"] for p in passages], with_embeddings=True)
    mat = np.asarray([d["embedding"] for d in every], dtype=np.float32)
    ids = [d["id"] for d in every]
    for vec, got in zip(rank_vecs, store.query_ids(rank_vecs, 5), strict=True):
        scores = mat @ vec / np.linalg.norm(mat, axis=1)
        assert [ids[i] for i in np.argsort(-scores)[:5]] == got
    assert store.query_ids(rank_vecs, 5) == store.query_ids(rank_vecs, 5)
    # above the limit the HNSW index answers, with the same interface
    monkeypatch.setattr(rag_utils, "EXACT_SEARCH_MAX_PASSAGES", 0)
    assert [len(r) for r in store.query_ids(rank_vecs, 5)] == [5, 5, 5]


def test_unknown_terms_are_the_words_no_passage_uses_matched_by_stem(monkeypatch):
    texts = [
        "Under the mailbox rule an acceptance is effective on dispatch.",
        "A landowner owes an invitee reasonable care.",
    ]
    index = rag_utils.Bm25Index.build(["p1", "p2"], texts)
    assert index.unknown_terms("What is copyright?") == []  # two passages say nothing of a topic
    monkeypatch.setattr(rag_utils, "MIN_VOCABULARY_PASSAGES", 2)
    assert index.unknown_terms("What duty does a landowner owe to invitees?") == ["duty"]
    # with a subject, only the unknown words it uses too (by stem: "duties" is "duty")
    assert index.unknown_terms("What duty does a landowner owe to invitees?", "duties") == ["duty"]
    assert index.unknown_terms("What duty does a landowner owe to invitees?", "care") == []
    assert index.unknown_terms("Is an acceptance mailed effective?") == []
    assert index.unknown_terms("What are the fair use factors in copyright law, under 17 USC 107?") == [
        "fair", "use", "factors", "copyright", "law", "usc",
    ]  # fmt: skip


@pytest.mark.parametrize("size", [50, 5_000, 300_000])
def test_bm25_top_of_is_the_best_scores_ties_to_the_lower_index(size):
    """The block-maxima shortcut picks exactly what a full sort does: best score first, ties to
    the lower index, zero scores never."""
    import numpy as np

    rng = np.random.default_rng(size)
    sc = np.zeros(size, dtype=np.float32)
    hit = rng.random(size) < 0.3
    sc[hit] = rng.integers(1, 40, hit.sum()).astype(np.float32) / 4  # many ties
    index = rag_utils.Bm25Index(None, [f"p{i}" for i in range(size)], size)
    for n in (1, 5, 20, 200):
        expected = sorted(np.flatnonzero(sc > 0), key=lambda i: (-sc[i], i))[:n]
        assert index.top_of(sc, n) == [(f"p{i}", float(sc[i])) for i in expected]
    assert index.top_of(np.zeros(size, dtype=np.float32), 5) == []


def test_a_search_reading_vectors_first_returns_what_a_whole_read_does(loaded, monkeypatch):
    """The passages a hybrid search returns are read whole after ranking on vectors alone: the
    results, every field included, are those of reading every candidate whole."""
    settings, _ = loaded
    queries = ["battery transferred intent bottle", "hearsay statement", "adverse possession"]
    lean = rag_utils.retrieve_documents_multi_query(queries, k=4, settings=settings)
    whole = rag_utils._pool
    monkeypatch.setattr(
        rag_utils,
        "_pool",
        lambda s, ids, with_vectors, with_texts: whole(s, ids, with_vectors, True),
    )
    assert rag_utils.retrieve_documents_multi_query(queries, k=4, settings=settings) == lean
    assert all(d["text"] and d["metadata"]["reranker"] for d in lean)


def test_a_passage_deleted_between_the_two_reads_is_not_returned(loaded, monkeypatch):
    settings, _ = loaded
    q = ["battery transferred intent bottle"]
    first = _ids(rag_utils.retrieve_documents_multi_query(q, k=3, settings=settings))
    store = rag_utils.get_store(settings)
    real_get = store.get
    monkeypatch.setattr(
        store, "get", lambda ids, **kw: [d for d in real_get(ids, **kw) if d["id"] != first[0]]
    )
    again = _ids(rag_utils.retrieve_documents_multi_query(q, k=3, settings=settings))
    assert first[0] not in again and again[:2] == first[1:] and len(again) == 3


def test_an_answer_saved_before_the_answering_code_changed_is_not_served(
    loaded, monkeypatch, tmp_path
):
    """A user who ran an earlier version was shown its saved answer to the demo ("Not answered:
    State action"), though this version answers it otherwise.  The memory's scope now holds a
    digest of the answering code and prompts: a changed prompt file changes it, and an answer
    saved under another digest is not served."""
    import context
    import prompts

    settings, _ = loaded
    q = "What are the elements of negligence?"
    rag_utils.write_to_memory(
        q, "Duty, breach.", 0.8, settings, scope=context.memory_scope(settings)
    )
    assert rag_utils.check_memory(q, settings=settings, scope=context.memory_scope(settings))
    skills = shutil.copytree(prompts.SKILLS_DIR, tmp_path / "skills")
    (skills / "apply_rule.md").write_text(
        (skills / "apply_rule.md").read_text() + "\nOne more line."
    )
    monkeypatch.setattr(prompts, "SKILLS_DIR", skills)
    context.answering_code.cache_clear()
    try:
        assert (
            rag_utils.check_memory(q, settings=settings, scope=context.memory_scope(settings))
            is None
        )
    finally:
        context.answering_code.cache_clear()


def test_the_qa_memory_keeps_the_whole_answer_record(loaded):
    settings, _ = loaded
    issue = {"issue": "Adverse possession", "status": "answered", "turns_on": [
        {"requirement": "Possession must be open", "fact": None}]}  # fmt: skip
    record = {"kind": "rule_question", "text": "A. [1]", "issues": [issue], "citations": [],
              "abstained": False, "letter": "B"}  # fmt: skip
    rag_utils.write_to_memory("What is adverse possession?", "A. [1]", 0.7, settings, record=record)
    hit = rag_utils.check_memory("What is adverse possession?", settings=settings)
    assert hit["record"] == record
    state = {"reading": {"recalled": hit}, "parsed": Question.read("What is adverse possession?")}
    restored = nodes.memory_record(state)
    assert restored.issues[0].turns_on == issue["turns_on"] and restored.text == "A. [1]"
    assert restored.letter is None  # a saved letter is picked anew
