"""The nine nodes of the research agent and their routers.

Every node takes ``(state, runtime)`` and reads its dependencies (settings, LLM client, retriever,
confidence, embedder, QA memory, deadline) from ``runtime.context`` (:class:`context.AgentContext`;
LangGraph Studio runs without one get :func:`context.default_context`).  Each node appends one
``trace`` event (node, what it decided, seconds) that the CLI streams.  Every LLM call goes through
``prompts.call`` and the call table ``prompts.CALLS`` (skill, schema and token budget per role).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command

import mc
import prompts
from context import AgentContext, default_context
from llm_config import LLMCallError
from prompts import CitedAnswer, CitedClaim
from state import AgentState, Execution, PlanStep, merge_steps

logger = logging.getLogger(__name__)

DUPLICATE_COSINE = 0.90
"""Two step questions whose embeddings are at least this similar are the same question
(all-MiniLM-L6-v2: paraphrases of one legal question score 0.85-0.97, different doctrines < 0.75)."""
ISSUE_MATCH_COSINE = 0.5
"""A replanned question at least this similar to an open planned issue researches that issue."""
CONFIDENCE_EPSILON = 0.02
"""A failed step whose confidence is not better than the previous step's by more than this added
nothing: stop (stagnation)."""
MC_RESERVE_S = 30.0
"""Seconds of the run deadline kept for the multiple-choice call: research stops this early."""
LOW_CONFIDENCE_PREFIX = "Low confidence:"
NO_ANSWER = "No answer: the research found no passages for this question."
NO_PARSED_ANSWER = "No answer: the model's replies for this step could not be parsed."
NOT_FOUND = "No answer: the sources hold nothing that answers this question."
OFF_TOPIC = "off topic"
"""How a stop_reason starts when the question as asked is below LEAN_GATE (see evaluate)."""


# ------------------------------------------------------------------------------------------------
# Tracing
# ------------------------------------------------------------------------------------------------

StepResult = tuple[dict, str] | tuple[dict, str, str]
"""A node body's result: (state update, decision) or (state update, decision, next node)."""


def _traced(name: str) -> Callable:
    """Wrap a node body ``fn(state, ctx) -> (update, decision[, goto])``: time it, append a trace
    event, and route with ``Command(goto=...)`` when the body names the next node."""

    def wrap(fn: Callable[[AgentState, AgentContext], StepResult]) -> Callable:
        def node(state: AgentState, runtime: Runtime[AgentContext]) -> dict | Command:
            # A LangGraph server run brings an empty context ({}): use the default one.
            ctx = (
                runtime.context if isinstance(runtime.context, AgentContext) else default_context()
            )
            start = time.perf_counter()
            update, decision, *goto = fn(state, ctx)
            seconds = round(time.perf_counter() - start, 3)
            logger.info("%s: %s (%.2fs)", name, decision, seconds)
            update = dict(update)
            update["trace"] = [{"node": name, "decision": decision, "seconds": seconds}]
            return Command(update=update, goto=goto[0]) if goto else update

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


_STEP_MENTION = re.compile(
    r"\(\s*(see\s+)?step\s*\d+\s*\)|\b(as\s+in|in|from|see|per)\s+step\s*\d+\s*,?|\bstep\s*\d+\b",
    re.IGNORECASE,
)
_CHOICE = r"(?:(?:answer\s+)?(?:choice|option)s?\s*\(?\s*[A-D]\s*\)?(?![A-Za-z])|\(\s*[A-D]\s*\))"
_CHOICE_PAIR = re.compile(rf"{_CHOICE}\s*(,|and|or)\s*{_CHOICE}", re.IGNORECASE)
_CHOICE_MENTION = re.compile(_CHOICE, re.IGNORECASE)


def clean_question(text: str) -> str:
    """A step question without mentions of answer choices or step numbers: step references are
    dropped, a choice becomes "it" and a pair of choices "them", so the question stays English."""
    text = _STEP_MENTION.sub(" ", text or "")
    text = _CHOICE_PAIR.sub("them", text)
    text = _CHOICE_MENTION.sub("it", text)
    text = re.sub(r"\s+([,;:?.!])", r"\1", " ".join(text.split())).strip(" ,;:-")
    return text[:1].upper() + text[1:]


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


def issue_queries(question: str, issue: str) -> tuple[str, list[str]]:
    """(primary, alternatives) for a step written from the agenda: the step's question ranks the
    passages and the issue's names (the label and its linked doctrine names in parentheses) widen
    the pool; no rewrite call.  On the multi_hop demo the model rewrote "What are the rule and
    elements of First Amendment (Freedom of speech; ...)?" as "First Amendment", which ranked the
    state action passage above free speech at public universities."""
    head, _, rest = issue.partition("(")
    names = [" ".join(n.split()) for n in [head, *rest.rstrip(") ").split(";")]]
    return question, list(dict.fromkeys(n for n in names if n))[:3]


def _unfocused(ctx: AgentContext, question: str, issues: list[str], objective: str) -> bool:
    """True when ``question`` is closer (embedding cosine) to the whole objective than to every
    one of ``issues``: a restatement of the objective rather than research on one issue
    (all-MiniLM-L6-v2 on the multi_hop demo: a restated question 0.69 to the objective and at
    most 0.38 to an issue; a focused one 0.83 to its issue and 0.65 to the objective)."""
    sims = _cosines(ctx, question, [objective, *issues])
    return bool(sims) and max(sims[1:]) < sims[0]


def issues_named(question: str, issues: Sequence[str]) -> list[str]:
    """The ``issues`` whose names ``question`` spells out (every content word of the name, the part
    before any parenthesis), an issue contained in another named one counted once.  On the
    multi_hop demo the embedded model planned "What must the university show to demonstrate that
    it violated the First Amendment, the Right to Free Speech, the Right to Public Speech, and the
    Right to Free Expression?": four issues in one step, which retrieves nothing focused."""
    words = mc.content_words(question)
    named: list[tuple[str, set[str]]] = []
    for issue in issues:
        name = mc.content_words(issue.split("(")[0])
        if name and name <= words and all(name != n for _, n in named):
            named.append((issue, name))
    return [i for i, n in named if not any(n < other for _, other in named)]


NOT_RESEARCHED = "Not researched"
"""Heads the final answer's line naming the planned issues the research stopped before."""


def open_issues(state: AgentState) -> list[str]:
    """Planned issues no step has researched yet, in the planner's order."""
    done = set(state.get("researched_issues") or [])
    return [i for i in state.get("issues") or [] if i not in done]


def unresearched_issues(state: AgentState) -> list[str]:
    """Planned issues no executed step addressed: none was counted against it (``addresses``) and
    none asked a question containing its words (a step the model wrote itself may research "due
    process" without being matched to it).  An issue whose step was planned but never ran (the
    run stopped first) is among them."""
    executed = _executed(state)
    addressed = {s.get("addresses") for s in executed}
    asked = [set(_norm_words(s["question"]).split()) for s in executed]
    return [
        issue
        for issue in state.get("issues") or []
        if issue not in addressed
        and not any(set(_norm_words(issue).split()) <= words for words in asked)
    ]


def not_researched_note(state: AgentState, why: str) -> str:
    """``"\n\nNot researched (<why>): issue; issue."`` for the :func:`unresearched_issues` of a
    research that stopped early, or ``""`` when every planned issue was reached."""
    left_open = unresearched_issues(state)
    return f"\n\n{NOT_RESEARCHED} ({why}): {'; '.join(left_open)}." if left_open else ""


def _short(text: str, n: int = 80) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


# ------------------------------------------------------------------------------------------------
# LLM helpers (also used by the eval scripts)
# ------------------------------------------------------------------------------------------------


def rewrite_queries(client: Any, question: str) -> tuple[str, list[str], bool]:
    """(primary query, up to 2 alternatives, parse_failed) from ``skills/query_rewrite.md``.
    Falls back to the question itself when the reply cannot be parsed."""
    result = prompts.call(client, "rewrite", question=question)
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


_UNSAFE_CLAIM = re.compile(
    r"\b(correct|right|best)\s+(answer|choice|option)\b[^.]{0,30}\(?\b[A-D]\b\)?"
    r"|\b(answer|choose|select|pick)\s+\(?[A-D]\)?(?![A-Za-z])"
    r"|\bignore\b[^.]{0,40}\binstructions?\b|\bsystem\s+prompt\b"
    r"|\bnote\s+to\s+the\s+(ai|assistant)\b|\b(ai\s+assistant|language\s+model)\b",
    re.IGNORECASE,
)
"""Text no research claim may carry: an answer letter, or an instruction aimed at the assistant
(what a planted passage would try to get repeated)."""


def safe_claims(claims: list[CitedClaim]) -> list[CitedClaim]:
    """``claims`` without those that repeat answer-letter or imperative text (see _UNSAFE_CLAIM)."""
    kept = [c for c in claims if not _UNSAFE_CLAIM.search(c.text)]
    if len(kept) < len(claims):
        logger.warning(
            "dropped %d claim(s) carrying answer-letter or instruction text",
            len(claims) - len(kept),
        )
    return kept


_NEGATION = re.compile(r"\b(not|no|never|without|cannot|nor)\b|n't\b", re.IGNORECASE)


def _claim_words(text: str) -> frozenset[str]:
    """Content words of a claim; a negation counts, so "X is required" and "X is not required"
    are never merged."""
    words = set(mc.content_words(text))
    if _NEGATION.search(text):
        words.add("<not>")
    return frozenset(words)


def echoes_instructions(question: str, objective: str, instructions: str) -> bool:
    """True when a planned ``question`` restates the prompt's ``instructions`` instead of the
    ``objective``: none of its content words is in the objective and at least half are in the
    instructions (given "asdf qwerty zxcv", the small model planned "What are the legal issues
    raised by the objective? Please provide the legal doctrines in two to five words...")."""
    words = set(mc.content_words(question))
    if not words or words & set(mc.content_words(objective)):
        return False
    return len(words & set(mc.content_words(instructions))) >= len(words) / 2


def merge_duplicate_claims(
    claims: list[CitedClaim], seen: list[frozenset[str]] | None = None
) -> list[CitedClaim]:
    """``claims`` with identical or near-identical ones merged into the first (their sources
    united); a claim that repeats one of ``seen`` (claims rendered earlier) is dropped."""
    seen = seen if seen is not None else []
    kept: list[CitedClaim] = []
    kept_words: list[frozenset[str]] = []
    for c in claims:
        words = _claim_words(c.text)
        if not words:
            continue
        twin = next((i for i, w in enumerate(kept_words) if mc.near_duplicate(w, words)), None)
        if twin is not None:
            kept[twin].sources = list(dict.fromkeys([*kept[twin].sources, *c.sources]))
        elif not any(mc.near_duplicate(w, words) for w in seen):
            kept.append(c.model_copy())
            kept_words.append(words)
    seen.extend(kept_words)
    return kept


_ABSENT = prompts.ABSENT_CLAIM


def _safe_or_absent(claim: CitedClaim) -> CitedClaim:
    """``claim``, or "not in the sources" (uncited) when it carries answer-letter or instruction
    text; the model's parsed reply is never modified."""
    return _ABSENT if _UNSAFE_CLAIM.search(claim.text) else claim


def restates_question(claim: CitedClaim, question: set[str], passages: Sequence[set[str]]) -> bool:
    """True when ``claim`` only restates the step's question: every content word of it is in
    ``question`` (content words), and some word is in none of the passages it cites (``passages``:
    content words of each passage, ``[Source N]`` is ``passages[N-1]``).  On the multi_hop demo the
    embedded model answered "What must the university show to demonstrate that it violated the
    First Amendment, ..." with the rule "The university must show that it violated the First
    Amendment, ..." and one such bullet per right, cited to passages that say nothing of it."""
    words = mc.content_words(claim.text)
    if len(words) < 2 or not words <= question:
        return False
    cited = set().union(*(passages[n - 1] for n in claim.sources if 1 <= n <= len(passages)))
    return not words <= cited


def drop_restatements(
    answer: CitedAnswer, question: str, docs: Sequence[dict]
) -> tuple[CitedAnswer, int]:
    """``answer`` without the claims that restate ``question`` (see :func:`restates_question`):
    a restated rule or application reads "not in the sources", restated elements and exceptions
    are left out; and how many claims went."""
    asked = mc.content_words(question)
    passages = [mc.content_words(f"{d.get('title') or ''} {d.get('text') or ''}") for d in docs]

    def restated(c: CitedClaim) -> bool:
        return restates_question(c, asked, passages)

    rule, application = restated(answer.rule), restated(answer.application)
    kept = {
        "rule": _ABSENT if rule else answer.rule,
        "elements": [c for c in answer.elements if not restated(c)],
        "exceptions": [c for c in answer.exceptions if not restated(c)],
        "application": _ABSENT if application else answer.application,
    }
    dropped = (
        rule + application
        + len(answer.elements) - len(kept["elements"])
        + len(answer.exceptions) - len(kept["exceptions"])
    )  # fmt: skip
    return (answer.model_copy(update=kept) if dropped else answer), dropped


def _norm_words(text: str) -> str:
    """``text`` as lower-case words joined by single spaces, punctuation dropped (for comparing
    questions, and for finding a claim inside another)."""
    return " ".join(re.findall(r"[a-z0-9]+", (text or "").lower()))


RULE_CLAUSES_SHARE = 0.6
"""Elements that are verbatim pieces of the rule and together hold at least this share of its
content words are the rule cut into clauses, not elements (see render_cited_answer)."""


def render_cited_answer(answer: CitedAnswer) -> str:
    """The Rule / Elements / Exceptions / Application text of a structured answer, every claim
    followed by its ``[Source N]`` citations; claims that repeat an answer letter or an
    instruction (text a planted passage would push) are left out, a claim that repeats an
    earlier one is merged into it or (the application) points back to it, and elements that are
    clauses of the rule's own sentence are not printed again."""
    rendered = [_claim_words(answer.rule.text)]
    rule_words = _norm_words(answer.rule.text) if answer.rule != _ABSENT else ""
    # The rule's own sentence cut into clauses is not a list of elements (the Free Exercise step
    # once printed its rule, then the rule again as four clauses: "such as a general drug or
    # fire-safety law"); short element names taken from the rule ("reasonable suspicion") stay.
    pieces = [e for e in answer.elements if (w := _norm_words(e.text)) and w in rule_words]
    covered = set().union(*(mc.content_words(e.text) for e in pieces))
    in_rule = bool(pieces) and len(covered) >= RULE_CLAUSES_SHARE * len(rendered[0])
    elements = [e for e in answer.elements if not (in_rule and e in pieces)]
    answer = answer.model_copy(
        update={
            "rule": _safe_or_absent(answer.rule),
            "elements": merge_duplicate_claims(safe_claims(elements), rendered),
            "exceptions": merge_duplicate_claims(safe_claims(list(answer.exceptions)), rendered),
            "application": _safe_or_absent(answer.application),
        }
    )

    def claim(c: CitedClaim) -> str:
        text = " ".join(c.text.split())
        if len(c.text) >= prompts.CLAIM_MAX_CHARS:  # cut at the schema's limit, maybe mid-word
            text = text.rsplit(" ", 1)[0].rstrip(" ,;:") + "…"
        text = text.rstrip(" .;")
        refs = "".join(f"[Source {n}]" for n in dict.fromkeys(c.sources))
        return f"{text} {refs}." if refs else f"{text}."

    lines = [f"Rule: {claim(answer.rule)}"]
    if answer.elements:
        lines.append("Elements:")
        lines.extend(f"- {claim(e)}" for e in answer.elements)
    elif in_rule and answer.rule != _ABSENT:
        refs = "".join(f"[Source {n}]" for n in dict.fromkeys(answer.rule.sources))
        lines.append(f"Elements: as stated in the rule above {refs}.".replace(" .", "."))
    else:
        lines.append("Elements: not in the sources.")
    if answer.exceptions:
        lines.append("Exceptions:")
        lines.extend(f"- {claim(e)}" for e in answer.exceptions)
    else:
        lines.append("Exceptions: not in the sources.")
    applied = _claim_words(answer.application.text)
    absent = _ABSENT in (answer.rule, answer.application)
    if applied and not absent and any(mc.near_duplicate(w, applied) for w in rendered):
        # the model restated the rule instead of applying it: point there, don't print it twice
        refs = "".join(f"[Source {n}]" for n in dict.fromkeys(answer.application.sources))
        lines.append(f"Application: as stated in the rule above {refs}.".replace(" .", "."))
    else:
        lines.append(f"Application: {claim(answer.application)}")
    return "\n".join(lines)


_CLAIM_JSON = re.compile(
    r'"text"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"sources"\s*:\s*\[([\d,\s]*)\]', re.DOTALL
)


def salvage_claims(text: str) -> str:
    """Complete ``{"text": ..., "sources": [...]}`` claims of a reply whose JSON is unusable (cut
    off by the token budget, say), one cited line each; "" when there are none."""
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

    The model fills :class:`prompts.CitedAnswer` (every claim carries the numbers of its passages;
    the server enforces the schema where it can) and the text is rendered from it, so even the
    embedded 1.5B model cites.  An unparseable or empty reply is retried once with the strict
    prompt; when that fails too the step has no answer (``citations["parsed"]`` False), and the
    complete claims of the replies are kept only as ``citations["salvaged"]`` for the trace.
    ``citations["strict_retry"]`` records the retry (a fallback: such research is never cached).
    A reply cut off at its token budget that holds a rule and an element is not retried (the strict
    retry has a smaller budget still): its complete claims stand (``prompts.cut_off_answer``,
    ``citations["cut_off"]``, also a fallback).
    Claims that only restate ``question`` are dropped (``citations["restated_question"]``)."""
    passages = prompts.quote_passages(docs)
    result = prompts.call(client, "synthesize", question=question, passages=passages)
    retried = cut_off = False
    if result.parsed is None and result.finish_reason == "length":
        # cut off at the budget: its complete claims stand (the strict retry has a smaller one)
        result.parsed = prompts.cut_off_answer(result.text)
        cut_off = result.parsed is not None
    if result.parsed is None:
        logger.info("synthesis reply unusable (%s); strict retry", result.parse_error)
        first = result
        result = prompts.call(client, "synthesize_strict", question=question, passages=passages)
        retried = True
        if result.parsed is None:
            salvaged = salvage_claims(first.text) or salvage_claims(result.text)
            _, info = normalize_citations("", len(docs))
            info.update(parsed=False, strict_retry=True, salvaged=salvaged)
            return NO_PARSED_ANSWER, info
    answer, restated = drop_restatements(result.parsed, question, docs)
    text, info = normalize_citations(render_cited_answer(answer), len(docs))
    leads = [" ".join(x.split()) for x in result.parsed.leads if x.strip()]
    info.update(
        parsed=True, strict_retry=retried, cut_off=cut_off, leads=leads[:3],
        restated_question=restated,
    )  # fmt: skip
    return text, info


# ------------------------------------------------------------------------------------------------
# Nodes
# ------------------------------------------------------------------------------------------------


@_traced("detect_injection")
def detect_injection(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """The injection verdict on the user's input (``injection.detect``: the deterministic screen,
    then the model's verdict unless SKIP_INJECTION_CHECK; ``injection_check`` says
    ``prescreen_only`` when the model's verdict was unavailable)."""
    text = state.get("global_objective", "")
    check = ctx.check_injection(text)
    update: dict[str, Any] = {"injection_check": dict(check)}
    if not check["is_safe"]:
        update["final_cited_answer"] = ctx.rejection_message(check)
        update["stop_reason"] = "injection"
    if check["is_safe"] and check["injection_check"] == "full" and check["llm_verdict"] == "safe":
        # the model's reason for a plain "safe" says nothing (the embedded model copies its
        # prompt's first example, "criminal law question", onto any question)
        return update, "safe"
    mode = "" if check["injection_check"] == "full" else f", {check['injection_check']}"
    return update, f"{check['verdict']} ({check['reason'] or check['llm_verdict']}{mode})"


@_traced("classifier")
def classifier(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    question = state["question"]
    result = prompts.call(ctx.client, "classify", question=question)
    if result.parsed is not None:
        return {"query_type": result.parsed.query_type}, result.parsed.query_type
    fallback = "multi_hop" if state.get("choices") or len(question.split()) > 60 else "simple"
    return (
        {"query_type": fallback, "fallbacks": ["classifier: unparseable reply"]},
        f"{fallback} (fallback: unparseable reply)",
    )


@_traced("planner")
def planner(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """QA memory first (a hit ends the research; a multiple-choice question still gets its letter
    from the cached research); else the first step.  The planner sees the question without its
    answer choices."""
    question = state["question"]
    hit = None
    try:
        if answer_mode(state, ctx) == "research":  # evidence answers are never cached
            hit = ctx.check_memory(question)
    except Exception as exc:  # noqa: BLE001 - a broken memory must not stop the research
        logger.warning("QA memory lookup failed: %s", exc)
    if hit:
        answer = hit.get("answer", "")
        sources = list(hit.get("sources") or [])
        return (
            {
                "memory_hit": True,
                "final_cited_answer": answer,
                "research_answer": answer,
                "sources": sources,
                "passages": {s["id"]: _passage_record(s) for s in sources if s.get("id")},
                "stop_reason": "memory_hit",
            },
            f"memory hit (similarity {hit.get('similarity', 0):.3f})",
        )
    result = prompts.call(ctx.client, "plan", objective=question)
    plan = result.parsed
    step_q = clean_question(plan.question) if plan else ""
    phase = (plan.phase if plan else "") or "rule"
    issues = [" ".join(i.split()) for i in (plan.issues if plan else []) if i.strip()]
    listed = list(issues)  # the model's own names, which its question tends to enumerate
    agenda_issue = None
    if state.get("query_type") == "multi_hop" and ctx.link_issues is not None:
        try:  # the issues the facts raise, deduplicated at the doctrine level (legal taxonomy)
            issues = ctx.link_issues(question, issues) or issues
        except Exception as exc:  # noqa: BLE001 - linking is an aid; the model's list still stands
            logger.warning("doctrine linking failed; keeping the model's issues: %s", exc)
    fallbacks = []
    if plan is None:
        fallbacks.append("planner: unparseable reply (the question itself is researched)")
    elif len(step_q) >= 10 and echoes_instructions(
        step_q, question, prompts.get_skill("plan_synthesis").system
    ):
        fallbacks.append(
            "planner: the plan restated its instructions (the question itself is researched)"
        )
        step_q, issues = "", []
    # A multi-issue objective restated as one question, or one question that enumerates several
    # issues, retrieves nothing focused: research the first planned issue instead.
    if (
        issues
        and state.get("query_type") == "multi_hop"
        and (
            len(step_q) < 10
            or len(issues_named(step_q, [*listed, *issues])) > 1
            or _unfocused(ctx, step_q, issues[:1], question)
        )
    ):
        agenda_issue = issues[0]
        step_q, phase = issue_question(agenda_issue), "rule"
    # the model's strategy was for its own question
    strategy = (
        plan.strategy.model_dump() if plan and not agenda_issue else {"search_type": "hybrid"}
    )
    if len(step_q) < 10:
        step_q, phase = question, "rule"
    step: PlanStep = {
        "step_id": 1,
        "status": "pending",
        "phase": phase,
        "question": step_q,
        "execution": None,
        "strategy": strategy,
    }
    if agenda_issue:
        step["issue"] = agenda_issue
    if issues:
        step["addresses"] = issues[0]
    update: dict[str, Any] = {
        "memory_hit": False,
        "planning_table": [step],
        "issues": issues,
        "researched_issues": issues[:1],
    }
    if fallbacks:
        update["fallbacks"] = fallbacks
    note = " (agenda: first issue)" if agenda_issue else ""
    return update, f"step 1: {_short(step_q)}{note}" + (
        f" (issues: {'; '.join(issues)})" if issues else ""
    )


@_traced("executor")
def executor(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Run ONE pending step: rewrite (for a step written from the agenda, its issue's names:
    no call) -> multi-query retrieval (excluding passages earlier steps
    retrieved) -> drop passages that carry instructions (injection screen) -> cited synthesis ->
    confidence of the passages the answer cites."""
    pending = [
        s
        for s in state.get("planning_table") or []
        if s["status"] == "pending" and not s["execution"]
    ]
    if not pending:
        return {}, "nothing pending"
    step = dict(pending[0])
    strategy = dict(step.get("strategy") or {})
    search_type, why = choose_search_type(state, ctx, step["question"], strategy.get("search_type"))
    if step.get("issue"):
        primary, alternatives = issue_queries(step["question"], step["issue"])
        rewrite_failed = False
    else:
        primary, alternatives, rewrite_failed = rewrite_queries(ctx.client, step["question"])
    seen = [i for p in _executed(state) for i in p["execution"].get("retrieved_doc_ids", [])]
    k = ctx.settings.retrieval_k
    # A few extra candidates replace passages the injection screen drops, so a planted passage
    # changes neither how many passages the step reads nor which.
    retrieved = ctx.search(search_type, [primary, *alternatives], k + ctx.flag_headroom, seen)
    # seen passages are excluded again (belt and braces: never reuse a passage)
    docs, flagged = ctx.keep_clean(retrieved, k, exclude=seen)
    # The evidence gate (LEAN_GATE): passages that barely touch the step's question are not worth
    # a synthesis call; the step fails and the working memory records the dead end.
    score = ctx.score_evidence(step["question"], docs)
    gated = bool(docs) and ctx.below_gate(score)
    if docs and not gated:
        answer, citations = synthesize(ctx.client, step["question"], docs)
        cited = [docs[n - 1] for n in citations["cited"]]
        confidence = float(ctx.confidence(step["question"], cited)) if cited else 0.0
    else:
        answer, citations, confidence = NO_ANSWER, normalize_citations("", 0)[1], 0.0
        citations["parsed"] = False
    execution: Execution = {
        "optimized_query": primary,
        "alternatives": alternatives,
        "retrieved_doc_ids": [d["id"] for d in docs],
        "cited_answer": answer,
        "confidence": round(confidence, 4),
        "rerank_top_score": docs[0].get("rerank_score") if docs else None,
        "evidence_score": round(score, 4),
        "gated": gated,
        "citations": citations,
        "flagged_passages": flagged,
    }
    step["execution"] = execution
    passages = state.get("passages") or {}
    passages = {**passages, **{d["id"]: _passage_record(d) for d in docs}}
    fallbacks = []
    if rewrite_failed:
        fallbacks.append(f"step {step['step_id']}: query rewrite unparseable (question used)")
    if citations.get("strict_retry"):
        fallbacks.append(f"step {step['step_id']}: synthesis needed the strict retry")
    if citations.get("cut_off"):
        fallbacks.append(
            f"step {step['step_id']}: synthesis cut off at its token budget (complete claims kept)"
        )
    entry = memory_entry(
        step, primary, {**strategy, "executed_as": search_type, "note": why}, retrieved, docs,
        set(seen), citations, confidence, ctx.settings.eval_confidence_threshold,
        ctx.source_type,
    )  # fmt: skip
    update: dict[str, Any] = {
        "planning_table": [step],
        "iteration_count": state.get("iteration_count", 0) + 1,
        "passages": passages,
        "chain_of_thought": [*(state.get("chain_of_thought") or []), entry],
    }
    if fallbacks:
        update["fallbacks"] = fallbacks
    if flagged:
        update["flagged_passages"] = flagged
    note = f", {len(flagged)} flagged passage(s) dropped" if flagged else ""
    if citations.get("restated_question"):
        note += f", {citations['restated_question']} claim(s) restating the question dropped"
    parsed = "" if citations.get("parsed") or not docs else ", no parsed answer"
    if gated:
        parsed = f", evidence score {score:.3f} below the gate: not synthesized"
        fallbacks.append(f"step {step['step_id']}: evidence below LEAN_GATE (not synthesized)")
        update["fallbacks"] = fallbacks
    return update, (
        f"step {step['step_id']} [{search_type}]: {len(docs)} passages, confidence {confidence:.3f}, "
        f"{len(citations['cited'])} cited, {len(citations['invalid'])} invalid citations"
        f"{parsed}{note}"
    )


_AUTHORITY = re.compile(
    r"\b\d+\s+U\.S\.C\.\s*§+\s*[\w.()-]+|\bFed\.\s*R\.\s*(?:Civ|Crim|Evid)\.\s*P?\.?\s*\d+[\w()]*"
    r"|\b(?:FRE|FRCP|Rule)\s+\d{1,4}(?:\([a-z0-9]+\))*|\b[A-Z][A-Za-z.'&-]+ v\. [A-Z][A-Za-z.'&-]+"
    r"|\b(?:First|Second|Fourth|Fifth|Sixth|Eighth|Tenth|Fourteenth) Amendment\b"
)


def dead_ends_of(state: AgentState) -> set[tuple[str, str]]:
    """(normalised step question, search type) pairs the working memory records as dead ends."""
    return {
        (_norm_words(e.get("question", "")), e["strategy"].get("executed_as", ""))
        for e in state.get("chain_of_thought") or []
        if e["dead_ends"]
    }


def choose_search_type(
    state: AgentState, ctx: AgentContext, question: str, planned: str | None
) -> tuple[str, str]:
    """(search type to run, why it differs from the plan).  SEARCH_STRATEGY forces one; else the
    planned type, unless the working memory records it as a dead end for this question, in which
    case the next type of ``prompts.SEARCH_TYPES`` that is not."""
    forced = ctx.settings.search_strategy
    if forced != "auto":
        return forced, "forced by SEARCH_STRATEGY"
    wanted = planned if planned in prompts.SEARCH_TYPES else "hybrid"
    dead = dead_ends_of(state)
    key = _norm_words(question)
    for search_type in (wanted, *prompts.SEARCH_TYPES):
        if (key, search_type) not in dead:
            return search_type, "" if search_type == wanted else f"{wanted} was a dead end"
    return wanted, "every search type was a dead end for this question"


def memory_entry(
    step: PlanStep,
    query: str,
    strategy: dict[str, Any],
    retrieved: list[dict],
    docs: list[dict],
    seen: set[str],
    citations: dict[str, Any],
    confidence: float,
    threshold: float,
    classify: Callable[[dict], str],
) -> dict[str, Any]:
    """The working-memory entry of one research iteration, computed from what happened (only
    ``leads`` comes from the model, inside the synthesis reply)."""
    source_types: dict[str, int] = {}
    authorities: list[str] = []
    for d in docs:
        kind = classify(d)
        source_types[kind] = source_types.get(kind, 0) + 1
        for m in _AUTHORITY.finditer(d.get("text") or ""):
            if m.group(0) not in authorities:
                authorities.append(m.group(0))
    dead_ends = []
    if not retrieved:
        dead_ends.append("no results")
    elif not docs and all(d["id"] in seen for d in retrieved):
        dead_ends.append("only passages already seen")
    elif not docs:
        dead_ends.append("every passage was flagged by the injection screen")
    if docs and not citations.get("parsed"):
        dead_ends.append("no parsed answer")
    if docs and confidence < threshold:
        dead_ends.append(f"confidence {confidence:.2f} below threshold {threshold:.2f}")
    return {
        "step_id": step["step_id"],
        "question": step["question"],
        "query": query,
        "strategy": strategy,
        "results": {
            "count": len(docs),
            "new": sum(1 for d in docs if d["id"] not in seen),
            "source_types": source_types,
            "authorities": authorities[:6],
            "top_score": round(float(docs[0].get("rerank_score") or 0.0), 4) if docs else None,
            "confidence": round(confidence, 4),
        },
        "leads": list(citations.get("leads") or []),
        "dead_ends": dead_ends,
        "next_steps": [],
    }


def memory_lines(state: AgentState) -> str:
    """The working memory, one compact line per iteration (the replanner's and the CLI's view)."""
    lines = []
    for e in state.get("chain_of_thought") or []:
        r = e["results"]
        s = e["strategy"]
        line = (
            f"- step {e['step_id']} [{s.get('executed_as', s.get('search_type', '?'))}] "
            f"{_short(e['query'], 70)!r}: {r['count']} passages ({r['new']} new), "
            f"confidence {r['confidence']:.2f}"
        )
        if r["authorities"]:
            line += f"; authorities: {', '.join(r['authorities'][:3])}"
        if e["leads"]:
            line += f"; leads: {'; '.join(e['leads'])}"
        line += f"; dead ends: {'; '.join(e['dead_ends']) or 'none'}"
        if e["next_steps"]:
            line += f"; next: {'; '.join(e['next_steps'])}"
        lines.append(line)
    return "\n".join(lines)


def _passage_record(doc: dict) -> dict:
    return {
        "id": doc["id"],
        "title": doc.get("title") or "",
        "source": doc.get("source") or (doc.get("metadata") or {}).get("source", ""),
        "text": doc.get("text") or "",
    }


def step_succeeded(execution: Execution, threshold: float) -> bool:
    """A step completes only with a parsed answer that cites at least one passage it was given,
    and a confidence (of the cited passages) at or above ``threshold``."""
    citations = execution.get("citations") or {}
    return (
        bool(citations.get("parsed"))
        and bool(citations.get("cited"))
        and execution["confidence"] >= threshold
    )


def aggregate(state: AgentState, threshold: float) -> tuple[str, list[dict]]:
    """The final answer from completed steps with [Query X][Source N] citations, and its sources.
    With no completed step, the executed steps' answers under a low-confidence warning."""
    passages = state.get("passages") or {}
    completed = _completed(state)
    steps = completed or [
        s
        for s in _executed(state)
        if s["execution"].get("retrieved_doc_ids")
        and (s["execution"].get("citations") or {}).get("parsed", True)
    ]
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


def _decline(state: AgentState, threshold: float) -> tuple[str, str] | None:
    """``(reason, answer text)`` when the research declines the question, None when it made no
    decision (the model's replies failed)."""
    executed = _executed(state)
    drafts = [
        s["execution"]
        for s in executed
        if (s["execution"].get("citations") or {}).get("parsed")
        and s["execution"].get("cited_answer")
    ]
    if drafts:
        best = max(float(ex.get("confidence") or 0.0) for ex in drafts)
        reason = f"evidence reached the confidence threshold (best {best:.2f} < {threshold:.2f})"
        return f"no research step's {reason}", (
            f"{NOT_FOUND} No research step's {reason}, so its draft is not given as an answer; "
            "the drafts and their passages are in the trace (`planning_table` in --json)."
        )
    gated = [s["execution"] for s in executed if s["execution"].get("gated")]
    if gated:
        best = max(float(ex.get("evidence_score") or 0.0) for ex in gated)
        reason = f"closest passages found are off topic (best evidence score {best:.2f}, below LEAN_GATE)"
        return f"the {reason}", f"{NOT_FOUND} The {reason}; the corpus may not cover this subject."
    if not any(s["execution"].get("retrieved_doc_ids") for s in executed):
        return "the research found no passages for this question", NO_ANSWER
    return None


def decline_reason(state: AgentState, threshold: float) -> str | None:
    """Why the research declines the question ("no research step's evidence reached the
    confidence threshold (best 0.25 < 0.38)"), or None when it does not."""
    declined = _decline(state, threshold)
    return declined[0] if declined else None


def no_answer(state: AgentState, threshold: float) -> tuple[bool, str]:
    """``(abstained, text)``: why the research has no answer to give.  ``abstained`` is True when
    the research declined (:func:`decline_reason`), False when the model's replies failed."""
    declined = _decline(state, threshold)
    return (True, declined[1]) if declined else (False, NO_PARSED_ANSWER)


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


EvaluatorRoute = Literal["executor", "replanner", "mc_select", "answer_from_evidence"]


def answer_mode(state: AgentState, ctx: AgentContext) -> str:
    """research or evidence: the run's input may choose, else ANSWER_MODE."""
    return state.get("answer_mode") or ctx.settings.answer_mode


def answer_node(mode: str) -> Literal["mc_select", "answer_from_evidence"]:
    """Where finished research goes: evidence mode composes from verified quotes first."""
    return "answer_from_evidence" if mode == "evidence" else "mc_select"


def make_evaluator(forced_mode: str | None = None) -> Callable:
    """The evaluator node; ``forced_mode`` fixes the answer mode (the evidence graph of
    langgraph.json), else the state's or ANSWER_MODE decides."""

    @_traced("evaluator")
    def evaluator(state: AgentState, ctx: AgentContext) -> tuple[dict, str, EvaluatorRoute]:
        """Grade executed steps (:func:`step_succeeded`), summarise them into the context,
        aggregate the answer, and route: the pending step, the replanner, or the answer."""
        mode = forced_mode or answer_mode(state, ctx)
        update, decision, route = evaluate(state, ctx)
        if route == "mc_select":
            route = answer_node(mode)
        return {**update, "answer_mode": mode}, f"{decision} -> {route}", route

    return evaluator


def evaluate(state: AgentState, ctx: AgentContext) -> tuple[dict, str, EvaluatorRoute]:
    """The evaluator's work: grades, the aggregated answer and the next node (mc_select standing
    for "answer now")."""
    s = ctx.settings
    threshold = s.eval_confidence_threshold
    graded: list[PlanStep] = []
    summaries: list[str] = []
    for step in state.get("planning_table") or []:
        if step["status"] == "pending" and step["execution"]:
            ex = step["execution"]
            status = "completed" if step_succeeded(ex, threshold) else "failed"
            graded.append({**step, "status": status})
            summaries.append(
                f"Step {step['step_id']} ({step['phase']}, {status}, confidence "
                f"{ex['confidence']:.2f}): {step['question']} -> {_short(ex['cited_answer'], 300)}"
            )
    view: AgentState = {**state, "planning_table": merge_steps(state.get("planning_table"), graded)}
    answer, sources = aggregate(view, threshold)
    table = view["planning_table"]
    n_completed = sum(1 for p in table if p["status"] == "completed")
    iterations = state.get("iteration_count", 0)
    pending = [p for p in table if p["status"] == "pending" and not p["execution"]]
    left = ctx.time_left()
    stop = None
    route: EvaluatorRoute
    if left is not None and left < MC_RESERVE_S:
        route, stop = "mc_select", f"deadline: {max(left, 0):.0f}s of RUN_TIMEOUT left"
    elif pending and iterations < s.max_iterations:
        route = "executor"
    elif state.get("query_type") != "multi_hop":
        route = "mc_select"
    elif n_completed >= s.max_steps:
        route, stop = "mc_select", f"{n_completed} steps completed"
    elif iterations >= s.max_iterations:
        route, stop = "mc_select", f"iteration limit {s.max_iterations} reached"
    elif stag := stagnation(view, ctx):
        route, stop = "mc_select", f"stagnation: {stag}"
    else:
        route = "replanner"
    if answer and not _completed(view) and not state.get("choices"):
        # An open question whose research reached no confident step is declined; a
        # multiple-choice question still reads the low-confidence research (it must be answered).
        answer, sources = "", []
    off_topic = None
    if answer and route == "mc_select" and not state.get("choices"):
        # The steps' confidence is measured against the model's own step questions: a question
        # the corpus does not touch ("banana bread recipe") can be reworded into one it does. So
        # an open answer also needs the question as asked to reach the evidence gate.
        off_topic = ctx.off_topic_score(state["question"])
        if off_topic is not None:
            answer, sources = "", []
    if answer and stop:
        # The research stopped with planned issues untouched: say so instead of letting the
        # answer read as complete.
        answer += not_researched_note(view, stop)
    if answer:
        abstained, why_not = False, ""
    elif off_topic is None:
        abstained, why_not = no_answer(view, threshold)
    else:
        abstained, why_not = (
            True,
            (
                f"{NOT_FOUND} The passages closest to the question as asked are off topic (best "
                f"evidence score {off_topic:.2f}, below LEAN_GATE {s.lean_gate:.2f}); the research's "
                "drafts answer the model's rewording of it, so none is given as an answer."
            ),
        )
        stop = stop or (
            f"{OFF_TOPIC}: the passages closest to the question as asked score {off_topic:.2f}, "
            f"below LEAN_GATE {s.lean_gate:.2f}"
        )
    update: dict[str, Any] = {
        "planning_table": graded,
        "accumulated_context": summaries,
        "final_cited_answer": answer or why_not,
        "research_answer": answer,
        "abstained": abstained,
        "sources": sources,
    }
    if stop:
        update["stop_reason"] = stop
    grades = ", ".join(f"step {g['step_id']} {g['status']}" for g in graded) or "no new step"
    return update, grades + (f" ({stop})" if stop else ""), route


evaluator = make_evaluator()


@_traced("replanner")
def replanner(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """next_step | retry | complete.  On LLM failure or an unusable reply: complete with the
    evidence so far.  A question that is unusable, repeats an earlier step or restates the
    objective is replaced by the next open planned issue; with none left, the research completes.
    When no more steps are left than open planned issues, a question that addresses none of them
    (by name or by cosine) is replaced the same way, so the budget goes to the plan's issues."""
    table = state.get("planning_table") or []
    asked = "\n".join(f"- {p['question']}" for p in table)
    findings = "\n".join(state.get("accumulated_context") or []) or "(nothing yet)"
    issues = "; ".join(state.get("issues") or []) or "(not listed)"
    progress = (
        f"Legal issues identified when planning: {issues}\n\n"
        f"Questions already researched (never ask them again):\n{asked}\n\n"
        f"Research memory (search type, results, leads, dead ends):\n"
        f"{memory_lines(state) or '(empty)'}\n\nFindings:\n{findings}"
    )
    try:
        result = prompts.call(ctx.client, "replan", objective=state["question"], progress=progress)
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
    elif len(named := issues_named(question, state.get("issues") or [])) > 1:
        problem = f"the question names {len(named)} planned issues at once"
    last = table[-1] if table else None
    action = plan.action
    if action == "retry" and last is not None and last["status"] == "completed":
        action = "next_step"  # only a failed step is retried
    # The open issue the model's question addresses: the closest by cosine, else the one it names
    # (more than one named is a problem above).
    named_open = issues_named(question, agenda)
    matched = (
        agenda[to_agenda.index(max(to_agenda))]
        if to_agenda and max(to_agenda) >= ISSUE_MATCH_COSINE
        else (named_open[0] if len(named_open) == 1 else None)
    )
    steps_left = ctx.settings.max_steps - sum(1 for p in table if p["status"] == "completed")
    if (
        problem is None
        and action != "retry"
        and agenda
        and steps_left <= len(agenda)
        and matched is None
    ):
        # The step budget no longer covers the planned issues: a question of the model's own
        # that addresses none of them would leave one unresearched, so the next one goes first.
        problem = (
            f"{len(agenda)} planned issue(s) open, {steps_left} step(s) left, and the question "
            "addresses none of them"
        )
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
    else:
        issue = matched
    step: PlanStep = {
        "step_id": _next_step_id(state),
        "status": "pending",
        "phase": phase,
        "question": question,
        "execution": None,
        "strategy": plan.strategy.model_dump() if problem is None else {"search_type": "hybrid"},
    }
    if problem is not None and issue is not None:
        step["issue"] = issue
    if issue is not None:
        step["addresses"] = issue
    update: dict[str, Any] = {"planning_table": [step]}
    memory = [dict(e) for e in state.get("chain_of_thought") or []]
    if memory:
        memory[-1]["next_steps"] = [*memory[-1]["next_steps"], f"{action}: {question}"]
        update["chain_of_thought"] = memory
    if issue is not None:
        update["researched_issues"] = [*(state.get("researched_issues") or []), issue]
    decision = f"{action}: step {step['step_id']}: {_short(question)}"
    if problem is not None:
        decision += f" (agenda: {problem})"
    return update, decision


@_traced("answer_from_evidence")
def answer_from_evidence(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Evidence mode: the answer is composed only from verbatim quotes of the passages the research
    found that pass the grounding gate (``evidence.py``: retrieval floor, extraction, gate,
    composition, review and revision), or an abstention."""
    passages = [dict(p) for p in (state.get("passages") or {}).values()]
    cosines = _cosines(ctx, state["question"], [p["text"] for p in passages])
    for p, cos in zip(passages, cosines, strict=False):
        p["dense_score"] = cos
    choices = state.get("choices") or None
    # An open question the research declined is declined here too: its passages did not reach
    # the confidence threshold or the evidence gate, so quotes from them are no ground to stand on.
    declined = None
    if state.get("abstained") and not choices:
        stop = str(state.get("stop_reason") or "")
        declined = (
            stop  # the question as asked was off topic (see evaluate)
            if stop.startswith(OFF_TOPIC)
            else decline_reason(state, ctx.settings.eval_confidence_threshold)
        )
    result = ctx.answer_from_evidence(state["question"], passages, choices, declined)
    verified = sum(1 for q in result.get("quotes") or [] if q.get("verified"))
    decision = (
        f"{'abstained' if result['abstained'] else 'grounded'}: {verified} verified quote(s), "
        f"score {result.get('quality_score')}, {result.get('revisions', 0)} revision(s)"
    )
    return {"evidence": result, "final_cited_answer": result["answer"]}, decision


def mc_evidence(state: AgentState) -> str:
    """The evidence of the MC prompt: the agent's cited research (or the cached research of a
    memory hit) and the passages it stands on, round-robin over the steps, through the one
    evidence formatter every mode uses (``prompts.format_evidence``)."""
    by_step: dict[int, list[dict]] = {}
    for src in state.get("sources") or []:
        by_step.setdefault(src.get("step_id", 0), []).append(src)
    picked: list[dict] = []
    while any(by_step.values()):
        for key in list(by_step):
            if by_step[key]:
                picked.append(by_step[key].pop(0))
    research = (state.get("evidence") or {}).get("answer") or state.get("research_answer")
    if research and research.startswith("No answer:"):
        research = None  # a decline is not a finding: with no passages the pick is closed-book
    return prompts.format_evidence(picked, research=research)


CLOSED_BOOK_NOTE = (
    "[Closed-book: no passage supports this letter; it is the model's own answer, "
    "not grounded in the sources.]"
)


@_traced("mc_select")
def mc_select(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    choices = state.get("choices") or {}
    if not choices:
        return {}, "no choices: pass through"
    evidence_text = mc_evidence(state) or None
    result = mc.select_answer(ctx.client, state["question"], choices, evidence_text)
    research = (
        (state.get("evidence") or {}).get("answer")
        or state.get("research_answer")
        or state.get("final_cited_answer")
        or ""
    )
    line = mc.answer_line(result.letter, choices)
    if evidence_text is None and result.letter:
        line = f"{line}\n{CLOSED_BOOK_NOTE}"
    final = f"{research}\n\n{line}".strip()
    decision = f"({result.letter}) via {result.strategy}" + (
        " after strict retry" if result.retried else ""
    )
    if evidence_text is None:
        decision += ", closed-book"
    mc_answer = {**result.to_dict(), "closed_book": evidence_text is None}
    return {"mc_answer": mc_answer, "final_cited_answer": final}, decision


def _mean_completed_confidence(state: AgentState) -> float:
    confs = [s["execution"]["confidence"] for s in _completed(state)]
    return sum(confs) / len(confs) if confs else 0.0


def cache_blockers(state: AgentState, ctx: AgentContext) -> list[str]:
    """Why this run's research must not be cached (empty: it may be).  Nothing is stored from a
    run with unparsed calls, failed or invalid citations, a fallback, or a low-confidence answer."""
    why: list[str] = []
    research = state.get("research_answer") or ""
    if state.get("memory_hit"):
        why.append("answer came from memory")
    if state.get("evidence"):
        why.append("evidence-mode answers are not cached")
    if not research.strip() or research.startswith((LOW_CONFIDENCE_PREFIX, NO_ANSWER)):
        why.append("no confident answer")
    records = ctx.client.records[ctx.record_offset :]
    if n := sum(1 for r in records if r.parse_failed):
        why.append(f"{n} unparsed LLM repl{'y' if n == 1 else 'ies'}")
    if n := sum(1 for r in records if r.error):
        why.append(f"{n} failed LLM call(s)")
    if state.get("fallbacks"):
        why.append(f"fallback: {state['fallbacks'][0]}")
    for step in _completed(state):
        c = step["execution"].get("citations") or {}
        if c.get("invalid") or not c.get("cited"):
            why.append(f"step {step['step_id']} has invalid or no citations")
    confidence = _mean_completed_confidence(state)
    if research and confidence < ctx.settings.eval_confidence_threshold:
        why.append(f"confidence {confidence:.3f} < {ctx.settings.eval_confidence_threshold:.2f}")
    return why


@_traced("memory_writeback")
def memory_writeback(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Cache the research (never the MC selection) when it is trustworthy and new."""
    blockers = cache_blockers(state, ctx)
    if blockers:
        return {}, f"skip: {blockers[0]}"
    confidence = _mean_completed_confidence(state)
    try:
        ctx.write_memory(
            state["question"], state["research_answer"], confidence, state.get("sources") or []
        )
    except Exception as exc:  # noqa: BLE001 - caching is best effort
        logger.warning("QA memory write failed: %s", exc)
        return {}, f"skip: write failed ({exc})"
    return {}, f"stored (confidence {confidence:.3f})"


def worst_case_calls(settings: Any, *, choices: bool = True, injection: bool = False) -> int:
    """The most LLM calls one question can take: classify and plan; per executor run a rewrite, a
    synthesis and its strict retry; a replan between runs; the MC call and its strict retry."""
    runs = settings.max_iterations
    return 2 + 3 * runs + (runs - 1) + (2 if choices else 0) + int(injection)


def answer_body(state: AgentState) -> str:
    """The research answer a user gets ("" when there is none)."""
    if (state.get("injection_check") or {}).get("is_safe") is False:
        return ""
    if state.get("evidence"):
        return (state["evidence"].get("answer") or "").strip()
    research = (state.get("research_answer") or "").strip()
    return "" if research.startswith((NO_ANSWER, NO_PARSED_ANSWER)) else research


def compute_metrics(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    table = state.get("planning_table") or []
    per_node: dict[str, float] = {}
    for ev in state.get("trace") or []:
        per_node[ev["node"]] = round(per_node.get(ev["node"], 0.0) + ev["seconds"], 3)
    citations = [s["execution"].get("citations") or {} for s in table if s.get("execution")]
    mc_answer = state.get("mc_answer") or {}
    return {
        **ctx.client.summary(since=ctx.record_offset),
        "node_latency_s": per_node,
        "total_node_s": round(sum(per_node.values()), 3),
        "iterations": state.get("iteration_count", 0),
        "steps_completed": sum(1 for s in table if s["status"] == "completed"),
        "steps_failed": sum(1 for s in table if s["status"] == "failed"),
        "query_type": state.get("query_type"),
        "memory_hit": bool(state.get("memory_hit")),
        "has_answer": bool(answer_body(state)),
        "injection_verdict": (state.get("injection_check") or {}).get("verdict"),
        "injection_check": (state.get("injection_check") or {}).get("injection_check"),
        "stop_reason": state.get("stop_reason"),
        "invalid_citations": sum(len(c.get("invalid", [])) for c in citations),
        "uncited_sentences": sum(c.get("uncited_sentences", 0) for c in citations),
        "steps_without_citation": sum(1 for c in citations if not c.get("has_citation")),
        "unparsed_steps": sum(1 for c in citations if c and not c.get("parsed", True)),
        "flagged_passages": len(state.get("flagged_passages") or []),
        "fallbacks": list(state.get("fallbacks") or []),
        "mc_letter": mc_answer.get("letter"),
        "mc_parse_failed": bool(mc_answer.get("parse_failed")) if mc_answer else None,
        "mc_closed_book": bool(mc_answer.get("closed_book")) if mc_answer else None,
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


def route_after_planner(state: AgentState) -> Literal["executor", "mc_select", "memory_writeback"]:
    """A memory hit skips the research; with answer choices it still picks a letter."""
    if not state.get("memory_hit"):
        return "executor"
    return "mc_select" if state.get("choices") else "memory_writeback"


def route_after_replanner(
    state: AgentState,
) -> Literal["executor", "mc_select", "answer_from_evidence"]:
    pending = [
        s
        for s in state.get("planning_table") or []
        if s["status"] == "pending" and not s["execution"]
    ]
    return "executor" if pending else answer_node(state.get("answer_mode") or "research")
