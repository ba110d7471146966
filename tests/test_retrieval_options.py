"""Embedding backends (ONNX int8 / torch), batched multi-query retrieval, weighted rank fusion and
passage windows.

Unit tests use the deterministic bag-of-words embedder; the ONNX export test (slow) uses the real
default model."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

import load_corpus
import rag_utils

pytestmark = pytest.mark.usefixtures("fresh_rag_caches")

PASSAGES = Path(__file__).resolve().parent / "fixtures" / "retrieval_passages.jsonl"


@pytest.fixture
def loaded(tmp_settings, fake):
    passages = load_corpus.read_passages(PASSAGES)
    load_corpus.load_passages(passages, tmp_settings, progress=False)
    return tmp_settings, passages


def _ids(docs):
    return [d["id"] for d in docs]


# ------------------------------------------------------------------------------------------------
# backend choice and the ONNX cache
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def device_seen(monkeypatch):
    """Stub the device torch sees (:func:`rag_utils.visible_accelerator`); returns the setter."""

    def see(device: str) -> None:
        monkeypatch.setattr(rag_utils, "visible_accelerator", lambda: device)

    see("cpu")
    return see


def test_auto_backend_is_onnx_only_for_the_default_model_on_cpu(tmp_settings, device_seen):
    assert rag_utils.resolve_embedding_backend(tmp_settings) == "onnx"
    other = tmp_settings.replace(embedding_model="sentence-transformers/all-mpnet-base-v2")
    assert rag_utils.resolve_embedding_backend(other) == "torch"
    assert rag_utils.resolve_embedding_backend(tmp_settings.replace(embedding_device="cuda")) == (
        "torch"
    )
    assert rag_utils.resolve_embedding_backend(tmp_settings.replace(embedding_backend="torch")) == (
        "torch"
    )
    with pytest.raises(rag_utils.ModelLoadError, match="EMBEDDING_BACKEND=onnx supports only"):
        rag_utils.resolve_embedding_backend(other.replace(embedding_backend="onnx"))


def test_auto_uses_torch_on_a_gpu_torch_sees_unless_the_device_is_set(tmp_settings, device_seen):
    assert tmp_settings.retrieval.embedding_device is None
    device_seen("cuda")
    assert rag_utils.embedding_device(tmp_settings) == "cuda"
    assert rag_utils.resolve_embedding_backend(tmp_settings) == "torch"
    device_seen("mps")
    assert rag_utils.resolve_embedding_backend(tmp_settings) == "torch"
    device_seen("cpu")  # no GPU: the int8 ONNX path, as before
    assert rag_utils.resolve_embedding_backend(tmp_settings) == "onnx"
    device_seen("cuda")  # EMBEDDING_DEVICE=cpu keeps a GPU machine on the CPU path
    pinned = tmp_settings.replace(embedding_device="cpu")
    assert rag_utils.embedding_device(pinned) == "cpu"
    assert rag_utils.resolve_embedding_backend(pinned) == "onnx"
    assert rag_utils.resolve_embedding_backend(pinned.replace(embedding_backend="torch")) == "torch"


class _FakeSentenceTransformer:
    """Records what the torch embedder does to its model."""

    def __init__(self, device):
        self.device, self.halved = device, False

    def half(self):
        self.halved = True
        return self


def test_gpu_embedder_runs_fp16_with_large_batches_and_the_cpu_one_does_not(
    tmp_settings, device_seen, monkeypatch
):
    loaded = []

    def load(name, settings, device=None):
        loaded.append(_FakeSentenceTransformer(device))
        return loaded[-1]

    monkeypatch.setattr(rag_utils, "_load_sentence_transformer", load)
    monkeypatch.setattr(rag_utils, "_embedders", {})
    device_seen("cuda")
    emb = rag_utils.get_embedder(tmp_settings)
    assert (emb.backend, emb.device, emb.batch_size) == ("torch", "cuda", rag_utils.GPU_BATCH_SIZE)
    assert loaded[-1].device == "cuda" and loaded[-1].halved
    big = rag_utils.get_embedder(tmp_settings.replace(embedding_batch_size=1024))
    assert big.batch_size == 1024  # a larger EMBEDDING_BATCH_SIZE is kept
    cpu = rag_utils.get_embedder(
        tmp_settings.replace(embedding_backend="torch", embedding_device="cpu")
    )
    assert (cpu.device, cpu.batch_size) == ("cpu", 16) and not loaded[-1].halved


@pytest.fixture
def fresh_device_query():
    rag_utils.visible_accelerator.cache_clear()
    yield
    rag_utils.visible_accelerator.cache_clear()


def test_the_device_query_reads_torch_and_does_not_import_it_needlessly(
    monkeypatch, tmp_path, fresh_device_query
):
    import importlib.machinery
    import importlib.metadata
    import importlib.util
    import sys
    import types

    class Untouchable(types.ModuleType):
        def __getattr__(self, name):
            raise AssertionError(f"torch.{name} was used")

    untouchable = Untouchable("torch")
    untouchable.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    monkeypatch.setitem(sys.modules, "torch", untouchable)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # not installed
    assert rag_utils.visible_accelerator() == "cpu"
    monkeypatch.undo()

    rag_utils.visible_accelerator.cache_clear()
    monkeypatch.setitem(sys.modules, "torch", untouchable)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+cpu")  # CPU wheel
    assert rag_utils.visible_accelerator() == "cpu"
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(rag_utils, "GPU_DRIVER_FILES", (str(tmp_path / "no-driver"),))
    assert rag_utils._torch_may_see_gpu() is False  # Linux without a GPU driver

    def fake_torch(cuda, mps):
        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(is_available=lambda: cuda)
        torch.backends = types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: mps))
        return torch

    monkeypatch.setattr(rag_utils, "_torch_may_see_gpu", lambda: True)
    for cuda, mps, seen in ((True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")):
        monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda, mps))
        rag_utils.visible_accelerator.cache_clear()
        assert rag_utils.visible_accelerator() == seen


def test_onnx_cache_is_used_only_when_its_checksums_match(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    model = cache / rag_utils.ONNX_FILE
    model.write_bytes(b"onnx bytes")
    manifest = {
        "recipe": rag_utils.ONNX_RECIPE,
        "source_sha256": "a" * 64,
        "onnx_sha256": hashlib.sha256(b"onnx bytes").hexdigest(),
    }
    (cache / rag_utils.ONNX_MANIFEST).write_text(json.dumps(manifest))
    assert rag_utils._valid_onnx_cache(cache, "a" * 64) == model
    assert rag_utils._valid_onnx_cache(cache, "b" * 64) is None  # exported from another model
    (cache / rag_utils.ONNX_MANIFEST).write_text(json.dumps({**manifest, "recipe": -1}))
    assert rag_utils._valid_onnx_cache(cache, "a" * 64) is None  # another export recipe
    (cache / rag_utils.ONNX_MANIFEST).write_text(json.dumps(manifest))
    model.write_bytes(b"onnx bytes, truncated or corrupted")
    assert rag_utils._valid_onnx_cache(cache, "a" * 64) is None
    (cache / rag_utils.ONNX_MANIFEST).write_text("{not json")
    assert rag_utils._valid_onnx_cache(cache, "a" * 64) is None


def test_auto_falls_back_to_torch_when_the_onnx_export_fails(
    tmp_settings, monkeypatch, caplog, device_seen
):
    def fail(*_a, **_k):
        raise rag_utils.ModelLoadError("cannot export the ONNX embedder: onnx is not installed")

    monkeypatch.setattr(rag_utils, "ensure_onnx_model", fail)
    monkeypatch.setattr(rag_utils, "_load_sentence_transformer", lambda name, s, d=None: object())
    monkeypatch.setattr(rag_utils, "_embedders", {})
    with caplog.at_level(logging.WARNING, logger="rag_utils"):
        emb = rag_utils.get_embedder(tmp_settings)
    assert emb.backend == "torch"
    assert any("using torch" in r.message for r in caplog.records)
    # asked for explicitly, the failure is the error
    with pytest.raises(rag_utils.ModelLoadError, match="onnx is not installed"):
        rag_utils.get_embedder(tmp_settings.replace(embedding_backend="onnx"))


# ------------------------------------------------------------------------------------------------
# batched multi-query retrieval
# ------------------------------------------------------------------------------------------------


def test_multi_query_embeds_once_and_searches_chroma_and_bm25_once(loaded, monkeypatch):
    settings, _ = loaded
    monkeypatch.setattr(rag_utils, "EXACT_SEARCH_MAX_PASSAGES", 0)  # the HNSW path of a large store
    queries = ["negligence duty breach", "battery transferred intent", "miranda custody"]
    store = rag_utils.get_store(settings)
    rag_utils.get_bm25(settings, store)  # built (tokenizing the corpus) before counting calls
    chroma_calls, bm25_calls = [], []
    real_query = store.collection.query
    monkeypatch.setattr(
        store.collection,
        "query",
        lambda **kw: chroma_calls.append(len(kw["query_embeddings"])) or real_query(**kw),
    )
    real_tokenize = rag_utils.bm25_tokenize
    monkeypatch.setattr(
        rag_utils,
        "bm25_tokenize",
        lambda texts: bm25_calls.append(len(texts)) or real_tokenize(texts),
    )
    emb = rag_utils.get_embedder(settings)
    before = emb.calls
    docs = rag_utils.retrieve_documents_multi_query(
        queries, k=5, reranker="hybrid", settings=settings
    )
    assert len(docs) == 5
    assert emb.calls - before == 1  # one forward pass for the three queries
    assert chroma_calls == [3]  # one Chroma query with three embeddings
    assert bm25_calls == [3]  # the three queries scored as one matrix


def test_the_store_is_counted_again_only_after_a_write(loaded, monkeypatch):
    """Chroma counts by scanning (47 ms at 686,000 passages): searches of an unchanged store
    count it at most once between them; a write, this process's or another's, is seen by the
    next search."""
    settings, passages = loaded
    monkeypatch.setattr(rag_utils, "EXACT_SEARCH_MAX_PASSAGES", 0)  # the HNSW path
    store = rag_utils.get_store(settings)
    counts = []
    real_count = store.collection.count
    monkeypatch.setattr(store.collection, "count", lambda: counts.append(1) or real_count())
    queries = ["negligence duty breach", "battery transferred intent", "miranda custody"]
    for s in (settings, settings.replace(reranker="none"), settings):
        assert rag_utils.retrieve_documents_multi_query(queries, k=5, settings=s)
    assert store.count() == len(passages) and len(counts) <= 1
    store.upsert(["new_1"], ["Negligence needs a duty."], [{"source": "t"}], [np.ones(256) / 16])
    counts.clear()
    docs = rag_utils.retrieve_documents_multi_query(["negligence duty"], k=30, settings=settings)
    assert "new_1" in _ids(docs) and len(counts) == 1  # the next search sees the new passage
    # another process's write, a clock tick later: it commits to the store's database file
    time.sleep(0.01)
    other = rag_utils.PassageStore(store.client, store.name, store.model_name, store.bm25_dir)
    other.upsert(["new_2"], ["Duty of care."], [{"source": "t"}], [np.ones(256) / 16])
    assert store.db_file is not None and store.count() == len(passages) + 2


def test_batched_pool_equals_one_search_per_query(loaded):
    settings, _ = loaded
    queries = ["negligence duty breach", "adverse possession hostile", "hearsay statement"]
    store = rag_utils.get_store(settings)
    bm25 = rag_utils.get_bm25(settings, store)
    qvecs = rag_utils.get_embedder(settings).embed_documents(queries)
    pool = rag_utils.candidate_pool(store, queries, qvecs, bm25, 3, {"mbe_neg1"})
    expected: dict[str, None] = {}
    for q, v in zip(queries, qvecs, strict=True):
        for pid in store.query_ids([v], 3)[0]:
            expected.setdefault(pid, None)
        for pid, _ in bm25.top_of(bm25.scores_many([q])[0], 3):
            expected.setdefault(pid, None)
    assert pool == [i for i in expected if i != "mbe_neg1"]


def test_a_fused_keyword_search_is_one_search_ranked_both_ways(loaded, monkeypatch):
    """A step's first angle (hybrid and BM25 fused): one pool, one embedding pass and one BM25
    scoring give what the two searches fused would give."""
    settings, _ = loaded
    queries = ["duty breach negligence", "adverse possession hostile"]
    apart = rag_utils.rrf_merge(
        [
            rag_utils.retrieve_documents_multi_query(queries, k=4, reranker=r, settings=settings)
            for r in ("hybrid", "bm25")
        ],
        4,
    )
    emb = rag_utils.get_embedder(settings)
    before = emb.calls
    store = rag_utils.get_store(settings)
    gets = []
    real_get = store.get
    monkeypatch.setattr(store, "get", lambda ids, **kw: gets.append(ids) or real_get(ids, **kw))
    fused = rag_utils.retrieve_documents_multi_query(
        queries, k=4, reranker="hybrid", settings=settings, fuse_keyword=True
    )
    assert _ids(fused) == _ids(apart)
    assert emb.calls - before == 1 and len(gets) == 1


# ------------------------------------------------------------------------------------------------
# weighted rank fusion
# ------------------------------------------------------------------------------------------------


def test_fusion_weight_moves_the_ranking_from_bm25_to_dense():
    dense = [0.9, 0.5, 0.1]  # dense order: a, b, c
    lexical = [0.0, 2.0, 7.0]  # BM25 order: c, b, a

    def order(w):
        fused = rag_utils.fuse_rankings(dense, lexical, w)
        return sorted(range(3), key=lambda i: -fused[i])

    assert order(1.0) == [0, 1, 2]
    assert order(0.0) == [2, 1, 0]
    assert order(0.7)[0] == 0 and order(0.3)[0] == 2
    even = rag_utils.fuse_rankings(dense, lexical, 0.5)
    assert even[0] == pytest.approx(even[2])  # rank 1 + rank 3 either way


def test_fusion_dense_weight_setting_reaches_hybrid_retrieval(loaded):
    settings, _ = loaded
    q = "a contract needs offer acceptance and consideration"
    dense = rag_utils.retrieve_documents(q, k=3, reranker="none", settings=settings)
    bm25 = rag_utils.retrieve_documents(q, k=3, reranker="bm25", settings=settings)
    all_dense = rag_utils.retrieve_documents(
        q, k=3, reranker="hybrid", settings=settings.replace(fusion_dense_weight=1.0)
    )
    all_bm25 = rag_utils.retrieve_documents(
        q, k=3, reranker="hybrid", settings=settings.replace(fusion_dense_weight=0.0)
    )
    assert _ids(all_dense) == _ids(dense)
    assert _ids(all_bm25)[0] == _ids(bm25)[0]


def test_fusion_weight_outside_0_1_is_rejected():
    from settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="FUSION_DENSE_WEIGHT"):
        Settings.from_env(env={"FUSION_DENSE_WEIGHT": "1.5"})


# ------------------------------------------------------------------------------------------------
# passage windows
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# the real ONNX export (slow)
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_onnx_export_matches_torch_and_a_corrupted_cache_is_rebuilt(tmp_settings, tmp_path):
    s = tmp_settings.replace(local_model_dir=str(tmp_path / "models"), embedding_backend="onnx")
    onnx_emb = rag_utils.get_embedder(s)
    assert onnx_emb.backend == "onnx" and onnx_emb.name == "all-MiniLM-L6-v2"
    cache = rag_utils.onnx_cache_dir(s)
    manifest = json.loads((cache / rag_utils.ONNX_MANIFEST).read_text())
    assert manifest["source_sha256"] == rag_utils.DEFAULT_MODEL_SHA256
    assert manifest["onnx_sha256"] == rag_utils.sha256_file(cache / rag_utils.ONNX_FILE)

    texts = [
        "Battery is an intentional harmful or offensive contact with the person of another.",
        "Hearsay is an out-of-court statement offered to prove the truth of the matter asserted.",
        "A contract requires offer, acceptance and consideration. " * 40,  # past 256 tokens
    ]
    got = onnx_emb.embed_documents(texts)
    torch_emb = rag_utils.get_embedder(s.replace(embedding_backend="torch"))
    assert torch_emb.backend == "torch"
    ref = torch_emb.embed_documents(texts)
    assert got.shape == ref.shape == (3, 384) and got.dtype == np.float32
    assert np.linalg.norm(got, axis=1) == pytest.approx([1.0] * 3, abs=1e-5)
    assert (got * ref).sum(axis=1).min() > 0.98  # int8 weights: close to, not equal to, fp32
    q = onnx_emb.embed_query("unwanted touching of another person")
    assert float(got[0] @ q) > float(got[1] @ q)
    # a text gets the same vector alone as beside a longer text: cosine thresholds read stable numbers
    assert onnx_emb.embed_documents(texts[:1])[0] == pytest.approx(got[0], abs=1e-6)
    assert onnx_emb.embed_documents(texts[::-1])[::-1] == pytest.approx(got, abs=1e-6)
    # a corrupted export is detected by its checksum and exported again
    with open(cache / rag_utils.ONNX_FILE, "r+b") as fh:
        fh.seek(1000)
        fh.write(b"\0" * 64)
    rag_utils._embedders.clear()
    again = rag_utils.get_embedder(s)
    assert again is not onnx_emb
    assert (
        rag_utils.sha256_file(cache / rag_utils.ONNX_FILE)
        == json.loads((cache / rag_utils.ONNX_MANIFEST).read_text())["onnx_sha256"]
    )
    assert again.embed_documents(texts) == pytest.approx(got, abs=1e-6)


# ------------------------------------------------------------------------------------------------
# LangChain Embeddings, both ways
# ------------------------------------------------------------------------------------------------


def test_any_langchain_embeddings_plugs_in_under_its_own_index(tmp_settings, monkeypatch):
    from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings

    monkeypatch.setattr(rag_utils, "_registered", {})
    rag_utils.register_embeddings("lc-fake-64", DeterministicFakeEmbedding(size=64))
    s = tmp_settings.replace(embedding_model="lc-fake-64")
    emb = rag_utils.get_embedder(s)
    assert emb.backend == "langchain" and emb.dimension == 64
    vecs = emb.embed_documents(["negligence duty", "battery contact"])
    assert vecs.shape == (2, 64) and vecs.dtype == np.float32
    assert np.linalg.norm(vecs, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert rag_utils.collection_name(s) == "passages__lc-fake-64"
    passages = load_corpus.read_passages(PASSAGES)
    load_corpus.load_passages(passages, s, progress=False)
    assert rag_utils.corpus_count(s) == len(passages) and rag_utils.corpus_count(tmp_settings) == 0
    text = passages[3]["text"]  # the fake embeds identical text identically
    docs = rag_utils.retrieve_documents(text, k=1, reranker="none", settings=s)
    assert docs[0]["id"] == passages[3]["idx"]

    wrapped = rag_utils.as_langchain(emb)  # and back: ours as a LangChain Embeddings
    assert isinstance(wrapped, Embeddings)
    as_lists = wrapped.embed_documents(["negligence duty"])
    assert isinstance(as_lists[0], list) and as_lists[0] == pytest.approx(vecs[0].tolist())


def test_rrf_merge_rewards_passages_ranked_well_by_several_queries():
    a = [{"id": "x"}, {"id": "y"}, {"id": "z"}]
    b = [{"id": "y"}, {"id": "w"}, {"id": "x"}]
    merged = rag_utils.rrf_merge([a, b], k=3)
    assert [d["id"] for d in merged] == ["y", "x", "w"]  # y: 1/62 + 1/61 beats x: 1/61 + 1/63
    assert [d["rank"] for d in merged] == [1, 2, 3]
    assert merged[0]["rrf_score"] == pytest.approx(1 / 62 + 1 / 61)
    assert rag_utils.rrf_merge([], k=3) == []


# ------------------------------------------------------------------------------------------------
# dense ranking centred on the corpus mean (DENSE_CENTERING)
# ------------------------------------------------------------------------------------------------

BOILERPLATE = "court held defendant plaintiff liable judgment appeal reversed"
TOPICS = ["negligence", "battery", "contract", "trespass", "fraud", "bailment"]
CENTRED_CORPUS = [
    {"idx": f"case{i}", "source": "caselaw", "text": f"{BOILERPLATE} {topic}"}
    for i, topic in enumerate(TOPICS)
] + [
    {"idx": idx, "source": "study", "text": text}
    for idx, text in [
        ("easement", "easement servient dominant tenement appurtenant"),
        ("hearsay", "hearsay statement offered truth matter asserted"),
    ]
]


@pytest.fixture
def centred_corpus(tmp_settings, fake):
    load_corpus.load_passages(CENTRED_CORPUS, tmp_settings, progress=False)
    return tmp_settings


def test_centering_ranks_the_passage_specific_to_the_query_above_shared_boilerplate(
    centred_corpus,
):
    # A fact pattern full of the words every caselaw passage shares, asking about an easement.
    q = f"{BOILERPLATE} the owner crossed the neighbour's land: is there an easement"
    plain = rag_utils.retrieve_documents(
        q, k=3, reranker="none", settings=centred_corpus.replace(dense_centering=False)
    )
    centred = rag_utils.retrieve_documents(q, k=3, reranker="none", settings=centred_corpus)
    assert _ids(plain)[0].startswith("case")  # the plain cosine follows the boilerplate
    assert _ids(centred)[0] == "easement"
    # the reported dense_score stays the plain cosine the evidence gates were calibrated on
    emb = rag_utils.get_embedder(centred_corpus)
    text = {p["idx"]: p["text"] for p in CENTRED_CORPUS}
    for d in centred:
        expected = float(emb.embed_query(q) @ emb.embed_query(text[d["id"]]))
        assert d["dense_score"] == pytest.approx(expected, abs=1e-5)


def test_centroid_is_the_mean_vector_saved_beside_the_index_and_follows_the_collection(
    centred_corpus,
):
    s = centred_corpus
    emb = rag_utils.get_embedder(s)
    mean = emb.embed_documents([p["text"] for p in CENTRED_CORPUS]).mean(0)
    assert np.allclose(rag_utils.get_centroid(s), mean, atol=1e-5)
    saved = Path(s.retrieval.chroma_dir).expanduser() / "centroid"
    assert len(list(saved.glob("*.json"))) == 1

    # a new process reads it from disk instead of scanning the collection
    rag_utils.reset_caches()
    store = rag_utils.get_store(s)
    scans = []
    store.mean_embedding = lambda: scans.append(1) or np.zeros(emb.dim, dtype=np.float32)
    assert np.allclose(rag_utils.get_centroid(s, store), mean, atol=1e-5)
    assert not scans
    del store.mean_embedding

    # more passages: recomputed
    extra = {"idx": "extra", "source": "study", "text": "adverse possession hostile open notorious"}
    load_corpus.load_passages([extra], s, progress=False)
    grown = emb.embed_documents([p["text"] for p in [*CENTRED_CORPUS, extra]]).mean(0)
    assert np.allclose(rag_utils.get_centroid(s), grown, atol=1e-5)


def test_centred_queries_are_unit_vectors_and_an_empty_centroid_changes_nothing():
    q = np.asarray([[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    out = rag_utils.centered_queries(q, np.asarray([0.3, 0.4, 0.0], dtype=np.float32))
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0)
    assert np.allclose(out[0], [0.6, 0.8, 0.0])  # direction kept when the mean is parallel
    assert out[1] @ np.asarray([0.6, 0.8, 0.0]) < 0  # pushed away from the common direction
    assert np.array_equal(rag_utils.centered_queries(q, np.zeros(0, dtype=np.float32)), q)
    same = rag_utils.centered_queries(q[:1], q[0])  # a query equal to the mean does not vanish
    assert np.allclose(same, q[:1])


@pytest.mark.slow
def test_vectors_of_the_gpu_and_cpu_paths_agree_per_passage(tmp_settings):
    """An index built by torch (fp32, or fp16 as on a GPU) serves ONNX int8 queries and back.
    Over the 2,476 passages of ../shared/data the ONNX-to-fp32 cosine is 0.983 at its lowest
    (36 below 0.99; docs/MEASUREMENTS.md, "Indexing speed"); these 24 are all above 0.99."""
    pytest.importorskip("torch", reason="the torch backend is not installed")
    import copy

    texts = [p["text"] for p in load_corpus.read_passages(PASSAGES)]
    onnx_emb = rag_utils.get_embedder(tmp_settings.replace(embedding_backend="onnx"))
    torch_emb = rag_utils.get_embedder(tmp_settings.replace(embedding_backend="torch"))
    assert (onnx_emb.backend, torch_emb.backend, torch_emb.device) == ("onnx", "torch", "cpu")
    cos = rag_utils.embedding_agreement(texts, onnx_emb, torch_emb)
    assert cos.shape == (len(texts),) and cos.min() >= 0.99
    half = rag_utils.Embedder(copy.deepcopy(torch_emb.model).half(), torch_emb.name, 16, "cpu")
    assert rag_utils.embedding_agreement(texts, half, torch_emb).min() >= 0.999
    assert rag_utils.embedding_agreement(texts, half, onnx_emb).min() >= 0.99
