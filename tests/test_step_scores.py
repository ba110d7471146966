"""A research step's gate numbers on a real context (a temporary store, a fake embedder): the
step's question is embedded once and the passage vectors read once, and the evidence score and
confidence are the highest and the mean cosine of the question, embedded alone, to the stored
passage vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import load_corpus
import nodes
import rag_utils
from context import AgentContext

PASSAGES = Path(__file__).resolve().parent / "fixtures" / "retrieval_passages.jsonl"
FACTS = ["The store left spilled milk on the floor for two hours and a shopper slipped on it."]


class Calls:
    """What the embedder embedded and how often passage vectors were read from the store."""

    def __init__(self, fake, monkeypatch) -> None:
        self.texts: list[list[str]] = []
        self.vector_reads = 0
        embed = fake.embed_documents
        get = rag_utils.PassageStore.get

        def recording_embed(texts):
            self.texts.append(list(texts))
            return embed(texts)

        vectors = rag_utils.PassageStore.vectors

        def counting_get(store, ids, with_embeddings=False):
            self.vector_reads += bool(with_embeddings)
            return get(store, ids, with_embeddings)

        def counting_vectors(store, ids):
            self.vector_reads += 1
            return vectors(store, ids)

        monkeypatch.setattr(fake, "embed_documents", recording_embed)
        monkeypatch.setattr(rag_utils.PassageStore, "get", counting_get)
        monkeypatch.setattr(rag_utils.PassageStore, "vectors", counting_vectors)

    def reset(self) -> None:
        self.texts, self.vector_reads = [], 0

    def embedded(self, text: str) -> int:
        return sum(t == text for batch in self.texts for t in batch)


@pytest.fixture
def real(tmp_settings, fake, monkeypatch):
    """``AgentContext.from_settings`` on the fixture passages, its searches warmed up (the BM25
    index and the exact-search matrix are built once per store, not per step), and a counter."""
    passages = load_corpus.read_passages(PASSAGES)
    assert load_corpus.load_passages(passages, tmp_settings, progress=False) == len(passages)
    ctx = AgentContext.from_settings(tmp_settings)
    ctx.search("hybrid+keyword", ["warm up"], 3, [])
    calls = Calls(fake, monkeypatch)
    return ctx, calls


def execute(ctx: AgentContext, step: dict) -> dict:
    update, _ = nodes.executor.step({"planning_table": [step]}, ctx)
    return update["planning_table"][0]["execution"]


def cosines(ctx: AgentContext, question: str, ids: list[str]) -> np.ndarray:
    """The question embedded alone against the stored vectors of the passages ``ids``."""
    docs = rag_utils.get_store(ctx.settings).get(ids, with_embeddings=True)
    vecs = np.asarray([d["embedding"] for d in docs], dtype=np.float32)
    return vecs @ rag_utils.get_embedder(ctx.settings).embed_query(question)


def expected(ctx: AgentContext, asked: str, execution: dict) -> tuple[float, float]:
    """Today's numbers: the highest cosine, and the mean of the first two."""
    cos = cosines(ctx, asked, execution["retrieved_doc_ids"])
    return (float(cos.max()), float(cos[:2].mean())) if len(cos) else (0.0, 0.0)


def test_a_step_embeds_its_question_once_and_reads_passage_vectors_once(real):
    ctx, calls = real
    step = nodes.step_for(1, "Negligence (Negligence per se)", FACTS)
    asked = nodes.issue_question("Negligence")
    assert step["strategy"]["queries"][0] == asked
    execution = execute(ctx, step)
    assert len(calls.texts) == 1 and calls.embedded(asked) == 1  # the search's one batch
    assert calls.vector_reads == 1
    assert execution["retrieved_doc_ids"] and not execution["gated"]
    calls.reset()
    evidence, confidence = expected(ctx, asked, execution)
    assert execution["evidence_score"] == pytest.approx(evidence, abs=1e-4)
    assert execution["confidence"] == pytest.approx(confidence, abs=1e-4)


def test_a_retry_angle_scores_its_passages_with_one_embedding_and_one_read(real):
    """The retry searches BM25 over other text: no dense scores to reuse, so the gate embeds the
    question and reads the vectors, once for both numbers."""
    ctx, calls = real
    first = nodes.step_for(1, "Negligence", FACTS)
    failed = {**first, "status": "failed", "execution": {"gated": True}}
    retry = nodes.replanner.step({"planning_table": [failed]}, ctx)[0]["planning_table"][0]
    assert retry["strategy"]["search_type"] == nodes.RETRY_SEARCH
    asked = nodes.issue_question("Negligence")
    execution = execute(ctx, retry)
    assert calls.texts == [[asked]] and calls.vector_reads == 1
    calls.reset()
    evidence, confidence = expected(ctx, asked, execution)
    assert execution["evidence_score"] == pytest.approx(evidence, abs=1e-4)
    assert execution["confidence"] == pytest.approx(confidence, abs=1e-4)


def test_the_off_topic_check_scores_each_sentence_with_its_own_search(real):
    ctx, calls = real
    question = "What are the elements of a negligence claim?"
    score = ctx.off_topic_score(question)
    assert score is None  # LEAN_GATE 0 in the test settings: nothing is off topic
    assert calls.texts == [[question]] and calls.vector_reads == 1
    calls.reset()
    docs = ctx.retrieve([question], ctx.settings.agent.retrieval_k, [])
    assert ctx.gate_scores(question, docs, [question]).evidence == pytest.approx(
        float(cosines(ctx, question, [d["id"] for d in docs]).max()), abs=1e-6
    )


def test_searched_cosines_are_used_only_for_the_question_the_search_ranked_by():
    docs = [{"id": "a", "dense_score": 0.7}, {"id": "b", "dense_score": 0.4}]
    question = "What are the rule and elements of Battery?"
    assert rag_utils.searched_cosines(question, docs, ["", f" {question}", "battery"]) == [
        0.7,
        0.4,
    ]
    assert rag_utils.searched_cosines(question, docs, ["battery", question]) is None
    assert rag_utils.searched_cosines(question, docs, []) is None
    keyword = [{"id": "a", "dense_score": None}, {"id": "b", "dense_score": 0.4}]
    assert rag_utils.searched_cosines(question, keyword, [question]) is None
