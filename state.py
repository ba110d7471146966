"""The agent graph's state and plan steps (the run's dependencies are in context.py).

Reducers: ``planning_table`` merges steps by ``step_id`` (a node returns only the steps it added or
changed); ``flagged_passages``, ``fallbacks`` and ``trace`` append.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict


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
    rerank_top_score: float | None
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
    addresses: str
    facts: list[str]
    """The fact sentences that raise the issue (its queries carry them)."""


class MemoryEntry(TypedDict):
    """One research iteration in the working memory (``chain_of_thought``), computed in code."""

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
    """Reducer: steps in ``right`` replace those of ``left`` with the same step_id; new ones append."""
    merged = {s["step_id"]: s for s in [*(left or []), *(right or [])]}
    return sorted(merged.values(), key=lambda s: s["step_id"])


class TraceEvent(TypedDict):
    node: str
    decision: str
    seconds: float


class AgentState(TypedDict, total=False):
    global_objective: str
    """The user's question, with the MC choices as "(A) ..." lines when present."""
    question: str
    """The question without choices (what classifier, planner and replanner see)."""
    choices: dict[str, str]
    issues: list[str]
    """The legal issues the planner identified: the research agenda, one step each."""
    researched_issues: list[str]
    """The issues given a step (at most MAX_STEPS; the rest are not answered)."""
    planning_table: Annotated[list[PlanStep], merge_steps]
    query_type: Literal["simple", "multi_hop"]
    legal_question: bool
    """The classifier's reading: does the question ask about the law at all (absent: yes)."""
    question_area: str
    """The classifier's field of law for the question (``prompts.Area``; absent: not read)."""
    question_topic: str
    """The classifier's words for what the question asks for (absent: not read)."""
    final_cited_answer: str
    research_answer: str
    """The answer's text without the MC selection (what memory stores; "" when it abstained)."""
    abstained: bool
    """The answer record's ``abstained``: off topic, or no issue's research found a rule."""
    iteration_count: int
    injection_check: dict[str, Any]
    memory_hit: bool
    memory_source: dict[str, Any]
    """On a memory hit: the question the answer was saved for, its similarity, when saved."""
    mc_answer: dict[str, Any] | None
    sources: list[dict[str, Any]]
    """The passages the answer cites: id, title, support (the cited sentence), ref ("[N]")."""
    passages: dict[str, dict[str, Any]]
    """Every passage retrieved (or cited by a cached answer) by id: id, title, source, text, pin."""
    flagged_passages: Annotated[list[dict[str, Any]], operator.add]
    """Passages the injection screen dropped: {"id", "patterns"}."""
    answer_mode: Literal["auto", "research", "evidence", "lean"]
    """How the answer is made (ANSWER_MODE; a Studio run may set it in its input)."""
    answer: dict[str, Any]
    """The answer record (``answer.AnswerRecord.to_dict()``) the CLI, memory and evals read."""
    lean: dict[str, Any]
    """Lean's retrieval for the letter: route (rag, closed_book), score, gate, passages, flagged."""
    chain_of_thought: list[MemoryEntry]
    """The working memory: one entry per research iteration (the replanner reads it)."""
    fallbacks: Annotated[list[str], operator.add]
    """Where a node fell back because a model reply was unusable (such research is not cached)."""
    error: str | None
    decline: str
    """Why the planner declined an open question as off topic ("" or absent: it did not)."""
    jurisdiction: str
    """The state (USPS code) whose law the question asks for and alone is searched ("": all)."""
    stop_reason: str
    run_metrics: dict[str, Any]
    trace: Annotated[list[TraceEvent], operator.add]
