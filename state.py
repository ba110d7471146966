"""The agent graph's state and plan steps (the run's dependencies are in context.py)."""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict, get_type_hints

from question import Question

STATE_VERSION = 2
"""The :class:`AgentState` version in each checkpoint's metadata (``state_version``).  Raise it when
a key changes its meaning or type: an older thread is then refused with one line
(``main.thread_state``), not misread mid-run.  v1: none recorded; v2: the agenda and a QA-memory hit
moved into ``reading``."""


class Execution(TypedDict, total=False):
    """What the executor did for one step (no model call: the answer stage reads the passages)."""

    optimized_query: str
    alternatives: list[str]
    retrieved_doc_ids: list[str]
    """The step's passages, best first."""
    confidence: float
    """Mean cosine of the issue's question to the step's two best passages."""
    evidence_score: float
    """Best cosine of the issue's question to a passage (the evidence gate's score)."""
    gated: bool
    """True when no passage reached LEAN_GATE (the step fails)."""
    flagged_passages: list[dict[str, Any]]
    """Retrieved passages dropped by the injection screen: {"id", "patterns"}."""


class PlanStep(TypedDict, total=False):
    step_id: int
    status: Literal["pending", "completed", "failed"]
    phase: str
    """"rule" for an issue's first angle, "retry" for its other angle."""
    question: str
    """The issue's doctrinal question with the facts that raise it."""
    execution: Execution | None
    strategy: dict[str, Any]
    """search_type and queries (the doctrine's names and the issue's facts)."""
    issue: str
    facts: list[str]
    """The fact sentences that raise the issue (its queries carry them)."""


class MemoryEntry(TypedDict):
    """One research iteration in the working memory (``chain_of_thought``)."""

    step_id: int
    query: str
    strategy: dict[str, Any]
    """search_type, queries, executed_as (what ran)."""
    results: dict[str, Any]
    """count, source_types, titles, top_score, confidence."""
    leads: list[str]
    dead_ends: list[str]
    next_steps: list[str]


def merge_steps(left: list[PlanStep] | None, right: list[PlanStep] | None) -> list[PlanStep]:
    """Reducer: a node returns only the steps it added or changed; each replaces the one of ``left``
    with its step_id, or appends."""
    merged = {s["step_id"]: s for s in [*(left or []), *(right or [])]}
    return sorted(merged.values(), key=lambda s: s["step_id"])


class TraceEvent(TypedDict):
    node: str
    decision: str
    seconds: float


class Turn(TypedDict, total=False):
    """One question asked on a thread, as the thread keeps it for the follow-ups (``turns``)."""

    question: str
    facts: list[str]
    """Every fact the thread had stated by this turn (the earlier turns' and its own)."""
    asked: str
    reading: dict[str, Any]
    """The classifier's reading: legal, area, topic."""
    issues: list[str]
    steps: list[PlanStep]
    """The completed research steps, their passages in ``passages``."""
    passages: dict[str, dict[str, Any]]
    answer: dict[str, Any]
    """The turn's answer record."""


class AgentState(TypedDict, total=False):
    question: str
    """The user's input: the question, with the MC choices as "(A) ..." lines when present."""
    parsed: Question
    """The question read once (``question.Question``): text, choices, facts, what is asked, kind."""
    answer_mode: Literal["auto", "research", "evidence", "lean"]
    """How the answer is made (ANSWER_MODE; a Studio run may set it in its input)."""
    review: bool
    """Input: pause after the planner for the user to keep, drop or add issues (``--review``;
    LangGraph's ``interrupt``, resumed with ``Command(resume=...)``)."""
    turns: Annotated[list[Turn], operator.add]
    """The thread's conversation, one entry per question asked on it (the last node adds it): a
    question after the first is a follow-up on the facts and research of those before it."""
    reading: Annotated[dict[str, Any], operator.or_]
    """What the nodes read of the question before researching it: ``injection`` (the check's
    verdict), ``mode`` (the answer mode resolved), ``recalled`` (a QA-memory hit), the classifier's
    ``legal``, ``area`` and ``topic``, the planner's ``agenda`` (one step per issue; the replanner
    adds to it), ``candidates``, ``decline`` (why it is off topic) and ``within`` (the state whose
    law alone is searched).  It and every key below belong to one question: the first node resets
    them (``nodes.RUN_SCOPED``)."""
    planning_table: Annotated[list[PlanStep], merge_steps]
    passages: dict[str, dict[str, Any]]
    """Every passage retrieved (or cited by a cached answer) by id: id, title, source, text, pin."""
    flagged_passages: Annotated[list[dict[str, Any]], operator.add]
    """Passages the injection screen dropped: {"id", "patterns"}."""
    chain_of_thought: list[MemoryEntry]
    """The working memory: one entry per research iteration."""
    answer: dict[str, Any]
    """The answer record (``answer.AnswerRecord.to_dict()``) the CLI, memory and evals read."""
    stop_reason: str
    fallbacks: Annotated[list[str], operator.add]
    """Where a node fell back because a model reply was unusable (such research is not cached)."""
    run_metrics: dict[str, Any]
    trace: Annotated[list[TraceEvent], operator.add]


def _keys(name: str, keys: str) -> Any:
    """A schema of some of :class:`AgentState`'s keys (space-separated), their types and reducers."""
    hints = get_type_hints(AgentState, include_extras=True)
    return TypedDict(name, {k: hints[k] for k in keys.split()}, total=False)


AnswerStageInput = _keys(
    "AnswerStageInput", "parsed answer_mode reading planning_table passages stop_reason turns"
)
"""What the answer stage (``main.build_answer_stage``) reads of the run; not the trace: the stage's
own events are its output."""
AnswerStageOutput = _keys("AnswerStageOutput", "answer stop_reason trace")
"""What the answer stage hands back: the record, decided once, and its nodes' trace events."""
