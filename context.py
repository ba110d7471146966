"""The run context: every dependency the agent's nodes use, typed and built once per run.

Layout as in LangGraph's agent templates: ``state.py`` holds what changes during a run,
``context.py`` what does not (settings, the LLM client, retrieval, the embedder, the QA memory,
the run's deadline).  Nodes read ``runtime.context`` and nothing else; they never build a
dependency themselves.

- :meth:`AgentContext.from_settings` is the one constructor of the real dependencies, used by
  ``run_agent``, the eval scripts and the benchmarks.
- :func:`default_context` is the cached context of LangGraph Studio runs, which bring none.
- Tests build an ``AgentContext`` directly with fakes for any field.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

import answer as answer_stage
import filters
import injection
import legal_graph
import load_corpus
import mc
import rag_utils
from llm_config import LLMClient
from providers import resolve
from rag_utils import Passage
from settings import Settings, load_dotenv_file

logger = logging.getLogger(__name__)


def gated_out(score: float | None, gate: float) -> bool:
    """True when evidence scoring ``score`` is not to be used at ``gate`` (``LEAN_GATE``,
    calibrated by ``benchmarks/bench_agent.py gate``): below it, or no score at all; a gate of 0
    never blocks."""
    return gate > 0 and (score is None or score < gate)


class Retriever(Protocol):
    def __call__(self, queries: list[str], k: int, exclude_ids: Sequence[str]) -> list[Passage]:
        """Passages for ``queries`` (the first is primary), best first, none of ``exclude_ids``:
        id, text, title, source, metadata, dense_score (the plain cosine of the primary query to
        the passage; None when the search embedded no query), rerank_score."""
        ...


ConfidenceFn = Callable[[str, list[Passage]], float]
"""(question, passages the answer stands on) -> confidence in [0, 1]."""
CosineFn = Callable[[str, list[Passage]], Sequence[float]]
"""(question, passages) -> the cosine of the question to each passage."""
EmbedFn = Callable[[list[str]], Any]
"""texts -> L2-normalised rows (np.ndarray or lists)."""
MemoryLookup = Callable[[str], "dict | None"]
"""question -> the cached entry ({question, answer, confidence, similarity, sources}) or None."""
MemoryWrite = Callable[[str, str, float, list[dict]], None]
"""(question, research answer, confidence, sources) -> None."""

CONFIDENCE_PASSAGES = 2
"""A step's confidence is the mean cosine of its question to this many best passages."""


@dataclass(frozen=True)
class GateScores:
    """A step's two numbers, both read from one cosine of its question to each passage."""

    evidence: float
    """The evidence gate's score: the highest cosine (0.0 for no passage)."""
    confidence: float
    """The mean cosine of the first CONFIDENCE_PASSAGES passages (0.0 for none)."""


@dataclass
class AgentContext:
    """What the nodes use, injected per run: ``graph.invoke(..., context=ctx)``."""

    settings: Settings
    client: LLMClient
    retrieve: Retriever
    embed: EmbedFn
    check_memory: MemoryLookup
    write_memory: MemoryWrite
    deadline: float | None = None
    """Absolute ``time.monotonic()`` by which the run must end (None: no limit)."""
    record_offset: int = 0
    """Index of the client's first call record that belongs to this run."""
    screen_passage: Callable[[str], list[str]] = field(default=injection.screen_passage)
    """Names of the injection patterns a passage's text matches (empty: clean)."""
    source_type: Callable[[Passage], str] = field(default=rag_utils.source_type)
    """statute/rule, caselaw or study material of a passage (one classification for the working
    memory)."""
    link_issues: Callable[[str, list[str]], list[str]] | None = None
    """(question, the model's issues) -> the research agenda: the issues merged with the doctrines
    the question links to in the legal taxonomy, one item per claim (None: the model's issues)."""
    unknown_terms: Callable[[str, str | None], list[str]] | None = None
    """(text, subject) -> its words that no passage of the corpus uses, with a subject only those
    the subject also uses (``Bm25Index.unknown_terms``); None: no check (every word is known)."""
    holds_documents: Callable[[], bool] | None = None
    """Whether the collection holds the user's own documents (``load_corpus.py docs``), whose
    fields of law the agent cannot know (None: it holds none)."""
    state_law: Callable[[str], StateLaw | None] | None = None
    """(what a question asks) -> the state whose law it asks for ("How many days does Ohio law
    give him?": Ohio) and whether some passage of the collection is that state's law
    (:func:`state_law`); None: no check."""
    scoped: Callable[[str], dict[str, Retriever]] | None = None
    """A state's USPS code -> the searchers of :attr:`searchers` restricted to that state's law,
    for a question that asks what it provides; None when the user set FILTER_JURISDICTION,
    whose choice governs every search."""
    cosines: CosineFn | None = None
    """(question, passages) -> the cosine of the question to each passage, from one embedding of
    the question and one read of the passage vectors (``rag_utils.passage_cosines``); None:
    computed with ``embed``.  Used when the search's own cosines do not apply
    (:meth:`passage_cosines`)."""
    evidence_score: ConfidenceFn | None = None
    """A scripted evidence score (tests, benchmarks) in place of the highest cosine."""
    confidence: ConfidenceFn | None = None
    """A scripted confidence (tests, benchmarks) in place of the mean cosine of the first
    passages."""
    flag_headroom: ClassVar[int] = injection.FLAG_HEADROOM
    """Extra passages a search fetches to replace those the injection screen drops."""
    searchers: dict[str, Retriever] = field(default_factory=dict)
    """A retriever per search type (dense, keyword, hybrid, and hybrid+keyword, a step's first
    angle); a type without one uses ``retrieve``."""

    @classmethod
    def from_settings(cls, settings: Settings, *, client: LLMClient | None = None) -> AgentContext:
        """The real dependencies for ``settings`` (nothing heavy happens until first use)."""
        client = client or LLMClient(settings)
        # The QA memory's scope, computed on first use (it counts the collection), then kept.
        scope = functools.cache(lambda: memory_scope(settings))

        def link_issues(question: str, issues: list[str]) -> list[str]:
            linked = legal_graph.link_doctrines(question, settings)
            return legal_graph.merge_agenda(issues, linked, max_items=4)

        def embed(texts: list[str]) -> Any:
            return rag_utils.get_embedder(settings).embed_documents(texts)

        def check_memory(question: str) -> dict | None:
            return rag_utils.check_memory(question, settings=settings, scope=scope())

        def write_memory(
            question: str, answer: str, confidence: float, sources: Sequence[dict] = ()
        ) -> None:
            rag_utils.write_to_memory(
                question, answer, confidence, settings=settings, sources=sources, scope=scope()
            )

        return cls(
            settings=settings,
            client=client,
            retrieve=functools.partial(rag_utils.retrieve_documents_multi_query, settings=settings),
            cosines=functools.partial(rag_utils.passage_cosines, settings=settings),
            unknown_terms=lambda text, subject: rag_utils.get_bm25(settings).unknown_terms(
                text, subject
            ),
            holds_documents=functools.cache(
                lambda: rag_utils.get_store(settings).holds_documents()
            ),
            state_law=functools.partial(state_law, settings=settings),
            scoped=None
            if settings.filters.jurisdiction
            else functools.cache(
                lambda code: searchers(settings.replace(filter_jurisdiction=code))
            ),
            embed=embed,
            check_memory=check_memory,
            write_memory=write_memory,
            searchers=searchers(settings),
            link_issues=link_issues,
        )

    def search(
        self,
        search_type: str,
        queries: list[str],
        k: int,
        exclude_ids: Sequence[str],
        jurisdiction: str = "",
    ) -> list[Passage]:
        """Route one step's search on its strategy's ``search_type``, within ``jurisdiction``'s
        law when given (a state's USPS code; :attr:`scoped`)."""
        if jurisdiction and self.scoped:
            return self.scoped(jurisdiction)[search_type](queries, k, exclude_ids)
        return self.searchers.get(search_type, self.retrieve)(queries, k, exclude_ids)

    def passage_cosines(
        self, question: str, docs: list[Passage], queries: Sequence[str] = ()
    ) -> list[float]:
        """The cosine of ``question`` to each of ``docs``, which the search of ``queries`` found.

        A search embeds its queries in one pass, reads the vectors of the passages it ranks, and
        puts on each passage its plain cosine to its first query (``dense_score``).  When that
        query is ``question`` those are the cosines asked for (``rag_utils.searched_cosines``),
        so a step embeds its question once and reads the passage vectors once, and every gate
        reads the numbers the search ranked with.  Otherwise (a keyword search embeds nothing; a
        retry angle or lean's query searched another text) they are computed, once."""
        searched = rag_utils.searched_cosines(question, docs, queries)
        if searched is not None:
            return searched
        if self.cosines is not None:
            return [float(c) for c in self.cosines(question, docs)]
        rows = np.asarray(self.embed([question, *[d.get("text") or "" for d in docs]]))
        return [float(c) for c in rows[1:] @ rows[0]]

    def gate_scores(
        self, question: str, docs: list[Passage], queries: Sequence[str] = ()
    ) -> GateScores:
        """The evidence score and the confidence of ``docs`` for ``question``, from one list of
        cosines (:meth:`passage_cosines`); a scripted number replaces its computed one."""
        if not docs:
            return GateScores(0.0, 0.0)
        top = docs[:CONFIDENCE_PASSAGES]
        cos: list[float] = []
        if self.evidence_score is None or self.confidence is None:
            cos = self.passage_cosines(question, docs, queries)
        evidence = self.evidence_score(question, docs) if self.evidence_score else max(cos)
        confidence = (
            self.confidence(question, top) if self.confidence else sum(cos[: len(top)]) / len(top)
        )
        return GateScores(float(evidence), float(confidence))

    def score_evidence(
        self, question: str, docs: list[Passage], queries: Sequence[str] = ()
    ) -> float:
        """The evidence gate's score of ``docs`` for ``question`` (0.0 for none)."""
        return self.gate_scores(question, docs, queries).evidence

    def keep_clean(self, retrieved: list[Passage], k: int) -> tuple[list[Passage], list[dict]]:
        """``(kept, flagged)``: ``injection.keep_clean`` with this run's passage screen."""
        return injection.keep_clean(retrieved, k, self.screen_passage)

    def rejection_message(self, check: injection.InjectionCheck) -> str:
        """What the user reads when the input is rejected (``injection.rejection_message``); here so
        that the nodes depend on the context, not on the injection module."""
        return injection.rejection_message(check)

    def below_gate(self, score: float | None) -> bool:
        """:func:`gated_out` at ``LEAN_GATE``: lean mode then answers closed-book, and a research
        step is not synthesized."""
        return gated_out(score, self.settings.agent.lean_gate)

    def question_score(self, question: str) -> float:
        """The evidence score of ``question`` as asked: the best of its sentences, each against
        its own retrieval (3 of 32 fact patterns score 0.25-0.32 as a whole, 0.33+ by sentence)."""
        best = 0.0
        for text in answer_stage.split_sentences(question) or [question]:
            docs = self.retrieve([text], self.settings.agent.retrieval_k, [])
            best = max(best, self.score_evidence(text, docs, [text]))
        return best

    def off_topic_score(self, question: str, best: float | None = None) -> float | None:
        """:meth:`question_score` (``best`` when already known) when below ``LEAN_GATE``, else
        None: the research searches the model's issues, which can turn gibberish into law."""
        best = self.question_score(question) if best is None else best
        return best if self.below_gate(best) else None

    def lean_evidence(
        self, question: str, choices: dict[str, str]
    ) -> tuple[list[Passage], list[dict], float]:
        """Lean mode's evidence, read by the letter in every mode: passages, flagged ones, the
        score.  Lean mode is the graph's route with no research step.  One retrieval with the
        question and its choices as ``(A) text`` lines (the best query that costs no call: hybrid
        R@10 0.279 against 0.216 for the question alone on barexam_dev), passages that carry
        instructions dropped and replaced by the next ones, at most RETRIEVAL_K kept."""
        k = self.settings.agent.retrieval_k
        query = f"{' '.join(question.split())}\n{mc.format_choices(choices)}"
        docs, flagged = self.keep_clean(self.retrieve([query], k + injection.FLAG_HEADROOM, []), k)
        return docs, flagged, (self.score_evidence(question, docs) if docs else 0.0)

    def check_injection(self, text: str) -> injection.InjectionCheck:
        """The injection verdict on the user's input (``injection.detect``)."""
        return injection.detect(
            text, self.client, skip_llm=self.settings.agent.skip_injection_check
        )

    def start_run(self) -> AgentContext:
        """Mark the start of a run: its LLM records and its deadline (``RUN_TIMEOUT``)."""
        self.record_offset = len(self.client.records)
        timeout = float(self.settings.agent.run_timeout or 0)
        self.deadline = time.monotonic() + timeout if timeout > 0 else None
        self.client.deadline = self.deadline
        return self

    def time_left(self) -> float | None:
        """Seconds before the run's deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()


@dataclass(frozen=True)
class StateLaw:
    """The state, or another country, whose law a question asks for."""

    name: str
    """A state's name ("Ohio"), or a country's demonym ("French")."""
    code: str
    """A state's USPS code (passage metadata ``jurisdiction``); "" for a country."""
    held: bool
    """Whether some passage of the collection is that state's law."""


def state_law(asked: str, settings: Settings) -> StateLaw | None:
    """The state whose law ``asked`` asks for (``filters.jurisdiction_asked``), and whether the
    collection holds any of it; or another country's (``filters.foreign_law_asked``), which only
    the user's own documents could hold (they are tagged with US jurisdictions only); None when
    it asks for neither."""
    store = rag_utils.get_store(settings)
    state = filters.jurisdiction_asked(asked)
    if state is not None:
        return StateLaw(*state, store.holds_jurisdiction(state[1]))
    country = filters.foreign_law_asked(asked)
    return None if country is None or store.holds_documents() else StateLaw(country, "", False)


def searchers(settings: Settings) -> dict[str, Retriever]:
    """A retriever per search type: dense, keyword, hybrid, and hybrid+keyword (a step's first
    angle), each searching what ``settings``' passage filter admits."""

    def with_reranker(name: str, fuse_keyword: bool = False) -> Retriever:
        def search(queries: list[str], k: int, exclude_ids: Sequence[str]) -> list[Passage]:
            reranker = name
            # A hybrid step ranks with the cross-encoder when RERANKER resolves to one (set
            # explicitly, or auto with the model on disk): it reranks the same dense + BM25
            # pool. Without this the agent, whose steps are nearly all hybrid, ignored it.
            if name == "hybrid" and rag_utils.resolve_reranker(None, settings) == "cross-encoder":
                reranker = "cross-encoder"
            return rag_utils.retrieve_documents_multi_query(
                queries,
                k=k,
                exclude_ids=exclude_ids,
                reranker=reranker,
                settings=settings,
                fuse_keyword=fuse_keyword,
            )

        return search

    return {
        "dense": with_reranker("none"),
        "keyword": with_reranker("bm25"),
        "hybrid": with_reranker("hybrid"),
        "hybrid+keyword": with_reranker("hybrid", fuse_keyword=True),
    }


def memory_scope(settings: Settings) -> dict[str, str]:
    """The provider, model, embedding model, corpus fingerprint and passage filter a cached
    answer depends on."""
    llm = resolve("synthesize", settings)
    return {
        "filter": filters.passage_filter(settings).describe(),
        "provider": llm.provider,
        "model": llm.model,
        "embedding_model": rag_utils.embedder_name(settings),
        "corpus": rag_utils.corpus_fingerprint(settings),
        "answer_mode": settings.agent.answer_mode,
    }


_default_lock = threading.Lock()
_default: AgentContext | None = None


def default_context() -> AgentContext:
    """The context of runs that bring none (LangGraph Studio / ``langgraph dev``): built once
    from the environment's settings (and ``.env``), with the starter corpus indexed when the store
    is empty, as ``python main.py`` does; without it a first Studio run would find no passages."""
    global _default
    with _default_lock:
        if _default is None:
            load_dotenv_file()
            settings = Settings.from_env()
            added = load_corpus.ensure_starter_index(settings)
            if added:
                logger.info("built the starter index: %d passages", added)
            _default = AgentContext.from_settings(settings)
        return _default
