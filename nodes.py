"""The nine nodes of the research agent and their routers.

Every node takes ``(state, runtime)``; its dependencies (settings, LLM client, retriever, confidence,
embedder, QA memory) come from ``runtime.context`` (:class:`state.AgentContext`), filled lazily with
the real implementations by :func:`resolve_context`.  Each node appends one ``trace`` event
(node, what it decided, seconds) that the CLI streams.

Token budgets (the embedded 1.5B model writes ~15 tokens/s): see ``MAX_TOKENS``.  Structured
replies (injection verdict, classification, plan, rewrite, replan) use JSON-schema output.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from langgraph.runtime import Runtime
from pydantic import BaseModel, Field

import mc
import prompts
from state import AgentContext, AgentState, Execution, PlanStep

logger = logging.getLogger(__name__)

MAX_TOKENS = {
    "injection": 60,
    "classify": 20,
    "plan": 120,
    "rewrite": 110,
    "synthesize": 360,
    "replan": 130,
}

DUPLICATE_COSINE = 0.90
"""Two step questions whose embeddings are at least this similar are the same question
(all-MiniLM-L6-v2: paraphrases of one legal question score 0.85-0.97, different doctrines < 0.75)."""
ISSUE_MATCH_COSINE = 0.5
"""A replanned question at least this similar to an open planned issue researches that issue."""
CONFIDENCE_EPSILON = 0.02
"""A failed step whose confidence is not better than the previous step's by more than this added
nothing: stop (stagnation)."""
MC_EVIDENCE_PASSAGES = 6
LOW_CONFIDENCE_PREFIX = "Low confidence:"
NO_ANSWER = "No answer: the research found no passages for this question."


# ------------------------------------------------------------------------------------------------
# Structured outputs
# ------------------------------------------------------------------------------------------------


class InjectionVerdict(BaseModel):
    verdict: Literal["safe", "injection"]
    reason: str = Field(default="", max_length=80)


class Classification(BaseModel):
    query_type: Literal["simple", "multi_hop"]


class PlannedStep(BaseModel):
    issues: list[str] = Field(min_length=1, max_length=4)
    """The legal issues of the objective, most important first (listed before the question, so
    a small model names the doctrines before it writes the step)."""
    phase: str = Field(default="rule", max_length=40)
    question: str = Field(min_length=3, max_length=300)


class CitedClaim(BaseModel):
    text: str = Field(min_length=1, max_length=300)
    sources: list[int] = Field(min_length=1, max_length=3)


class CitedAnswer(BaseModel):
    """A step's answer: every claim names the passages (``[Source N]`` numbers) it comes from."""

    rule: CitedClaim
    elements: list[CitedClaim] = Field(min_length=1, max_length=6)
    exceptions: list[CitedClaim] = Field(max_length=3)
    application: CitedClaim


class Rewrite(BaseModel):
    primary: str = Field(min_length=2, max_length=400)
    alternatives: list[str] = Field(default_factory=list)


class Replan(BaseModel):
    action: Literal["next_step", "retry", "complete"]
    phase: str = Field(default="", max_length=40)
    question: str = Field(default="", max_length=300)


# ------------------------------------------------------------------------------------------------
# Context
# ------------------------------------------------------------------------------------------------


_default_context: AgentContext | None = None


def resolve_context(runtime: Any) -> AgentContext:
    """The run's context with every missing dependency filled by the real implementation.
    Without a context (LangGraph Studio), one process-wide default context is built lazily."""
    global _default_context
    ctx = getattr(runtime, "context", None)
    if ctx is None:
        if _default_context is None:
            _default_context = AgentContext()
        ctx = _default_context
    return fill_context(ctx)


def fill_context(ctx: AgentContext) -> AgentContext:
    if ctx.settings is None:
        from settings import get_settings

        ctx.settings = get_settings()
    s = ctx.settings
    if ctx.client is None:
        from llm_config import LLMClient

        ctx.client = LLMClient(s)
    if ctx.retrieve is None:

        def retrieve(queries: list[str], k: int, exclude_ids: Sequence[str]) -> list[dict]:
            import rag_utils

            return rag_utils.retrieve_documents_multi_query(
                queries, k=k, exclude_ids=exclude_ids, settings=s
            )

        ctx.retrieve = retrieve
    if ctx.confidence is None:

        def confidence(query: str, docs: list[dict]) -> float:
            import rag_utils

            return float(rag_utils.compute_confidence(query, docs, settings=s))

        ctx.confidence = confidence
    if ctx.embed is None:

        def embed(texts: list[str]) -> Any:
            import rag_utils

            return rag_utils.get_embedder(s).embed_documents(texts)

        ctx.embed = embed
    if ctx.check_memory is None:

        def check_memory(question: str) -> dict | None:
            import rag_utils

            return rag_utils.check_memory(question, settings=s)

        ctx.check_memory = check_memory
    if ctx.write_memory is None:

        def write_memory(
            question: str, answer: str, confidence: float, sources: Sequence[dict] = ()
        ) -> None:
            import rag_utils

            rag_utils.write_to_memory(question, answer, confidence, settings=s, sources=sources)

        ctx.write_memory = write_memory
    return ctx


def _traced(name: str) -> Callable:
    """Wrap a node ``fn(state, ctx) -> (update, decision)``: time it and append a trace event."""

    def wrap(fn: Callable[[AgentState, AgentContext], tuple[dict, str]]) -> Callable:
        def node(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
            ctx = resolve_context(runtime)
            start = time.perf_counter()
            update, decision = fn(state, ctx)
            seconds = round(time.perf_counter() - start, 3)
            logger.info("%s: %s (%.2fs)", name, decision, seconds)
            update = dict(update)
            update["trace"] = [{"node": name, "decision": decision, "seconds": seconds}]
            return update

        # Not functools.wraps: LangGraph reads the wrapper's signature to inject ``runtime``.
        node.__name__ = name
        node.__qualname__ = name
        node.__doc__ = fn.__doc__
        node.__module__ = fn.__module__
        node.step = fn  # the undecorated (state, ctx) -> (update, decision) function
        return node

    return wrap


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------

_INJECTION_PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(p, re.IGNORECASE)
    for name, p in {
        "override_instructions": r"\b(ignore|disregard|forget|override|bypass)\b[^.\n]{0,40}\b"
        r"(previous|prior|above|earlier|all|your|the|system|safety)\b[^.\n]{0,30}\b"
        r"(instructions?|prompts?|rules|directives|guidelines|restrictions|filters?)\b",
        "reveal_prompt": r"\b(reveal|print|show|repeat|output|display|leak|tell me)\b[^.\n]{0,40}\b"
        r"(system\s+prompt|your\s+(initial\s+|hidden\s+|original\s+)?(prompt|instructions)|"
        r"hidden\s+instructions|developer\s+message)",
        "jailbreak_persona": r"\b(DAN|do anything now|developer mode|jailbreak|jailbroken|god mode|"
        r"unfiltered mode|no longer bound)\b",
        "unrestricted_roleplay": r"\b(pretend|act|behave|role-?play)\b[^.\n]{0,40}\b"
        r"(no|without|free of)\s+(rules|restrictions|limits|filters|guidelines|ethics)",
        "fake_system_turn": r"(^|\n)\s*(system|assistant)\s*:|<\s*/?\s*(system|im_start|im_end)\b"
        r"|\[\s*/?\s*INST\s*\]",
        "new_instructions": r"\bnew\s+(instructions|directive|task)\s*:",
    }.items()
}


_CONTROL_CUES = re.compile(
    r"\b(you|your|assistant|ai|chatbot|bot|prompt|instructions?|ignore|disregard|forget|"
    r"override|pretend|role-?play|persona|act as|from now on|respond|reply|print|reveal|say|"
    r"write|jailbreak)\b",
    re.IGNORECASE,
)
"""Words an instruction aimed at the assistant needs. An LLM 'injection' verdict on text with
none of them is overruled: the small local model flags plain bar-exam fact patterns."""


def addresses_the_assistant(text: str) -> bool:
    """True when ``text`` holds words an instruction to the assistant would use."""
    return bool(_CONTROL_CUES.search(text))


def prescreen_injection(text: str) -> list[str]:
    """Names of the deterministic injection patterns ``text`` matches (empty = looks safe)."""
    return [name for name, pattern in _INJECTION_PATTERNS.items() if pattern.search(text)]


_CITATION_GROUP = re.compile(r"\[\s*Sources?\s*([0-9][0-9,;\s&and]*)\]", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_TRAILING_CITATION = re.compile(r"([.!?])\s*((?:\[Source \d+\])+)")
"""A citation written after the full stop: it belongs to the sentence before it."""


def normalize_citations(text: str, n_sources: int) -> tuple[str, dict[str, Any]]:
    """Rewrite ``[Source 1, 2]`` as ``[Source 1][Source 2]``, drop citations of sources the step
    was not given, and report {"cited", "invalid", "uncited_sentences", "has_citation"}."""
    cited: list[int] = []
    invalid: list[int] = []

    def repl(match: re.Match[str]) -> str:
        numbers = [int(n) for n in re.findall(r"\d+", match.group(1))]
        keep = []
        for n in numbers:
            if 1 <= n <= n_sources:
                keep.append(n)
                if n not in cited:
                    cited.append(n)
            else:
                invalid.append(n)
        return "".join(f"[Source {n}]" for n in keep)

    out = _CITATION_GROUP.sub(repl, text)
    uncited = 0
    for line in out.splitlines():
        body = re.sub(
            r"^\s*(\*\*)?(Rule|Elements?|Exceptions?|Application)(\*\*)?\s*:\s*", "", line
        )
        body = _TRAILING_CITATION.sub(r" \2\1", body.strip())
        for sentence in _SENTENCE.split(body):
            words = sentence.split()
            if len(words) < 4 or "not in the sources" in sentence.lower():
                continue
            if "[Source" not in sentence:
                uncited += 1
    return out.strip(), {
        "cited": cited,
        "invalid": invalid,
        "uncited_sentences": uncited,
        "has_citation": bool(cited),
    }


def scope_citations(text: str, step_id: int) -> str:
    """``[Source N]`` -> ``[Query X][Source N]`` for step X."""
    return re.sub(r"\[Source (\d+)\]", lambda m: f"[Query {step_id}][Source {m.group(1)}]", text)


_CHOICE_MENTION = re.compile(
    r"\b(answer\s+)?(choice|option)s?\s*\(?[A-D]?\)?|\(\s*[A-D]\s*\)|\bstep\s*\d+\b", re.IGNORECASE
)


def clean_question(text: str) -> str:
    """A step question without mentions of answer choices or step numbers."""
    text = _CHOICE_MENTION.sub("", text or "")
    return " ".join(text.split()).strip(" ,;:-")


def _cosines(ctx: AgentContext, text: str, others: list[str]) -> list[float]:
    if not others:
        return []
    try:
        rows = [list(map(float, r)) for r in ctx.embed([text, *others])]
    except Exception as exc:  # noqa: BLE001 - the duplicate check must never break a run
        logger.warning("embedding for the duplicate check failed: %s", exc)
        return []
    first = rows[0]
    return [sum(a * b for a, b in zip(first, r, strict=False)) for r in rows[1:]]


def _executed(state: AgentState) -> list[PlanStep]:
    return [s for s in state.get("planning_table") or [] if s.get("execution")]


def _completed(state: AgentState) -> list[PlanStep]:
    return [s for s in state.get("planning_table") or [] if s["status"] == "completed"]


def _next_step_id(state: AgentState) -> int:
    return max((s["step_id"] for s in state.get("planning_table") or []), default=0) + 1


def issue_question(issue: str) -> str:
    """The research question for a planned issue (used when the model's own question is
    unusable: a restatement of the objective or a repeat of an earlier step)."""
    return f"What are the rule and elements of {issue.strip().rstrip('?.')}?"


def _unfocused(ctx: AgentContext, question: str, issues: list[str], objective: str) -> bool:
    """True when ``question`` is closer (embedding cosine) to the whole objective than to every
    one of ``issues``: a restatement of the objective rather than research on one issue
    (all-MiniLM-L6-v2 on the multi_hop demo: a restated question 0.69 to the objective and at
    most 0.38 to an issue; a focused one 0.83 to its issue and 0.65 to the objective)."""
    sims = _cosines(ctx, question, [objective, *issues])
    return bool(sims) and max(sims[1:]) < sims[0]


def open_issues(state: AgentState) -> list[str]:
    """Planned issues no step has researched yet, in the planner's order."""
    done = set(state.get("researched_issues") or [])
    return [i for i in state.get("issues") or [] if i not in done]


def _short(text: str, n: int = 80) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


# ------------------------------------------------------------------------------------------------
# LLM helpers (also used by the eval scripts)
# ------------------------------------------------------------------------------------------------


def rewrite_queries(
    client: Any, question: str, settings: Any = None
) -> tuple[str, list[str], bool]:
    """(primary query, up to 2 alternatives, parse_failed) from ``skills/query_rewrite.md``.
    Falls back to the question itself when the reply cannot be parsed."""
    result = client.invoke(
        prompts.render("query_rewrite", question=question),
        role="rewrite",
        schema=Rewrite,
        max_tokens=MAX_TOKENS["rewrite"],
    )
    if result.parsed is None:
        return question, [], True
    primary = " ".join(result.parsed.primary.split()) or question
    alternatives: list[str] = []
    for alt in result.parsed.alternatives:
        alt = " ".join(str(alt).split())
        if (
            alt
            and alt.lower() != primary.lower()
            and alt.lower() not in map(str.lower, alternatives)
        ):
            alternatives.append(alt)
    return primary, alternatives[:2], False


def render_cited_answer(answer: CitedAnswer) -> str:
    """The Rule / Elements / Exceptions / Application text of a structured answer, every claim
    followed by its ``[Source N]`` citations."""

    def claim(c: CitedClaim) -> str:
        text = " ".join(c.text.split()).rstrip(" .;")
        refs = "".join(f"[Source {n}]" for n in dict.fromkeys(c.sources))
        return f"{text} {refs}." if refs else f"{text}."

    lines = [f"Rule: {claim(answer.rule)}"]
    if answer.elements:
        lines.append("Elements:")
        lines.extend(f"- {claim(e)}" for e in answer.elements)
    else:
        lines.append("Elements: not in the sources.")
    if answer.exceptions:
        lines.append("Exceptions:")
        lines.extend(f"- {claim(e)}" for e in answer.exceptions)
    else:
        lines.append("Exceptions: not in the sources.")
    lines.append(f"Application: {claim(answer.application)}")
    return "\n".join(lines)


_CLAIM_JSON = re.compile(
    r'"text"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"sources"\s*:\s*\[([\d,\s]*)\]', re.DOTALL
)


def salvage_claims(text: str) -> str:
    """Complete ``{"text": ..., "sources": [...]}`` claims of a reply whose JSON is unusable (cut
    off by the token budget, say), one cited line each; "" when there are none."""
    import json

    lines = []
    for m in _CLAIM_JSON.finditer(text or ""):
        try:
            claim_text = json.loads(f'"{m.group(1)}"')
        except ValueError:
            claim_text = m.group(1)
        numbers = [int(n) for n in re.findall(r"\d+", m.group(2))]
        refs = "".join(f"[Source {n}]" for n in dict.fromkeys(numbers))
        lines.append(f"- {' '.join(claim_text.split()).rstrip(' .;')} {refs}.".replace(" .", "."))
    return "\n".join(lines)


def synthesize(client: Any, question: str, docs: Sequence[dict]) -> tuple[str, dict[str, Any]]:
    """The step's cited answer from quoted passages, with its citations checked.

    The model fills :class:`CitedAnswer` (every claim carries the numbers of its passages; the
    server enforces the schema where it can) and the text is rendered from it, so even the
    embedded 1.5B model cites.  An unusable reply falls back to its complete claims, else to its
    text as written (its citations are still checked)."""
    result = client.invoke(
        prompts.render(
            "synthesize_and_cite", question=question, passages=prompts.quote_passages(docs)
        ),
        role="synthesize",
        schema=CitedAnswer,
        max_tokens=MAX_TOKENS["synthesize"],
    )
    if result.parsed is not None:
        text = render_cited_answer(result.parsed)
    else:
        text = salvage_claims(result.text) or result.text
    return normalize_citations(text, len(docs))


# ------------------------------------------------------------------------------------------------
# Nodes
# ------------------------------------------------------------------------------------------------


@_traced("detect_injection")
def detect_injection(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Regex pre-screen, then the LLM check (unless SKIP_INJECTION_CHECK).

    Policy: a pre-screen hit rejects at once (no LLM call: the patterns are specific to attacks on
    the assistant, never to legal subject matter).  When the LLM's verdict cannot be parsed or the
    call fails, the pre-screen verdict stands (safe here), and ``llm_verdict`` records why.  An LLM
    'injection' verdict rejects only input that addresses the assistant at all
    (:func:`addresses_the_assistant`); on a plain fact pattern it is overruled and recorded.
    """
    text = state.get("global_objective", "")
    hits = prescreen_injection(text)
    check: dict[str, Any] = {"prescreen": hits, "llm_verdict": None, "reason": ""}
    if hits:
        check.update(is_safe=False, verdict="injection", reason=f"pre-screen: {', '.join(hits)}")
    elif getattr(ctx.settings, "skip_injection_check", False):
        check.update(is_safe=True, verdict="safe", llm_verdict="skipped")
    else:
        from llm_config import LLMCallError

        try:
            result = ctx.client.invoke(
                prompts.render(
                    "detect_prompt_injection", user_input=prompts.quote("user_input", text)
                ),
                role="injection",
                schema=InjectionVerdict,
                max_tokens=MAX_TOKENS["injection"],
            )
            parsed = result.parsed
        except LLMCallError as exc:
            logger.warning(
                "injection check LLM call failed; keeping the pre-screen verdict: %s", exc
            )
            parsed = None
            check["llm_verdict"] = "error"
        if parsed is None:
            check["llm_verdict"] = check["llm_verdict"] or "unparsed"
            check.update(
                is_safe=True, verdict="safe", reason="LLM verdict unusable; pre-screen clean"
            )
        elif parsed.verdict == "injection" and not addresses_the_assistant(text):
            check.update(
                is_safe=True,
                verdict="safe",
                llm_verdict="injection",
                reason=f"LLM verdict overruled: no instruction to the assistant ({parsed.reason})",
            )
        else:
            check.update(
                is_safe=parsed.verdict == "safe",
                verdict=parsed.verdict,
                llm_verdict=parsed.verdict,
                reason=parsed.reason,
            )
    update: dict[str, Any] = {"injection_check": check}
    if not check["is_safe"]:
        update["final_cited_answer"] = (
            "Request rejected: it looks like an attempt to change the assistant's instructions "
            f"({check['reason']}). Ask a legal research question instead."
        )
        update["stop_reason"] = "injection"
    return update, f"{check['verdict']} ({check['reason'] or check['llm_verdict']})"


@_traced("classifier")
def classifier(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    question = state["question"]
    result = ctx.client.invoke(
        prompts.render("classify_and_route", question=question),
        role="classify",
        schema=Classification,
        max_tokens=MAX_TOKENS["classify"],
    )
    if result.parsed is not None:
        return {"query_type": result.parsed.query_type}, result.parsed.query_type
    fallback = "multi_hop" if state.get("choices") or len(question.split()) > 60 else "simple"
    return {"query_type": fallback}, f"{fallback} (fallback: unparseable reply)"


@_traced("planner")
def planner(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """QA memory first (a hit ends the research); else the first step.  The planner sees the
    question without its answer choices."""
    question = state["question"]
    hit = None
    try:
        hit = ctx.check_memory(question)
    except Exception as exc:  # noqa: BLE001 - a broken memory must not stop the research
        logger.warning("QA memory lookup failed: %s", exc)
    if hit:
        answer = hit.get("answer", "")
        return (
            {
                "memory_hit": True,
                "final_cited_answer": answer,
                "research_answer": answer,
                "sources": list(hit.get("sources") or []),
                "stop_reason": "memory_hit",
            },
            f"memory hit (similarity {hit.get('similarity', 0):.3f})",
        )
    result = ctx.client.invoke(
        prompts.render("plan_synthesis", objective=question),
        role="plan",
        schema=PlannedStep,
        max_tokens=MAX_TOKENS["plan"],
    )
    plan = result.parsed
    step_q = clean_question(plan.question) if plan else ""
    phase = (plan.phase if plan else "") or "rule"
    issues = [" ".join(i.split()) for i in (plan.issues if plan else []) if i.strip()]
    note = ""
    # A multi-issue objective restated as one question retrieves nothing focused: research the
    # first planned issue instead.
    if (
        issues
        and state.get("query_type") == "multi_hop"
        and (len(step_q) < 10 or _unfocused(ctx, step_q, issues[:1], question))
    ):
        step_q, phase, note = issue_question(issues[0]), "rule", " (agenda: first issue)"
    if len(step_q) < 10:
        step_q, phase = question, "rule"
    step: PlanStep = {
        "step_id": 1,
        "status": "pending",
        "phase": phase,
        "question": step_q,
        "execution": None,
    }
    update = {
        "memory_hit": False,
        "planning_table": [step],
        "issues": issues,
        "researched_issues": issues[:1],
    }
    return update, f"step 1: {_short(step_q)}{note}" + (
        f" (issues: {'; '.join(issues)})" if issues else ""
    )


@_traced("executor")
def executor(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Run ONE pending step: rewrite -> multi-query retrieval (excluding passages earlier steps
    retrieved) -> cited synthesis -> confidence."""
    pending = [
        s
        for s in state.get("planning_table") or []
        if s["status"] == "pending" and not s["execution"]
    ]
    if not pending:
        return {}, "nothing pending"
    step = dict(pending[0])
    s = ctx.settings
    primary, alternatives, _ = rewrite_queries(ctx.client, step["question"], s)
    seen = [i for p in _executed(state) for i in p["execution"].get("retrieved_doc_ids", [])]
    docs = ctx.retrieve([primary, *alternatives], getattr(s, "retrieval_k", 5), seen)
    used = set(seen)
    docs = [d for d in docs if d["id"] not in used]  # belt and braces: never reuse a passage
    if docs:
        answer, citations = synthesize(ctx.client, step["question"], docs)
        confidence = float(ctx.confidence(step["question"], docs))
    else:
        answer, citations, confidence = NO_ANSWER, normalize_citations("", 0)[1], 0.0
    execution: Execution = {
        "optimized_query": primary,
        "alternatives": alternatives,
        "retrieved_doc_ids": [d["id"] for d in docs],
        "cited_answer": answer,
        "confidence": round(confidence, 4),
        "rerank_top_score": docs[0].get("rerank_score") if docs else None,
        "citations": citations,
    }
    step["execution"] = execution
    passages = state.get("passages") or {}
    passages = {**passages, **{d["id"]: _passage_record(d) for d in docs}}
    return (
        {
            "planning_table": [step],
            "iteration_count": state.get("iteration_count", 0) + 1,
            "passages": passages,
        },
        f"step {step['step_id']}: {len(docs)} passages, confidence {confidence:.3f}, "
        f"{len(citations['cited'])} cited, {len(citations['invalid'])} invalid citations",
    )


def _passage_record(doc: dict) -> dict:
    return {
        "id": doc["id"],
        "title": doc.get("title") or "",
        "source": doc.get("source") or (doc.get("metadata") or {}).get("source", ""),
        "text": doc.get("text") or "",
    }


def aggregate(state: AgentState, threshold: float) -> tuple[str, list[dict]]:
    """The final answer from completed steps with [Query X][Source N] citations, and its sources.
    With no completed step, the executed steps' answers under a low-confidence warning."""
    passages = state.get("passages") or {}
    completed = _completed(state)
    steps = completed or [s for s in _executed(state) if s["execution"].get("retrieved_doc_ids")]
    if not steps:
        return "", []
    parts = []
    sources = []
    for step in steps:
        ex = step["execution"]
        x = step["step_id"]
        parts.append(f"**Query {x}: {step['question']}**\n{scope_citations(ex['cited_answer'], x)}")
        for n, doc_id in enumerate(ex.get("retrieved_doc_ids", []), 1):
            rec = dict(
                passages.get(doc_id) or {"id": doc_id, "title": "", "source": "", "text": ""}
            )
            rec.update(step_id=x, ref=f"[Query {x}][Source {n}]")
            sources.append(rec)
    answer = "\n\n".join(parts)
    if not completed:
        best = max(s["execution"].get("confidence", 0.0) for s in steps)
        answer = (
            f"{LOW_CONFIDENCE_PREFIX} the passages found may not answer this question (best "
            f"confidence {best:.2f} < threshold {threshold:.2f}).\n\n{answer}"
        )
    return answer, sources


def stagnation(state: AgentState, ctx: AgentContext) -> str | None:
    """Why the research stopped making progress, or None.  Looks at the latest executed step:
    no new passages; failed without improving confidence by > CONFIDENCE_EPSILON over the previous
    step; or a near-duplicate (embedding cosine >= DUPLICATE_COSINE) of an earlier step's question."""
    executed = _executed(state)
    if len(executed) < 2:
        return None
    last, prev = executed[-1], executed[-2]
    if not last["execution"].get("retrieved_doc_ids"):
        return "the last step retrieved no new passages"
    conf, prev_conf = last["execution"]["confidence"], prev["execution"]["confidence"]
    if last["status"] == "failed" and conf <= prev_conf + CONFIDENCE_EPSILON:
        return f"confidence did not improve ({prev_conf:.3f} -> {conf:.3f})"
    sims = _cosines(ctx, last["question"], [s["question"] for s in executed[:-1]])
    if sims and max(sims) >= DUPLICATE_COSINE:
        return f"the last step repeats an earlier question (cosine {max(sims):.2f})"
    return None


@_traced("evaluator")
def evaluator(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Grade executed steps against EVAL_CONFIDENCE_THRESHOLD, summarise them into the context,
    aggregate the answer, and decide the route (stored as ``route``)."""
    s = ctx.settings
    threshold = float(getattr(s, "eval_confidence_threshold", 0.35))
    graded: list[PlanStep] = []
    summaries: list[str] = []
    for step in state.get("planning_table") or []:
        if step["status"] == "pending" and step["execution"]:
            ex = step["execution"]
            status = "completed" if ex["confidence"] >= threshold else "failed"
            graded.append({**step, "status": status})
            summaries.append(
                f"Step {step['step_id']} ({step['phase']}, {status}, confidence "
                f"{ex['confidence']:.2f}): {step['question']} -> {_short(ex['cited_answer'], 300)}"
            )
    view: AgentState = {**state, "planning_table": _merge(state, graded)}
    answer, sources = aggregate(view, threshold)
    table = view["planning_table"]
    n_completed = sum(1 for p in table if p["status"] == "completed")
    iterations = state.get("iteration_count", 0)
    max_steps = int(getattr(s, "max_steps", 3))
    max_iter = int(getattr(s, "max_iterations", 6))
    pending = [p for p in table if p["status"] == "pending" and not p["execution"]]
    stop = None
    if pending and iterations < max_iter:
        route = "executor"
    elif state.get("query_type") != "multi_hop":
        route = "mc_select"
    elif n_completed >= max_steps:
        route, stop = "mc_select", f"{n_completed} steps completed"
    elif iterations >= max_iter:
        route, stop = "mc_select", f"iteration limit {max_iter} reached"
    elif stag := stagnation(view, ctx):
        route, stop = "mc_select", f"stagnation: {stag}"
    else:
        route = "replanner"
    update: dict[str, Any] = {
        "planning_table": graded,
        "accumulated_context": summaries,
        "final_cited_answer": answer,
        "research_answer": answer,
        "sources": sources,
        "route": route,
    }
    if stop:
        update["stop_reason"] = stop
    grades = ", ".join(f"step {g['step_id']} {g['status']}" for g in graded) or "no new step"
    return update, f"{grades} -> {route}" + (f" ({stop})" if stop else "")


def _merge(state: AgentState, changed: list[PlanStep]) -> list[PlanStep]:
    from state import merge_steps

    return merge_steps(state.get("planning_table"), changed)


@_traced("replanner")
def replanner(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """next_step | retry | complete.  On LLM failure or an unusable reply: complete with the
    evidence so far.  A question that is unusable, repeats an earlier step or restates the
    objective is replaced by the next open planned issue; with none left, the research completes."""
    from llm_config import LLMCallError

    table = state.get("planning_table") or []
    asked = "\n".join(f"- {p['question']}" for p in table)
    findings = "\n".join(state.get("accumulated_context") or []) or "(nothing yet)"
    issues = "; ".join(state.get("issues") or []) or "(not listed)"
    progress = (
        f"Legal issues identified when planning: {issues}\n\n"
        f"Questions already researched (never ask them again):\n{asked}\n\nFindings:\n{findings}"
    )
    try:
        result = ctx.client.invoke(
            prompts.render("adaptive_replan", objective=state["question"], progress=progress),
            role="replan",
            schema=Replan,
            max_tokens=MAX_TOKENS["replan"],
        )
    except LLMCallError as exc:
        logger.warning("replanner LLM call failed; completing with the evidence so far: %s", exc)
        return {"stop_reason": "replanner failed (LLM error)"}, "complete (LLM error)"
    plan = result.parsed
    if plan is None:
        return {
            "stop_reason": "replanner failed (unparseable reply)"
        }, "complete (unparseable reply)"
    if plan.action == "complete":
        return {"stop_reason": "replanner: complete"}, "complete (complete)"
    question = clean_question(plan.question)
    agenda = open_issues(state)
    earlier = [p["question"] for p in table]
    # One embedding pass: the question against earlier steps, the objective and the open issues.
    sims = (
        _cosines(ctx, question, [*earlier, state["question"], *agenda])
        if len(question) >= 10
        else []
    )
    n = len(earlier)
    to_earlier, to_agenda = sims[:n], sims[n + 1 :]
    to_objective = sims[n] if sims else 0.0
    problem = None
    if len(question) < 10:
        problem = "no usable question"
    elif to_earlier and max(to_earlier) >= DUPLICATE_COSINE:
        problem = f"the question repeats an earlier one (cosine {max(to_earlier):.2f})"
    elif to_agenda and max(to_agenda) < to_objective:
        problem = "the question is closer to the objective than to any open issue"
    last = table[-1] if table else None
    action = plan.action
    if action == "retry" and last is not None and last["status"] == "completed":
        action = "next_step"  # only a failed step is retried
    phase = plan.phase or (last["phase"] if action == "retry" and last else "research")
    issue = None
    if problem is not None:
        if not agenda:
            stop = (
                "replanner: no usable question"
                if len(question) < 10
                else f"stagnation: replanned question {problem.removeprefix('the question ')}"
            )
            return {"stop_reason": stop}, f"complete ({problem})"
        issue = agenda[0]
        question, action, phase = issue_question(issue), "next_step", "rule"
    elif to_agenda and max(to_agenda) >= ISSUE_MATCH_COSINE:
        issue = agenda[to_agenda.index(max(to_agenda))]
    step: PlanStep = {
        "step_id": _next_step_id(state),
        "status": "pending",
        "phase": phase,
        "question": question,
        "execution": None,
    }
    update: dict[str, Any] = {"planning_table": [step]}
    if issue is not None:
        update["researched_issues"] = [*(state.get("researched_issues") or []), issue]
    decision = f"{action}: step {step['step_id']}: {_short(question)}"
    if problem is not None:
        decision += f" (agenda: {problem})"
    return update, decision


def mc_evidence(state: AgentState, limit: int = MC_EVIDENCE_PASSAGES) -> str:
    """Passages for the MC prompt: the first passages of each answering step, round-robin."""
    by_step: dict[int, list[dict]] = {}
    for src in state.get("sources") or []:
        by_step.setdefault(src.get("step_id", 0), []).append(src)
    picked: list[dict] = []
    while len(picked) < limit and any(by_step.values()):
        for key in list(by_step):
            if by_step[key] and len(picked) < limit:
                picked.append(by_step[key].pop(0))
    parts = []
    for i, doc in enumerate(picked, 1):
        text = " ".join(doc.get("text", "").split())[:700]
        parts.append(f"[{i}] {doc.get('title', '')}\n{text}".strip())
    return "\n\n".join(parts)


@_traced("mc_select")
def mc_select(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    choices = state.get("choices") or {}
    if not choices:
        return {}, "no choices: pass through"
    result = mc.select_answer(ctx.client, state["question"], choices, mc_evidence(state) or None)
    research = state.get("research_answer") or state.get("final_cited_answer") or ""
    if result.letter:
        line = f"**Answer: ({result.letter})** {choices.get(result.letter, '')}"
    else:
        line = "**Answer: none** (no letter could be parsed from the model's reply)"
    final = f"{research}\n\n{line}".strip()
    decision = f"({result.letter}) via {result.strategy}" + (
        " after strict retry" if result.retried else ""
    )
    return {"mc_answer": result.to_dict(), "final_cited_answer": final}, decision


def _mean_completed_confidence(state: AgentState) -> float:
    confs = [s["execution"]["confidence"] for s in _completed(state)]
    return sum(confs) / len(confs) if confs else 0.0


@_traced("memory_writeback")
def memory_writeback(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Cache the research (never the MC selection) when it is trustworthy and new."""
    threshold = float(getattr(ctx.settings, "eval_confidence_threshold", 0.35))
    research = state.get("research_answer") or ""
    confidence = _mean_completed_confidence(state)
    if state.get("memory_hit"):
        return {}, "skip: answer came from memory"
    if not research or research.startswith((LOW_CONFIDENCE_PREFIX, NO_ANSWER)):
        return {}, "skip: no confident answer"
    if confidence < threshold:
        return {}, f"skip: confidence {confidence:.3f} < {threshold:.2f}"
    try:
        ctx.write_memory(state["question"], research, confidence, state.get("sources") or [])
    except Exception as exc:  # noqa: BLE001 - caching is best effort
        logger.warning("QA memory write failed: %s", exc)
        return {}, f"skip: write failed ({exc})"
    return {}, f"stored (confidence {confidence:.3f})"


def llm_usage(client: Any, offset: int = 0) -> dict[str, Any]:
    """Calls, tokens, characters, parse failures and latency of this run's LLM calls."""
    records = list(getattr(client, "records", []) or [])[offset:]
    by_role: dict[str, dict[str, Any]] = {}
    for r in records:
        role = by_role.setdefault(r.role, {"calls": 0, "latency_s": 0.0, "parse_failures": 0})
        role["calls"] += 1
        role["latency_s"] = round(role["latency_s"] + r.latency_s, 3)
        role["parse_failures"] += int(bool(r.parse_failed))
    return {
        "llm_calls": len(records),
        "llm_errors": sum(1 for r in records if r.error),
        "parse_failures": sum(1 for r in records if r.parse_failed),
        "in_chars": sum(r.in_chars for r in records),
        "out_chars": sum(r.out_chars for r in records),
        "input_tokens": sum(r.input_tokens or 0 for r in records),
        "output_tokens": sum(r.output_tokens or 0 for r in records),
        "llm_latency_s": round(sum(r.latency_s for r in records), 3),
        "llm_by_role": by_role,
    }


def _has_answer(state: AgentState) -> bool:
    if (state.get("injection_check") or {}).get("is_safe") is False:
        return False
    research = state.get("research_answer") or ""
    return bool(research) and not research.startswith(NO_ANSWER)


def compute_metrics(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    table = state.get("planning_table") or []
    per_node: dict[str, float] = {}
    for ev in state.get("trace") or []:
        per_node[ev["node"]] = round(per_node.get(ev["node"], 0.0) + ev["seconds"], 3)
    citations = [s["execution"].get("citations") or {} for s in table if s.get("execution")]
    mc_answer = state.get("mc_answer") or {}
    return {
        **llm_usage(ctx.client, ctx.record_offset),
        "node_latency_s": per_node,
        "total_node_s": round(sum(per_node.values()), 3),
        "iterations": state.get("iteration_count", 0),
        "steps_completed": sum(1 for s in table if s["status"] == "completed"),
        "steps_failed": sum(1 for s in table if s["status"] == "failed"),
        "query_type": state.get("query_type"),
        "memory_hit": bool(state.get("memory_hit")),
        "has_answer": _has_answer(state),
        "injection_verdict": (state.get("injection_check") or {}).get("verdict"),
        "stop_reason": state.get("stop_reason"),
        "invalid_citations": sum(len(c.get("invalid", [])) for c in citations),
        "uncited_sentences": sum(c.get("uncited_sentences", 0) for c in citations),
        "steps_without_citation": sum(1 for c in citations if not c.get("has_citation")),
        "mc_letter": mc_answer.get("letter"),
        "mc_parse_failed": bool(mc_answer.get("parse_failed")) if mc_answer else None,
    }


@_traced("observability")
def observability(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    metrics = compute_metrics(state, ctx)
    logger.info("run metrics: %s", metrics)
    return (
        {"run_metrics": metrics},
        f"{metrics['llm_calls']} LLM calls, {metrics['steps_completed']} completed / "
        f"{metrics['steps_failed']} failed steps",
    )


# ------------------------------------------------------------------------------------------------
# Routers
# ------------------------------------------------------------------------------------------------


def route_after_injection(state: AgentState) -> Literal["classifier", "observability"]:
    return "classifier" if (state.get("injection_check") or {}).get("is_safe") else "observability"


def route_after_planner(state: AgentState) -> Literal["executor", "memory_writeback"]:
    return "memory_writeback" if state.get("memory_hit") else "executor"


def route_after_evaluator(state: AgentState) -> Literal["executor", "replanner", "mc_select"]:
    route = state.get("route")
    return route if route in ("executor", "replanner", "mc_select") else "mc_select"


def route_after_replanner(state: AgentState) -> Literal["executor", "mc_select"]:
    pending = [
        s
        for s in state.get("planning_table") or []
        if s["status"] == "pending" and not s["execution"]
    ]
    return "executor" if pending else "mc_select"
