"""The run context: every dependency the agent's nodes use (``state.py`` holds what changes).

Nodes read ``runtime.context`` and never build a dependency.  :meth:`AgentContext.from_settings`
builds the real ones, :func:`default_context` those of LangGraph Studio runs; tests pass fakes."""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import answer as answer_stage
import filters
import injection
import legal_graph
import mc
import prompts
import question as question_mod
import rag_utils
from llm_config import LLMClient
from providers import resolve
from question import StateLaw
from rag_utils import Passage
from settings import Settings, load_dotenv_file

logger = logging.getLogger(__name__)


def gated_out(score: float | None, gate: float) -> bool:
    """Whether ``score`` (None: no evidence) is below ``gate`` (``LEAN_GATE``; 0 never blocks)."""
    return gate > 0 and (score is None or score < gate)


Retriever = Callable[[list[str], int, Sequence[str]], list[Passage]]
"""(queries, k, exclude_ids) -> passages for the queries (the first is primary), best first, none
excluded; ``dense_score`` is the cosine to the first query (None: the search embedded none)."""

CONFIDENCE_PASSAGES = 2
"""A step's confidence is the mean cosine of its question to this many best passages."""


@dataclass(frozen=True)
class GateScores:
    """A step's evidence score (its best question-passage cosine) and confidence; 0.0: none."""

    evidence: float
    confidence: float


@dataclass
class AgentContext:
    """What the nodes use, injected per run: ``graph.invoke(..., context=ctx)``."""

    settings: Settings
    client: LLMClient
    retrieve: Retriever
    embed: answer_stage.EmbedFn
    """texts -> L2-normalised rows."""
    check_memory: Callable[[str], dict | None]
    """question -> the QA memory's entry (question, answer, confidence, similarity, sources)."""
    write_memory: Callable[[str, dict, float, list[dict]], None]
    """(question, research answer, confidence, sources) -> None."""
    deadline: float | None = None
    """Absolute ``time.monotonic()`` by which the run must end (None: no limit)."""
    record_offset: int = 0
    """Index of the client's first call record that belongs to this run."""
    source_type: Callable[[Passage], str] = rag_utils.source_type
    """statute/rule, caselaw or study material of a passage (for the working memory)."""
    link_issues: Callable[[str], list[str]] | None = None
    """question -> the taxonomy's doctrines it links to, one item per claim."""
    doctrine_named: Callable[[str], str | None] | None = None
    """A user's words for an issue -> the taxonomy doctrine they name (None: none)."""
    unknown_terms: Callable[[str, str | None], list[str]] | None = None
    """(text, subject) -> its words no passage uses (``Bm25Index.unknown_terms``); None: none."""
    holds_documents: Callable[[], bool] | None = None
    """Whether the collection holds the user's own documents (None: it holds none)."""
    state_law: Callable[[str], StateLaw | None] | None = None
    """What a question asks -> the state whose law it asks for (:func:`state_law`); None: none."""
    scoped: Callable[[str], dict[str, Retriever]] | None = None
    """USPS code -> :attr:`searchers` within that state's law (None: FILTER_JURISDICTION is set)."""
    cosines: Callable[[str, list[Passage]], Sequence[float]] | None = None
    """(question, passages) -> the question's cosine to each; None: computed with ``embed``."""
    flag_headroom: ClassVar[int] = injection.FLAG_HEADROOM
    """Extra passages a search fetches to replace those the injection screen drops."""
    # The injection screen's verdicts, here because nodes do not import ``injection``.
    keep_clean = staticmethod(injection.keep_clean)
    rejection_message = staticmethod(injection.rejection_message)
    searchers: dict[str, Retriever] = field(default_factory=dict)
    """A retriever per search type (:func:`searchers`); a type without one uses ``retrieve``."""

    @classmethod
    def from_settings(cls, settings: Settings, *, client: LLMClient | None = None) -> AgentContext:
        """The real dependencies for ``settings`` (nothing heavy happens until first use)."""
        # The QA memory's scope, computed on first use (it counts the collection), then kept.
        scope = functools.cache(lambda: memory_scope(settings))
        scoped = functools.cache(lambda code: searchers(settings.replace(filter_jurisdiction=code)))
        holds_documents = functools.cache(lambda: rag_utils.get_store(settings).holds_documents())
        return cls(
            settings=settings,
            client=client or LLMClient(settings),
            retrieve=functools.partial(rag_utils.retrieve_documents_multi_query, settings=settings),
            cosines=functools.partial(rag_utils.passage_cosines, settings=settings),
            unknown_terms=lambda text, subj: rag_utils.get_bm25(settings).unknown_terms(text, subj),
            holds_documents=holds_documents,
            state_law=functools.partial(state_law, settings=settings),
            scoped=None if settings.filters.jurisdiction else scoped,
            embed=lambda texts: rag_utils.get_embedder(settings).embed_documents(texts),
            check_memory=lambda q: rag_utils.check_memory(q, settings=settings, scope=scope()),
            write_memory=lambda q, record, conf, sources=(): rag_utils.write_to_memory(
                q,
                record["text"],
                conf,
                settings=settings,
                sources=sources,
                scope=scope(),
                record=record,
            ),
            searchers=searchers(settings),
            doctrine_named=legal_graph.doctrine_named,
            link_issues=lambda q: legal_graph.claim_agenda(
                legal_graph.link_doctrines(q, settings), max_items=4
            ),
        )

    def search(
        self,
        search_type: str,
        queries: list[str],
        k: int,
        exclude_ids: Sequence[str],
        jurisdiction: str = "",
    ) -> list[Passage]:
        """One step's ``search_type`` search, within a state's law when ``jurisdiction`` is set."""
        if jurisdiction and self.scoped:
            return self.scoped(jurisdiction)[search_type](queries, k, exclude_ids)
        return self.searchers.get(search_type, self.retrieve)(queries, k, exclude_ids)

    def passage_cosines(
        self, question: str, docs: list[Passage], queries: Sequence[str] = ()
    ) -> list[float]:
        """The cosine of ``question`` to each of ``docs``: the ``dense_score`` of their search when
        its first query was ``question`` (``rag_utils.searched_cosines``), else computed once."""
        if (searched := rag_utils.searched_cosines(question, docs, queries)) is not None:
            return searched
        if self.cosines is not None:
            return [float(c) for c in self.cosines(question, docs)]
        texts = [d.get("text") or "" for d in docs]
        return [float(c) for c in answer_stage.cosines(self.embed, question, texts)]

    def gate_scores(
        self, question: str, docs: list[Passage], queries: Sequence[str] = ()
    ) -> GateScores:
        if not docs:
            return GateScores(0.0, 0.0)
        cos = self.passage_cosines(question, docs, queries)
        top = cos[:CONFIDENCE_PASSAGES]
        return GateScores(float(max(cos)), float(sum(top) / len(top)))

    def below_gate(self, score: float | None) -> bool:
        """:func:`gated_out` at ``LEAN_GATE`` (lean answers closed-book, a step is not used)."""
        return gated_out(score, self.settings.agent.lean_gate)

    def question_score(self, question: str) -> float:
        """The evidence score of ``question`` as asked: the best of its sentences, each against
        its own retrieval (3 of 32 fact patterns score 0.25-0.32 as a whole, 0.33+ by sentence)."""
        k = self.settings.agent.retrieval_k
        texts = question_mod.split_sentences(question) or [question]
        scores = (self.gate_scores(t, self.retrieve([t], k, []), [t]).evidence for t in texts)
        return max(0.0, *scores)

    def off_topic_score(self, question: str, best: float | None = None) -> float | None:
        """:meth:`question_score` (``best`` when known) when below ``LEAN_GATE``, else None (the
        research searches the model's issues, which can turn gibberish into law)."""
        best = self.question_score(question) if best is None else best
        return best if self.below_gate(best) else None

    def lean_evidence(
        self, question: str, choices: dict[str, str]
    ) -> tuple[list[Passage], list[dict], float]:
        """Lean mode's (passages, flagged, score): one search of the question with its ``(A) text``
        choice lines (hybrid R@10 0.279 vs 0.216 for the question alone on barexam_dev), flagged
        passages replaced by the next ones, at most RETRIEVAL_K."""
        k = self.settings.agent.retrieval_k
        query = f"{' '.join(question.split())}\n{mc.format_choices(choices)}"
        docs, flagged = self.keep_clean(self.retrieve([query], k + self.flag_headroom, []), k)
        return docs, flagged, self.gate_scores(question, docs).evidence

    def check_injection(self, text: str) -> injection.InjectionCheck:
        """The injection verdict on the user's input (``injection.detect``); the model's verdict
        is asked for unless SKIP_INJECTION_CHECK, by default only of an API model."""
        skip = self.settings.agent.skip_injection_check
        if skip is None:
            skip = self.client.is_local("injection")
        return injection.detect(text, self.client, skip_llm=skip)

    def verdict_support(self) -> float:
        """The support a reading needs to be shown (VERDICT_SUPPORT; unset: none is shown on the
        embedded model, ``answer.API_VERDICT_SUPPORT`` with an API model)."""
        if (bar := self.settings.agent.verdict_support) is not None:
            return bar
        local = self.client.is_local("bottom_line")
        return answer_stage.NO_VERDICT if local else answer_stage.API_VERDICT_SUPPORT

    def start_run(self) -> AgentContext:
        """Mark the start of a run: its LLM records and its deadline (``RUN_TIMEOUT``)."""
        self.record_offset = len(self.client.records)
        timeout = float(self.settings.agent.run_timeout or 0)
        self.deadline = time.monotonic() + timeout if timeout > 0 else None
        self.client.deadline = self.deadline
        return self

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


def state_law(asked: str, settings: Settings) -> StateLaw | None:
    """The state whose law ``asked`` asks for and whether the collection holds any; or a foreign
    country's, unless user documents (tagged with US jurisdictions only) could hold it; or None."""
    store = rag_utils.get_store(settings)
    state = filters.jurisdiction_asked(asked)
    if state is not None:
        return StateLaw(*state, store.holds_jurisdiction(state[1]))
    country = filters.foreign_law_asked(asked)
    return None if country is None or store.holds_documents() else StateLaw(country, "", False)


def searchers(settings: Settings) -> dict[str, Retriever]:
    """A retriever per search type (hybrid+keyword: a step's first angle) within the filter."""
    retrieve = functools.partial(rag_utils.retrieve_documents_multi_query, settings=settings)

    def hybrid(
        queries: list[str], k: int, exclude_ids: Sequence[str], fuse_keyword: bool = False
    ) -> list[Passage]:
        # A hybrid step reranks its dense + BM25 pool with the cross-encoder when RERANKER
        # resolves to one (set, or auto with the model on disk).
        cross = rag_utils.resolve_reranker(None, settings) == "cross-encoder"
        reranker = "cross-encoder" if cross else "hybrid"
        return retrieve(queries, k, exclude_ids, reranker=reranker, fuse_keyword=fuse_keyword)

    return {
        "dense": functools.partial(retrieve, reranker="none"),
        "keyword": functools.partial(retrieve, reranker="bm25"),
        "hybrid": hybrid,
        "hybrid+keyword": functools.partial(hybrid, fuse_keyword=True),
    }


def memory_scope(settings: Settings) -> dict[str, str]:
    """What a cached answer depends on: passage filter, provider, model, embedder, corpus, mode."""
    llm = resolve("synthesize", settings)
    return {
        "filter": filters.passage_filter(settings).describe(),
        "provider": llm.provider,
        "model": llm.model,
        "embedding_model": rag_utils.embedder_name(settings),
        "corpus": rag_utils.corpus_fingerprint(settings),
        "answer_mode": settings.agent.answer_mode,
        "code": answering_code(),
    }


@functools.cache
def answering_code() -> str:
    """A digest of the code and prompts that write answers: after an upgrade that changes them,
    the answers saved before are not served (a user was shown an earlier version's answer to the
    demo, "Not answered: State action", as if it were this version's)."""
    here = Path(__file__).parent
    modules = ("answer", "context", "mc", "nodes", "prompts", "question", "rag_utils")
    files = [here / f"{m}.py" for m in modules] + sorted(prompts.SKILLS_DIR.glob("*.md"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_default_lock = threading.Lock()
_default: AgentContext | None = None
prepare_store: Callable[[Settings], int] | None = None
"""What :func:`default_context` runs on the store first (passages added): the graph factory of
``langgraph dev`` (``main.make_graph``) sets the loader's ``ensure_starter_index`` here, so the
context stands below the loader and a fresh machine's first Studio run finds the starter corpus."""


def default_context() -> AgentContext:
    """The context of runs that bring none (LangGraph Studio), built once from the environment,
    after :data:`prepare_store`.  Here, in the first run, not in the graph factory: ``langgraph
    dev`` calls the factory on its event loop and refuses a blocking read there."""
    global _default
    with _default_lock:
        if _default is None:
            load_dotenv_file()
            settings = Settings.from_env()
            if prepare_store is not None and (added := prepare_store(settings)):
                logger.info("built the starter index: %d passages", added)
            _default = AgentContext.from_settings(settings)
        return _default
