"""Types of the agent graph: its state and plan steps (the run's dependencies are in context.py).

Lists that grow during a run have reducers: ``planning_table`` merges steps by ``step_id`` (a node
returns only the steps it added or changed), ``flagged_passages``, ``fallbacks`` and ``trace``
append.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict

StepStatus = Literal["pending", "completed", "failed"]
QueryType = Literal["simple", "multi_hop"]


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
    status: StepStatus
    phase: str
    """"rule" for an issue's first angle, "retry" for its other angle."""
    question: str
    """The issue's doctrinal question with the facts that raise it."""
    execution: Execution | None
    strategy: dict[str, Any]
    """search_type and queries (the doctrine's names and the issue's facts)."""
    issue: str
    """The agenda issue the step researches."""
    addresses: str
    facts: list[str]
    """The fact sentences that raise the issue (its queries carry them; the answer applies to them)."""


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
    merged = {s["step_id"]: s for s in left or []}
    for step in right or []:
        merged[step["step_id"]] = step
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
    """The issues given a step (at most MAX_STEPS; the rest are reported as not answered)."""
    planning_table: Annotated[list[PlanStep], merge_steps]
    query_type: QueryType
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
    """The answer record's ``abstained``: off topic as asked, or no issue's research found a rule
    (under the evidence policy: a rule the grounding gate verified)."""
    iteration_count: int
    injection_check: dict[str, Any]
    memory_hit: bool
    memory_source: dict[str, Any]
    """On a memory hit: the question the answer was saved for, its similarity, when saved."""
    mc_answer: dict[str, Any] | None
    sources: list[dict[str, Any]]
    """The passages the answer cites: id, title, support (the cited sentence), ref ("[N]")."""
    passages: dict[str, dict[str, Any]]
    """Every passage retrieved in this run (or cited by a cached answer) by id: the id, title,
    source and text of its ``rag_utils.Passage``, and its pin cite ``pin``."""
    flagged_passages: Annotated[list[dict[str, Any]], operator.add]
    """Retrieved passages dropped because their text carries instructions (injection screen):
    {"id", "patterns"}."""
    answer_mode: Literal["auto", "research", "evidence", "lean"]
    """How the answer is made (ANSWER_MODE; a Studio run may set it in its input)."""
    answer: dict[str, Any]
    """The answer record (``answer.AnswerRecord.to_dict()``), decided once by the answer stage:
    text, issues (rule, application, conclusion sentences with their citation numbers),
    citations, abstained and why, verdict, letter, grounded, quotes, guards.  The CLI, the exit
    code, the QA memory and the evals read it."""
    lean: dict[str, Any]
    """What the letter read from lean's retrieval (the question and its choices): route (rag or
    closed_book), evidence score, gate, passage ids, flagged passages."""
    chain_of_thought: list[MemoryEntry]
    """The working memory: one entry per research iteration (the replanner reads it)."""
    fallbacks: Annotated[list[str], operator.add]
    """Where a node fell back because a model reply was unusable (such research is not cached)."""
    error: str | None
    decline: str
    """Why the planner declined an open question as off topic before any research ("" or absent:
    it did not)."""
    jurisdiction: str
    """The state (USPS code) whose law alone the research searches: the question asks what that
    state's law provides, and the sources hold some ("" or absent: every passage)."""
    stop_reason: str
    run_metrics: dict[str, Any]
    trace: Annotated[list[TraceEvent], operator.add]
