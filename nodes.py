"""The nodes of the research agent and their routers.

Every node takes ``(state, runtime)``, reads its dependencies from ``runtime.context``
(:class:`context.AgentContext`) and appends one ``trace`` event (node, decision, seconds) that the
CLI streams; every LLM call goes through ``prompts.call``.  The planner names the issues the
question raises; each is one research step whose queries are its doctrine's names and the facts
that raise it, and a step whose passages miss the evidence gate gets one more angle before it is
given up.  The answer stage (``answer.py``) then writes one typed record that everything reads.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command, Overwrite, interrupt
from pydantic import TypeAdapter

import answer as answer_stage
import mc
import prompts
import question as question_mod
from context import AgentContext, Passage, default_context
from mc import doctrine_key
from question import Question, StateLaw
from state import AgentState, Execution, MemoryEntry, PlanStep, Turn, merge_steps

logger = logging.getLogger(__name__)

MC_RESERVE_S = 30.0
"""Seconds of the run deadline kept for the answer: research stops this early."""
OFF_TOPIC = "off topic"
"""How the planner's decline (and stop_reason) starts when the question as asked is off topic."""
FIELD_EVIDENCE = 0.55
"""Below this ``AgentContext.question_score`` a question filed under an uncovered field is declined
(the open set's 48 so filed score <= 0.50; "When is an employer vicariously liable ...?" 0.67)."""
FIRST_SEARCH = "hybrid+keyword"
"""A research step's first angle: hybrid (dense + BM25) and BM25 alone, fused by rank; dense search
misreads a doctrine's name where BM25 finds it (docs/MEASUREMENTS_HISTORY.md, "Fact patterns")."""
RETRY_SEARCH = "keyword"
"""The other angle of a step that missed the evidence gate: BM25 over its issue's facts, names."""


def _traced(name: str) -> Callable:
    """Wrap a node body ``fn(state, ctx) -> (update, decision[, goto])``: time it, append a trace
    event, and route with ``Command(goto=...)`` when the body names the next node."""

    def wrap(fn: Callable[[AgentState, AgentContext], tuple]) -> Callable:
        def node(state: AgentState, runtime: Runtime[AgentContext]) -> dict | Command:
            # A LangGraph server run brings an empty context ({}): use the default one, whose
            # run (its deadline, and the LLM calls it counts) starts at the run's first node.
            if not isinstance(ctx := runtime.context, AgentContext):
                ctx = default_context()
                ctx = ctx.start_run() if name == "detect_injection" else ctx
            start = time.perf_counter()
            update, decision, *goto = fn(state, ctx)
            seconds = round(time.perf_counter() - start, 3)
            logger.info("%s: %s (%.2fs)", name, decision, seconds)
            update = dict(update)
            event = [{"node": name, "decision": decision, "seconds": seconds}]
            # a run's first node starts the trace anew (a thread keeps only the latest run's)
            update["trace"] = Overwrite(event) if "trace" in update else event
            return Command(update=update, goto=goto[0]) if goto else update

        # Not functools.wraps: LangGraph reads the wrapper's signature to inject ``runtime``.
        node.__name__ = node.__qualname__ = name
        node.__doc__ = fn.__doc__
        node.__module__ = fn.__module__
        node.step = fn  # the undecorated (state, ctx) -> (update, decision) function
        return node

    return wrap


def issue_question(issue: str) -> str:
    """The doctrinal question of a planned issue (what its evidence is scored against)."""
    return f"What are the rule and elements of {issue.strip().rstrip('?.')}?"


def issue_names(issue: str) -> list[str]:
    """An agenda item's names: its label and the linked doctrines in its parentheses
    ("First Amendment (Freedom of speech; Public forum)" -> three names)."""
    head, _, rest = issue.partition("(")
    names = [" ".join(n.split()) for n in [head, *rest.rstrip(") ").split(";")]]
    return list(dict.fromkeys(n for n in names if n))[:3]


def step_for(
    step_id: int, issue: str, facts: list[str], search_type: str = FIRST_SEARCH, phase: str = "rule"
) -> PlanStep:
    """A pending research step for ``issue``: a self-contained question that keeps the facts that
    raise the issue, and queries built from the doctrine's names and those facts."""
    names = issue_names(issue)
    fact_text = " ".join(facts)
    question = issue_question(names[0]) + (f" Facts: {fact_text}" if fact_text else "")
    queries = [issue_question(names[0]), *names[1:]]
    if fact_text:
        queries.append(f"{names[0]}: {fact_text}")
    return {
        "step_id": step_id,
        "status": "pending",
        "phase": phase,
        "question": question,
        "execution": None,
        "strategy": {"search_type": search_type, "queries": queries},
        "issue": issue,
        "facts": list(facts),
    }


def _executed(state: AgentState) -> list[PlanStep]:
    return [s for s in state.get("planning_table") or [] if s.get("execution")]


def _reading(state: AgentState, key: str) -> Any:
    return (state.get("reading") or {}).get(key)


def planned(state: AgentState) -> list[str]:
    """The research agenda the planner (or the user, or the replanner) set: ``reading["agenda"]``."""
    return list(_reading(state, "agenda") or [])


PASSED_OVER = 3
"""Candidates an answer names as not researched: where the research cited no gold passage (13 of
40 fact patterns), a named one's search finds it for 4 with the first 3 as with all, 3 with the
first 2 (``steer_found``; docs/MEASUREMENTS.md, "Fact patterns")."""

OTHERS_FIT = 0.22
"""The cosine a stated fact must reach to one of a passed-over candidate's first 3 passages for
the answer to name it: the highest floor that drops no gold-finding candidate on the tune half (it
drops 9 of 56 names; report half 14 of 56, none gold-finding; docs/MEASUREMENTS.md)."""


def candidate_search(ctx: AgentContext, name: str, facts: Sequence[str]) -> list[Passage]:
    """The passages a research step for candidate ``name`` would find first (its first search)."""
    kept = answer_stage.issue_facts(name, facts, ctx.embed)
    k = ctx.settings.agent.retrieval_k
    return ctx.search(FIRST_SEARCH, step_for(1, name, kept)["strategy"]["queries"], k, [])[:k]


def left_off(
    researched: Iterable[str], candidates: Iterable[str], quoted: Collection[str] = ()
) -> list[str]:
    """The candidates, by the name before their parentheses and once each, whose doctrine
    (:func:`mc.doctrine_key`) is neither researched nor among ``quoted`` (doctrine keys)."""
    taken = {doctrine_key(i) for i in researched} | set(quoted)
    names = (c.split(" (")[0] for c in candidates)
    return list(dict.fromkeys(n for n in names if doctrine_key(n) not in taken))


def passed_over(state: AgentState, ctx: AgentContext, quoted: Collection[str] = ()) -> list[str]:
    """The planner's candidates left off the agenda, what the user may research next (the 1.5B
    passed over "Abnormally dangerous activities" for a blasting question); of a fact pattern, those
    a stated fact fits at :data:`OTHERS_FIT`; of a rule question that names an issue, those named
    after it ("What is the mailbox rule?" listed answers and Rule 12 defenses).  None the answer
    quotes (``quoted``) or the thread researched, and none when the user set or reviewed the
    agenda."""
    q = state["parsed"]
    facts = q.facts
    if q.issues or _reading(state, "review"):
        return []
    asked = [i for i in planned(state) if answer_stage.named_in(i, q.asked)]

    def fits(name: str) -> bool:
        try:
            top = candidate_search(ctx, name, facts)[:3]
            # the sources hold the doctrine: a passage on it (off_doctrine's test), not only
            # passages about the facts (a user's noise ordinance "held" emotional distress)
            scores = answer_stage.doctrine_scores(name, top, ctx.embed)
            top = [d for d, s in zip(top, scores, strict=True) if s >= answer_stage.DOCTRINE_MATCH]
            return any(max(ctx.passage_cosines(f, top), default=0.0) >= OTHERS_FIT for f in facts)
        except Exception as exc:  # noqa: BLE001 - a hint, not the answer: name it unchecked
            logger.warning("passed-over candidate %r not checked: %s", name, exc)
            return True

    researched = [*planned(state), *thread_research(state)]
    names = left_off(researched, _reading(state, "candidates") or [], quoted)
    if q.kind == "rule_question" and asked:
        names = [n for n in names if answer_stage.named_after(n, asked)]
    return list(itertools.islice(filter(fits, names) if facts else names, PASSED_OVER))


def recalled(state: AgentState) -> dict[str, Any]:
    """The QA-memory hit that answers this run (empty when none): ``reading["recalled"]``."""
    return _reading(state, "recalled") or {}


def unresearched_issues(state: AgentState) -> list[str]:
    """Planned issues no executed step researched (a step planned but never run counts as none)."""
    done = {s.get("issue") for s in _executed(state)}
    return [i for i in planned(state) if i not in done]


def _classified(reading: dict[str, Any]) -> dict[str, Any]:
    """The classifier's part of a reading (what a thread keeps of it for a follow-up)."""
    return {k: reading[k] for k in ("legal", "area", "topic") if k in reading}


def _short(text: str, n: int = 80) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _passage_record(doc: dict) -> dict:
    """A retrieved passage or a cached answer's source as ``AgentState.passages`` keeps it."""
    meta = doc.get("metadata") or {}
    return (
        {
            "id": doc["id"],
            "title": doc.get("title") or "",
            "source": doc.get("source") or meta.get("source", ""),
            "text": doc.get("text") or "",
            "heading": meta.get("heading") or "",
            "pin": answer_stage.pin_cite(doc),
            "doc_id": meta.get("doc_id") or "",  # the user's own document
        }
        | ({"kind": kind} if (kind := meta.get("kind")) else {})  # opinion, statute, contract...
        | ({"line_pins": pins} if (pins := line_pins(doc)) else {})
        | _definitions(doc)
    )


def _definitions(doc: dict) -> dict[str, list[dict]]:
    """The definitions a loaded document's chunk uses (``documents.chunk_document``), each with
    its pin cite: {"definitions": [...]}, or {} for none."""
    raw = str((doc.get("metadata") or {}).get("definitions") or "")
    defs = json.loads(raw) if raw.startswith("[") else []
    defs = [{**d, "pin": answer_stage.pin_cite(doc, pin=d["pin"])} for d in defs]
    return {"definitions": defs} if defs else {}


def line_pins(doc: dict) -> dict[str, str]:
    """A loaded document's pin cite per line (line -> pin) when its lines differ: a statute chunk
    of several subsections, an opinion's paragraphs on two star pages ({} else)."""
    meta = doc.get("metadata") or {}
    pins = str(meta.get("line_pins") or "").split("\n")
    lines = str(doc.get("text") or "").split("\n")
    if len(pins) != len(lines) or len(set(pins)) < 2:
        return {}
    return {
        line: answer_stage.pin_cite(doc, pin=pin) for line, pin in zip(lines, pins, strict=True)
    }


@_traced("detect_injection")
def detect_injection(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """The injection verdict on the user's input (``injection.detect``: the deterministic screen,
    then the model's unless SKIP_INJECTION_CHECK; ``injection_check`` is ``prescreen_only`` when
    the model's verdict was unavailable)."""
    q = state.get("parsed")
    if q is None or q.objective != state["question"]:  # a new question on the thread
        q = Question.read(*question_mod.parse(state["question"]), ctx.state_law)
    check = ctx.check_injection(q.objective)  # what the user typed, not the thread's facts
    if turns := state.get("turns"):
        last = turns[-1]
        q = q.after(last.get("facts") or [], last.get("asked") or "", ctx.state_law)
    # the run's answer mode, resolved once (ANSWER_MODE=auto: lean with choices, else research)
    mode = answer_mode({**state, "parsed": q, "reading": {}}, ctx)
    reading = {"injection": dict(check), "mode": mode, "review": bool(state.get("review"))}
    if turns:
        reading["follow_up"] = "hypothetical" if q.hypothetical else "question"
    update: dict[str, Any] = {
        **RUN_SCOPED,
        "parsed": q,
        "review": False,  # asked for one run: the thread's next question is not paused
        "reading": Overwrite(reading),
        **{k: Overwrite([]) for k in ("planning_table", "flagged_passages", "fallbacks", "trace")},
    }
    if not check["is_safe"]:
        why = f"rejected as a prompt injection: {check['reason']}"
        record = answer_stage.AnswerRecord.declined(q.kind, ctx.rejection_message(check), why)
        update.update(stop_reason="injection", answer=record.to_dict())
    if check["is_safe"] and check["injection_check"] == "full" and check["llm_verdict"] == "safe":
        # the model's reason for a plain "safe" says nothing (the embedded model copies its
        # prompt's first example, "criminal law question", onto any question)
        return update, "safe"
    how = "" if check["injection_check"] == "full" else f", {check['injection_check']}"
    return update, f"{check['verdict']} ({check['reason'] or check['llm_verdict']}{how})"


RUN_SCOPED: dict[str, Any] = dict(
    passages={}, chain_of_thought=[], answer={}, stop_reason="", run_metrics={}
)
"""What belongs to one question: a run's first node resets it, with the reducers' keys (a
checkpointed thread keeps its state between runs)."""


def _memory_hit(state: AgentState, ctx: AgentContext, q: Question) -> dict | None:
    """The QA memory's answer that serves this very question (None: none does)."""
    reading = state.get("reading") or {}
    # evidence answers are never cached; a follow-up's facts are its thread's, not a saved
    # one's; a run the user reviews, or whose issues the user set, is researched on them
    steered = reading.get("review") or q.issues
    unheld = q.law and not q.law.held  # law no source holds: declined, whatever was saved before
    if answer_mode(state, ctx) != "research" or reading.get("follow_up") or steered or unheld:
        return None
    try:
        hit = ctx.check_memory(q.text)
    except Exception as exc:  # noqa: BLE001 - a broken memory must not stop the research
        logger.warning("QA memory lookup failed: %s", exc)
        return None
    if not hit:
        return None
    # A fact pattern's answer applies the law to its facts: it serves those facts only ("Officer
    # Reyes arrested Dan. ... Was the search lawful?" got another story's answer at 0.92).
    texts = [" ".join(str(t).split()) for t in (hit.get("question"), q.text)]
    kinds = {question_mod.question_kind(t) for t in texts}
    if "fact_pattern" in kinds and texts[0].lower() != texts[1].lower():
        return None
    # Nor does an answer under one state's law serve another's ("Under Ohio law, ..." got the
    # answer saved for "Under Colorado law, ..." at 0.92, though no source is Ohio law).
    if ctx.state_law:
        laws = [ctx.state_law(question_mod.split_question(t)[1]) for t in texts]
        if len({law.name if law else "" for law in laws}) > 1:
            return None
    return hit


@_traced("classifier")
def classifier(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """QA memory first: a question answered before (a fact pattern: the same facts, word for word)
    is neither classified nor researched; else its kind, field of law and topic."""
    q, last = state["parsed"], last_turn(state)
    again = q.asked == last.get("asked") and (q.hypothetical or not q.new_facts)
    if _reading(state, "follow_up") and again:
        # the thread's last question again, on changed facts or on issues the user names
        kept = _classified(last.get("reading") or {})
        decision = f"follow-up: read as the thread's last question ({kept.get('area')})"
        return {"reading": kept}, decision
    if hit := _memory_hit(state, ctx, q):
        sources = list(hit.get("sources") or [])
        saved = {k: hit.get(k) for k in ("question", "similarity", "timestamp", "record")}
        update = {
            "reading": {"recalled": {**saved, "answer": hit.get("answer", ""), "sources": sources}},
            "passages": {s["id"]: _passage_record(s) for s in sources if s.get("id")},
            "stop_reason": "memory_hit",
        }
        return update, f"memory hit (similarity {hit.get('similarity', 0):.3f})"
    score = ctx.question_score(q.text) if q.kind == "fact_pattern" and not q.choices else None
    kept = {"score": score} if score is not None else {}  # the planner's off-topic check reads it
    if why := reading_moot(q, ctx, score):
        return {"reading": kept}, f"not classified: {why}"
    if (got := prompts.call(ctx.client, "classify", question=q.text).parsed) is not None:
        reading = {"legal": got.legal, "area": got.area, "topic": got.topic}
        return {"reading": {**kept, **reading}}, got.area if got.legal else "not law"
    update = {"reading": kept, "fallbacks": ["classifier: unparseable reply"]}
    return update, "unread (fallback: unparseable reply)"


def reading_moot(q: Question, ctx: AgentContext, score: float | None) -> str:
    """Why the classifier's reading could not change the run ("" when it could): it only decides
    :func:`off_topic`, which never declines a multiple-choice question, nor a fact pattern whose
    ``score`` reaches FIELD_EVIDENCE and LEAN_GATE."""
    if q.choices:
        return "a multiple-choice question is researched as asked"
    if q.kind != "fact_pattern" or score is None:
        return ""
    floor = max(FIELD_EVIDENCE, ctx.settings.agent.lean_gate)
    return f"its facts' closest passages score {score:.2f}, in scope" if score >= floor else ""


def linked_doctrines(ctx: AgentContext, question: str) -> list[str]:
    """The question's doctrines in the legal taxonomy, one per claim (none when linking fails)."""
    if ctx.link_issues is None:
        return []
    try:
        return ctx.link_issues(question) or []
    except Exception as exc:  # noqa: BLE001 - linking is an aid; the plan still runs
        logger.warning("doctrine linking failed: %s", exc)
        return []


CANDIDATE_PASSAGES = 4
"""Passages retrieved for the question as asked whose titles the planner sees as candidates:
with 8 the 1.5B picked from the end of a 12-name list (docs/MEASUREMENTS_HISTORY.md, stop 39)."""


def candidate_doctrines(
    ctx: AgentContext, question: str, within: str = ""
) -> tuple[list[str], str]:
    """Doctrine names the planner may pick from: the question's linked doctrines (first: the 1.5B
    picks the first ones), then the titles of its passages; and the title of the user's own
    document when the closest passage is one ("" else).  A question in one state's law (``within``,
    a USPS code) lists that state's titles only: general law finds nothing in a state's statute."""
    linked = [i for i in linked_doctrines(ctx, question) if i]
    titles, own = [], ""
    try:
        found = (
            ctx.search("hybrid", [question], CANDIDATE_PASSAGES, [], within)
            if within
            else ctx.retrieve([question], CANDIDATE_PASSAGES, [])
        )
        titles = [d.get("title") or "" for d in found]
        if found and (found[0].get("metadata") or {}).get("doc_id"):  # load_corpus.py docs
            own = " ".join(titles[0].split())
    except Exception as exc:  # noqa: BLE001 - candidates are an aid; the plan still runs
        logger.warning("candidate retrieval failed: %s", exc)
    out: dict[str, str] = {}  # one candidate per doctrine (doctrine_key)
    for name in (titles or linked) if within else linked + titles:
        if key := doctrine_key(name):
            out.setdefault(key, " ".join(name.split()))
    return list(out.values()), own


def off_topic(
    ctx: AgentContext,
    question: str,
    legal: bool = True,
    area: str = "",
    topic: str = "",
    law: StateLaw | None = None,
    score: float | None = None,
) -> str:
    """Why an open question is off topic as asked ("" when it is not), checked before any research
    (which can turn gibberish into a legal topic): not in English; of a field outside
    ``prompts.COVERED_AREAS`` with its closest passages below :data:`FIELD_EVIDENCE`; asking for a
    state's law no source holds; a rule question whose subject (``topic``) uses words no passage
    uses; every sentence's closest passages below LEAN_GATE (a fact pattern only when the classifier
    reads no question of law in it: lay words sit far from the rule's passages).  ``score``: the
    question's ``AgentContext.question_score`` when the classifier has it."""
    if not prompts.in_english(question):
        return f"{OFF_TOPIC}: it is not in English, the language of the sources; ask it in English"
    outside = legal and area not in ("", "none", *prompts.COVERED_AREAS)
    fielded = outside and not (ctx.holds_documents and ctx.holds_documents())
    if score is None and fielded:  # searched for at most once
        score = ctx.question_score(question)
    if fielded and score is not None and score < FIELD_EVIDENCE:
        return (
            f"{OFF_TOPIC}: it is a question of {area}, and its closest passages score "
            f"{score:.2f}; the sources cover {', '.join(prompts.COVERED_AREAS)}"
        )
    if law and not law.held:
        return (
            f"{OFF_TOPIC}: it asks what {law.name} law provides, and no source is {law.name} "
            "law (the sources state the general rules of US law)"
        )
    kind = question_mod.question_kind(question)
    if legal and kind == "fact_pattern":
        return ""
    rule_question = ctx.unknown_terms and kind == "rule_question"
    unknown = ctx.unknown_terms(question, topic or None) if rule_question else []
    if unknown:
        return f"{OFF_TOPIC}: no source uses the words {', '.join(unknown[:5])}"
    score = ctx.off_topic_score(question, score)
    if score is not None:
        return (
            f"{OFF_TOPIC}: {'' if legal else 'it asks no question of law, and '}the passages "
            f"closest to the question as asked score {score:.2f}, below LEAN_GATE "
            f"{ctx.settings.agent.lean_gate:.2f}"
        )
    return ""


def picked_issues(picks: list[int | str], candidates: list[str]) -> list[str]:
    """The agenda the plan call picked: a number is that candidate (with the other names it
    carries in parentheses, which become its queries); a name is kept as written, or as the
    candidate it names ("Offer" for "Offer (Firm offer (UCC 2-205))")."""
    by_name = {doctrine_key(c): c for c in candidates}
    out = []
    for pick in picks:
        text = " ".join(str(pick).split())
        if text.isdigit():
            if 1 <= int(text) <= len(candidates):
                out.append(candidates[int(text) - 1])
        elif text:  # a listed name is itself, even where a later one is of the same doctrine
            out.append(text if text in candidates else by_name.get(doctrine_key(text), text))
    return list(dict.fromkeys(out))


def last_turn(state: AgentState) -> Turn:
    """The thread's last question before this one (empty on a thread's first)."""
    return (state.get("turns") or [{}])[-1]


def thread_research(state: AgentState) -> dict[str, tuple[PlanStep, dict[str, dict]]]:
    """Per issue researched on the thread before this question: its latest completed step and
    that step's passages (a follow-up reuses them instead of searching again)."""
    out: dict[str, tuple[PlanStep, dict[str, dict]]] = {}
    for turn in state.get("turns") or []:
        kept = turn.get("passages") or {}
        for step in turn.get("steps") or []:
            ids = (step.get("execution") or {}).get("retrieved_doc_ids") or []
            out[step["issue"]] = (step, {i: kept[i] for i in ids if i in kept})
    return out


def plan_steps(state: AgentState, ctx: AgentContext, issues: list[str]) -> dict[str, Any]:
    """The planning table for ``issues``: an issue the thread researched keeps its completed step
    and passages; at most MAX_STEPS others get a pending step (the cap bounds new research, so an
    answer's "--issues" hint, its issues and one more, researches the one more)."""
    forced = ctx.settings.agent.search_strategy
    first = FIRST_SEARCH if forced == "auto" else forced
    facts = list(state["parsed"].facts)
    done = thread_research(state)
    steps: list[PlanStep] = []
    passages: dict[str, dict] = {}
    new = 0
    for issue in issues:
        n = len(steps) + 1
        if issue in done:
            step, found = done[issue]
            steps.append({**step, "step_id": n})
            passages.update(found)
        elif new < ctx.settings.agent.max_steps:
            new += 1
            steps.append(
                step_for(n, issue, answer_stage.issue_facts(issue, facts, ctx.embed), first)
            )
    update: dict[str, Any] = {"planning_table": steps, "reading": {"agenda": issues}}
    if passages:
        update["passages"] = {**(state.get("passages") or {}), **passages}
    return update


def user_agenda(
    names: Sequence[str], candidates: list[str], doctrine: Callable[[str], str | None] | None = None
) -> list[str]:
    """Issues the user named: each as the candidate it names, else as written (its parentheses
    are the user's words, not an agenda item's linked doctrines) with the taxonomy doctrine they
    name beside them, which its step searches too ("propensity (Character evidence)"; with gold
    issue names, 2 fewer tune patterns declined: docs/MEASUREMENTS.md, "Fact patterns")."""
    out = []
    for issue in picked_issues(list(names), candidates):
        if issue in candidates:
            out.append(issue)
            continue
        words = " ".join(re.sub(r"[()]", " ", issue).split())
        name = doctrine(words) if doctrine else None
        out.append(f"{words} ({name})" if name and name.lower() != words.lower() else words)
    return out


def _steps_decision(update: dict[str, Any], given: str = "") -> str:
    issues, steps = update["reading"]["agenda"], update["planning_table"]
    reused = sum(1 for s in steps if s.get("execution"))
    planned = {s["issue"] for s in steps}
    left = "; ".join(i for i in issues if i not in planned)
    return (
        f"{len(steps)} step(s){given}: {'; '.join(s['issue'] for s in steps)}"
        + (f" ({reused} researched on the thread before)" if reused else "")
        + (f" (not researched: {left})" if left else "")
    )


@_traced("planner")
def planner(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """The agenda: one step per issue, at most MAX_STEPS, from the question without its choices.  A
    follow-up that asks the thread's last question on changed facts keeps that question's agenda;
    any other lists the thread's issues first."""
    q, reading = state["parsed"], state.get("reading") or {}
    last = last_turn(state)
    kept = reading.get("follow_up") == "hypothetical" and not q.issues and last.get("issues")
    said = {k: reading[k] for k in ("legal", "area", "topic", "score") if k in reading}
    decline = "" if q.choices or kept else off_topic(ctx, q.text, law=q.law, **said)
    if decline:  # nothing to research: the answer stage declines and says why
        return {"reading": {"decline": decline}, "stop_reason": decline}, f"declined: {decline}"
    # A question that asks what a state's law provides, which the sources hold, is researched in
    # that state's law alone: the general rules beside it are not what it asks for.
    within = q.law.code if q.law and q.law.held and ctx.scoped else ""
    # the thread's issues first; a kept agenda searches for others only for the user to review
    found, own = (
        candidate_doctrines(ctx, q.text, within) if reading.get("review") or not kept else ([], "")
    )
    candidates = list(dict.fromkeys([*thread_research(state), *found]))
    if kept:
        issues = list(last["issues"])
    elif q.issues:  # the user's agenda
        issues = user_agenda(q.issues, candidates, ctx.doctrine_named)
    else:
        listed = "\n".join(f"{n}. {c}" for n, c in enumerate(candidates, 1)) or "(none)"
        result = prompts.call(ctx.client, "plan", objective=q.text, candidates=listed)
        issues = picked_issues(result.parsed.issues if result.parsed else [], candidates)
        # A question closest to the user's own document is researched in it first: the 1.5B
        # passed over a lease that settles a deposit question for the general rules.
        issues = list(dict.fromkeys([own, *issues] if own else issues))
    # no issue named: the linked doctrines are researched, else the question itself
    fallbacks = [] if issues else ["planner: no issues named (the linked doctrines are researched)"]
    if not issues and not (issues := linked_doctrines(ctx, q.text)):
        fallbacks.append("planner: no issues named or linked (the question itself is researched)")
        issues = [q.text]
    adaptive = ctx.settings.agent.research_policy == "adaptive" and not kept
    if not (kept or q.issues or adaptive):
        # The model's picks beyond MAX_STEPS are not its agenda: its fourth was a doctrine the
        # facts do not raise on 18 of the 19 fact patterns with one, and the answer had listed it
        # as "Not answered"; it stays a candidate the answer may name as not researched.
        issues = issues[: ctx.settings.agent.max_steps]
    update = plan_steps(state, ctx, issues[:1] if adaptive else issues)
    for step in update["planning_table"]:  # a document's title says nothing of what it holds
        if own and step["issue"] == own and not step.get("execution"):
            step["strategy"] = {**step["strategy"], "queries": [q.text], "document": True}
    update["reading"].update(candidates=candidates, **({"within": within} if within else {}))
    if kept:  # the CLI says so, and how to research another issue
        update["reading"]["agenda_kept"] = True
    if adaptive:  # the first step; the replanner picks the next from the findings
        update["reading"]["suggested"] = issues[1:]
        for step in update["planning_table"]:
            if not step.get("execution"):  # not one the thread researched before
                step["strategy"] = {**step["strategy"], "rewrite": True}
    if fallbacks:
        update["fallbacks"] = fallbacks
    given = ", set by the user" if q.issues else ", the thread's last agenda" if kept else ""
    return update, _steps_decision(update, given)


REVIEW_HOW = (
    "Press Enter to keep the agenda, or type the issues to research, separated by ';': a number "
    "from the lists above, or an issue in your own words (e.g. '1; 4; Conversion')."
)


def reviewed_agenda(
    reply: Any, listed: list[str], doctrine: Callable[[str], str | None] | None = None
) -> list[str]:
    """The agenda a plan review's ``reply`` sets ([]: keep it): issues separated by ';' (a string, a
    list, or {"issues": [...]}), each a number of ``listed`` or a name (:func:`user_agenda`)."""
    if isinstance(reply, dict):
        reply = reply.get("issues")
    items = reply.split(";") if isinstance(reply, str) else list(reply or [])
    return user_agenda([i for i in items if str(i).strip()], listed, doctrine)


@_traced("review")
def review(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Plan review (``--review``; LangGraph's ``interrupt``): the run pauses with the agenda and
    the other candidates, and goes on with the agenda the reply sets (``Command(resume=...)``)."""
    issues = planned(state)
    others = [c for c in _reading(state, "candidates") or [] if c not in issues]
    reply = interrupt({"agenda": issues, "candidates": others, "how": REVIEW_HOW})
    agenda = reviewed_agenda(reply, issues + others, ctx.doctrine_named)
    if not agenda or agenda == issues:
        return {}, "agenda kept by the user"
    update = plan_steps(state, ctx, agenda)
    update["reading"]["chosen"] = True  # the user's issues, applied as named ones
    decision = _steps_decision(update, ", reviewed by the user")
    update["planning_table"] = Overwrite(update["planning_table"])
    return update, decision


def _memory_entry(
    step: PlanStep, strategy: dict, docs: list[Passage], ctx: AgentContext, dead_ends: list[str]
) -> MemoryEntry:
    """The working memory's entry for an executed step: what it searched and what it found."""
    return {
        "step_id": step["step_id"],
        "query": (strategy.get("queries") or [step["question"]])[0],
        "strategy": strategy,
        "results": {
            "count": len(docs),
            "source_types": dict(Counter(ctx.source_type(d) for d in docs)),
            "titles": [d.get("title") or d["id"] for d in docs[:3]],
            "top_score": step["execution"]["evidence_score"],
            "confidence": step["execution"]["confidence"],
        },
        "leads": leads(step.get("issue") or "", docs),
        "dead_ends": dead_ends,
        "next_steps": [],
    }


LEADS = 3
"""Leads a step records: the titles of its passages on other doctrines than its issue's."""


def leads(issue: str, docs: Sequence[Passage]) -> list[str]:
    """The doctrines a step's passages point to beyond its issue: their titles, when a title names
    another doctrine (:func:`doctrine_key`), the first :data:`LEADS`."""
    own = {doctrine_key(n) for n in issue_names(issue)}
    titles = (" ".join((d.get("title") or "").split()) for d in docs)
    return list(dict.fromkeys(t for t in titles if t and doctrine_key(t) not in own))[:LEADS]


def _rewritten(
    state: AgentState, ctx: AgentContext, step: PlanStep
) -> tuple[list[str], list[str], list[str]]:
    """An adaptive step's own queries (the ``rewrite`` call; a retry has none), the passages earlier
    steps used (excluded from its search), and a fallback note for an unusable reply."""
    if ctx.settings.agent.research_policy != "adaptive":
        return [], [], []
    used = [i for s in _executed(state) for i in s["execution"].get("retrieved_doc_ids") or []]
    if not (step.get("strategy") or {}).get("rewrite"):  # a retry: another search type
        return [], used, []
    result = prompts.call(ctx.client, "rewrite", question=step["question"])
    if result.parsed is None:
        return [], used, ["executor: unparseable rewrite (the issue's names and facts searched)"]
    written = [result.parsed.primary, *result.parsed.alternatives[:2]]
    return [" ".join(w.split()) for w in written if w.strip()], used, []


@_traced("executor")
def executor(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Run ONE pending step, without a model call: search, drop passages that carry instructions,
    then gate: the best cosine of the issue's question to a passage, against LEAN_GATE."""
    table = state.get("planning_table") or []
    pending = [s for s in table if s["status"] == "pending" and not s["execution"]]
    if not pending:
        return {}, "nothing pending"
    step = dict(pending[0])
    strategy = dict(step.get("strategy") or {})
    search_type = strategy.get("search_type") or FIRST_SEARCH
    k = ctx.settings.agent.retrieval_k
    written, exclude, fallbacks = _rewritten(state, ctx, step)
    queries = [*written, *(strategy.get("queries") or [step["question"]])]
    # A few extra candidates replace passages the injection screen drops, so a planted passage
    # changes neither how many passages the step reads nor which.
    within = _reading(state, "within") or ""
    retrieved = ctx.search(search_type, queries, k + ctx.flag_headroom, exclude, within)
    docs, flagged = ctx.keep_clean(retrieved, k)
    # the gate reads the question a document is searched for: its title says nothing of what it
    # holds ("What are the rule and elements of STATE v. PRUITT?" scored its passages 0.30)
    if strategy.get("document"):
        asked = strategy["queries"][0]
    else:
        asked = issue_question(issue_names(step.get("issue") or step["question"])[0])
    scores = ctx.gate_scores(asked, docs, queries)  # the search's cosines when it searched asked
    score, confidence = scores.evidence, scores.confidence
    gated = not docs or ctx.below_gate(score)
    execution: Execution = {
        "retrieved_doc_ids": [d["id"] for d in docs],
        "confidence": round(confidence, 4),
        "evidence_score": round(score, 4),
        "gated": gated,
        "flagged_passages": flagged,
    }
    if written:
        execution.update(optimized_query=written[0], alternatives=written[1:])
    step["execution"] = execution
    passages = {**(state.get("passages") or {}), **{d["id"]: _passage_record(d) for d in docs}}
    dead_ends = []
    if not docs:
        dead_ends.append("no results" if not retrieved else "every passage was flagged")
    elif gated:
        dead_ends.append(f"evidence score {score:.2f} below LEAN_GATE")
    entry = _memory_entry(step, {**strategy, "executed_as": search_type}, docs, ctx, dead_ends)
    update: dict[str, Any] = {
        "planning_table": [step],
        "passages": passages,
        "chain_of_thought": [*(state.get("chain_of_thought") or []), entry],
    }
    if fallbacks:
        update["fallbacks"] = fallbacks
    seen = {f["id"] for f in state.get("flagged_passages") or []}
    if new := [f for f in flagged if f["id"] not in seen]:  # each passage once, however often found
        update["flagged_passages"] = new
    note = f", {len(flagged)} flagged passage(s) dropped" if flagged else ""
    gate = ", below the evidence gate" if gated else ""
    return update, (
        f"step {step['step_id']} [{search_type}] {_short(step.get('issue') or '', 40)}: "
        f"{len(docs)} passages, evidence {score:.3f}{gate}{note}"
    )


def memory_lines(state: AgentState) -> str:
    """The working memory, one compact line per iteration (the CLI's view)."""
    lines = []
    for e in state.get("chain_of_thought") or []:
        r, s = e["results"], e["strategy"]
        parts = [
            f"- step {e['step_id']} [{s.get('executed_as', s.get('search_type', '?'))}] "
            f"{_short(e['query'], 70)!r}: {r['count']} passages, evidence {r['top_score']:.2f}",
            f"top: {'; '.join(_short(t, 40) for t in r['titles'])}" if r.get("titles") else "",
            f"dead ends: {'; '.join(e['dead_ends']) or 'none'}",
            f"next: {'; '.join(e['next_steps'])}" if e["next_steps"] else "",
        ]
        lines.append("; ".join(p for p in parts if p))
    return "\n".join(lines)


AnswerRoute = Literal["executor", "replanner", "answer"]


def answer_mode(state: AgentState, ctx: AgentContext) -> str:
    """research, evidence or lean: the run's input may choose, else ANSWER_MODE; auto is lean for
    a multiple-choice question and research for any other, or for one whose issues the user set
    (lean does no research: a user's ``--issues`` on a multiple-choice question went unread)."""
    mode = _reading(state, "mode") or state.get("answer_mode") or ctx.settings.agent.answer_mode
    if mode == "auto":  # chosen by measurement: README, "Which mode answers which question"
        q = state["parsed"]
        return "lean" if q.choices and not q.issues else "research"
    return mode


def make_evaluator(forced_mode: str | None = None) -> Callable:
    """The evaluator node; ``forced_mode`` fixes the answer mode (langgraph.json's "evidence")."""

    @_traced("evaluator")
    def evaluator(state: AgentState, ctx: AgentContext) -> tuple[dict, str, AnswerRoute]:
        """Grade the executed step (completed: its passages passed the evidence gate) and route:
        its other angle (replanner) when it failed, the next pending step, or the answer."""
        graded: list[PlanStep] = []
        for step in state.get("planning_table") or []:
            if step["status"] == "pending" and step["execution"]:
                ok = not step["execution"].get("gated")
                graded.append({**step, "status": "completed" if ok else "failed"})
        table = merge_steps(state.get("planning_table"), graded)
        cap = ctx.settings.agent.max_iterations
        pending = [p for p in table if p["status"] == "pending" and not p["execution"]]
        failed = [p for p in graded if p["status"] == "failed" and p.get("phase") != "retry"]
        left = ctx.time_left()
        adaptive = ctx.settings.agent.research_policy == "adaptive"
        stop = None
        route: AnswerRoute
        if left is not None and left < MC_RESERVE_S:
            route, stop = "answer", f"deadline: {max(left, 0):.0f}s of RUN_TIMEOUT left"
        elif len(_executed(state)) >= cap and (pending or failed or adaptive):
            route, stop = "answer", f"iteration limit {cap} reached"
        elif failed and not any(  # its other angle is not planned yet
            s.get("issue") == failed[0].get("issue") and s["step_id"] > failed[0]["step_id"]
            for s in table
        ):
            route = "replanner"
        elif graded and not pending and adaptive:
            route = "replanner"  # the model picks the next step from the findings
        elif pending:
            route = "executor"
        else:
            route = "answer"
        update: dict[str, Any] = {"planning_table": graded}
        if forced_mode:  # the evidence graph of langgraph.json
            update["reading"] = {"mode": forced_mode}
        if stop:
            update["stop_reason"] = stop
        grades = ", ".join(f"step {g['step_id']} {g['status']}" for g in graded) or "no new step"
        return update, grades + (f" ({stop})" if stop else "") + f" -> {route}", route

    return evaluator


def _retry(state: AgentState, ctx: AgentContext, step: PlanStep) -> tuple[PlanStep, str]:
    """``step``'s other angle: its issue searched by BM25 over its facts and names
    (:data:`RETRY_SEARCH`), or dense search when BM25 was the first angle."""
    first = (step.get("strategy") or {}).get("search_type")
    search_type = "dense" if first == RETRY_SEARCH else RETRY_SEARCH
    if ctx.settings.agent.search_strategy != "auto":
        search_type = ctx.settings.agent.search_strategy
    facts = list(step.get("facts") or [])
    retry = step_for(_next_id(state), step["issue"], facts, search_type, "retry")
    names = issue_names(step["issue"])
    retry["strategy"]["queries"] = [" ".join([*names, *facts]), *names]
    return retry, search_type


def _next_id(state: AgentState) -> int:
    return max(s["step_id"] for s in state["planning_table"]) + 1


def _noted(state: AgentState, move: str) -> list[MemoryEntry]:
    """The working memory with ``move`` as the last entry's next step."""
    memory = [dict(e) for e in state.get("chain_of_thought") or []]
    if memory:
        memory[-1]["next_steps"] = [move]
    return memory  # type: ignore[return-value]


@_traced("replanner")
def replanner(state: AgentState, ctx: AgentContext) -> tuple[dict, str, str]:
    """The next step: a failed step's other angle (:func:`_retry`), decided in code (a step fails on
    its passages, not its wording); the adaptive policy's is the model's (:func:`adaptive_move`)."""
    if ctx.settings.agent.research_policy == "adaptive":
        return adaptive_move(state, ctx)
    table = state.get("planning_table") or []
    failed = [s for s in table if s["status"] == "failed" and s.get("phase") != "retry"]
    retry, search_type = _retry(state, ctx, failed[-1])
    memory = _noted(state, f"retry [{search_type}]: {retry['issue']}")
    decision = f"retry step {failed[-1]['step_id']} as step {retry['step_id']} [{search_type}]"
    return {"planning_table": [retry], "chain_of_thought": memory}, decision, "executor"


def adaptive_move(state: AgentState, ctx: AgentContext) -> tuple[dict, str, str]:
    """The adaptive policy's next move: the ``replan`` call reads the findings and answers
    next_step (the planner's other picks, then the leads), retry or complete; an unusable reply
    takes the agenda's next issue.  Caps: MAX_STEPS issues, one retry per issue."""
    q, reading = state["parsed"], state.get("reading") or {}
    issues, done = planned(state), _executed(state)
    memory = list(state.get("chain_of_thought") or [])
    leads = [lead for e in memory for lead in e.get("leads") or []]
    candidates = [
        c for c in dict.fromkeys([*reading.get("suggested", []), *leads]) if c not in issues
    ]
    listed = "\n".join(f"{n}. {c}" for n, c in enumerate(candidates, 1)) or "(none)"
    findings = "\n".join(  # the research so far, one line per step
        f"- {s.get('issue') or ''}: evidence {e['results']['top_score']:.2f}; found: "
        f"{'; '.join(e['results'].get('titles') or []) or 'nothing'}; leads: "
        f"{'; '.join(e['leads']) or 'none'}; dead ends: {'; '.join(e['dead_ends']) or 'none'}"
        for e, s in zip(memory, done, strict=False)
    )
    result = prompts.call(
        ctx.client, "replan", objective=q.text, findings=findings or "(none)", candidates=listed
    )
    move, update = result.parsed, {}
    if move is None:  # the agenda's next issue, as the agenda policy would research it
        update["fallbacks"] = ["replanner: unparseable reply (the agenda's next issue)"]
        move = prompts.Replan(action="next_step" if candidates else "complete", issue=1)
    last = done[-1]
    retried = any(s.get("phase") == "retry" and s.get("issue") == last["issue"] for s in done)
    if move.action == "retry" and not retried:  # one other angle per issue
        retry, search_type = _retry(state, ctx, last)
        note = f"retry [{search_type}]: {last['issue']} ({move.why})"
        update.update(planning_table=[retry], chain_of_thought=_noted(state, note))
        return update, f"retry {last['issue']} as step {retry['step_id']}: {move.why}", "executor"
    picked = picked_issues([move.issue], candidates) if move.action == "next_step" else []
    cap = ctx.settings.agent.max_steps
    if not picked or picked[0] in issues or len(issues) >= cap:
        why = move.why if move.action == "complete" else f"{move.action} {move.issue!r} not taken"
        if move.action == "next_step" and len(issues) >= cap:
            why += f" (MAX_STEPS {cap} reached)"
        update["chain_of_thought"] = _noted(state, f"complete ({why})")
        return update, f"complete: {why}", "answer"
    issue = picked[0]
    step = step_for(_next_id(state), issue, answer_stage.issue_facts(issue, q.facts, ctx.embed))
    step["strategy"]["rewrite"] = True
    update.update(
        planning_table=[step],
        reading={"agenda": [*issues, issue]},
        chain_of_thought=_noted(state, f"next_step: {issue} ({move.why})"),
    )
    return update, f"next step {step['step_id']}: {issue} ({move.why})", "executor"


def issue_research(state: AgentState, why_not: str) -> list[answer_stage.IssueResearch]:
    """Per agenda issue, the passages of its completed steps (none when every angle missed the
    evidence gate), or not researched."""
    passages = state.get("passages") or {}
    chosen = bool(state["parsed"].issues or _reading(state, "chosen"))
    out = []
    for issue in planned(state):
        steps = [s for s in _executed(state) if s.get("issue") == issue]
        done = [s for s in steps if s["status"] == "completed"]
        if done:  # an adaptive retry of a completed step adds its passages to the first's
            ids = [i for s in done for i in s["execution"].get("retrieved_doc_ids") or []]
            docs = [passages[i] for i in dict.fromkeys(ids) if i in passages]
            facts = done[-1].get("facts")
            out.append(answer_stage.IssueResearch(issue, docs, facts=facts, chosen=chosen))
        elif steps:
            best = max(float(s["execution"].get("evidence_score") or 0) for s in steps)
            why = f"best evidence score {best:.2f}, below LEAN_GATE"
            out.append(answer_stage.IssueResearch(issue, [], why=why))
        else:
            out.append(answer_stage.IssueResearch(issue, [], researched=False, why=why_not))
    return out


@_traced("answer")
def answer_node(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """The typed answer record (``answer.build_record``) from each issue's research, or an
    abstention that says why: never because one step failed."""
    q = state["parsed"]
    if recalled(state):
        return {"answer": memory_record(state).to_dict()}, "memory hit"
    if answer_mode(state, ctx) == "lean":  # zero research steps: the letter reads lean's search
        record = answer_stage.AnswerRecord(q.kind, "", [], [], False, "lean mode: no research")
        return {"answer": record.to_dict()}, "lean: no research steps"
    stop = state.get("stop_reason") or ""
    # a follow-up's thread: each issue's application in the last answer on it
    last = (last_turn(state).get("answer") or {}) if _reading(state, "follow_up") else {}
    record = answer_stage.build_record(
        ctx.client,
        q,
        issue_research(state, stop or f"MAX_STEPS {ctx.settings.agent.max_steps} reached"),
        ctx.embed,
        decline=_reading(state, "decline") or "",
        policy="evidence" if answer_mode(state, ctx) == "evidence" else "research",
        verdict_support=ctx.verdict_support(),
        earlier={i["issue"]: i["checks"] for i in last.get("issues") or [] if i.get("checks")},
    )
    if not record.abstained:
        record.others = passed_over(state, ctx, record.quoted_doctrines)
    update: dict[str, Any] = {"answer": record.to_dict()}
    if stop:
        update["stop_reason"] = stop
    if record.abstained:
        return update, f"abstained: {_short(record.why, 100)}"
    n = sum(1 for i in record.issues if i.status == "answered" and i.issue != "Bottom line")
    verdict = f", bottom line {record.verdict}" if record.verdict else ""
    return update, f"{n} issue(s) answered, {len(record.citations)} citation(s){verdict}"


def memory_record(state: AgentState) -> answer_stage.AnswerRecord:
    """The record of a QA-memory hit: the saved record (its letter, if any, picked anew), or for
    an entry saved with none, the cached text and its cited passages."""
    hit = recalled(state)
    if saved := hit.get("record"):
        record = TypeAdapter(answer_stage.AnswerRecord).validate_python(saved)
        return dataclasses.replace(record, letter=None, mc=None, lean=None)
    citations = [
        answer_stage.Citation(
            n, s["id"], s.get("title") or "", s.get("support") or "", s.get("pin") or ""
        )
        for n, s in enumerate(hit.get("sources") or [], 1)
    ]
    text, kind = hit.get("answer") or "", state["parsed"].kind
    return answer_stage.AnswerRecord(kind, text, [], citations, abstained=False, grounded=True)


def mc_evidence(state: AgentState, extra: list[Passage]) -> tuple[list[dict], str | None]:
    """The passages the MC prompt reads and their evidence block (None: no passage): lean's
    retrieval (``extra``), or when it found nothing, the passages the answer (or a cached one)
    cites.  The research's passages beside lean's lost: with 2 of them the letter was right 12
    times of 40 against lean's 14 (docs/MEASUREMENTS_HISTORY.md, stop 30)."""
    record = state.get("answer") or {}
    passages = state.get("passages") or {}
    cited = [c["passage_id"] for c in record.get("citations") or []] or list(passages)
    shown = extra or [passages[i] for i in dict.fromkeys(cited) if i in passages]
    return shown, prompts.format_evidence(shown) or None


LEAN_REASONING = "The model's reasoning, in its own words (not checked against the passages):"
"""The heading of a lean answer's reply: it cites no passage, so no sentence of it is offered as a
rule a reader can check (a user's trial showed an invented "Rule:" line)."""
CLOSED_BOOK_NOTE = (
    "[Closed-book: no passage supports this letter; it is the model's own answer, "
    "not grounded in the sources.]"
)


@_traced("mc_select")
def mc_select(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """The letter of a multiple-choice question, from the answer and its passages plus lean's
    retrieval when it passes LEAN_GATE: the agent never reads less than lean mode does."""
    q = state["parsed"]
    if not (choices := q.choices):
        return {}, "no choices: pass through"
    extra: list[Passage] = []
    lean: dict[str, Any] = {}
    try:
        docs, flagged, score = ctx.lean_evidence(q.text, choices)
        extra = [] if ctx.below_gate(score) else docs
        lean = {
            "route": "rag" if extra else "closed_book",
            "evidence_score": round(score, 4),
            "gate": ctx.settings.agent.lean_gate,
            "evidence_ids": [d["id"] for d in extra],
            "retrieved_ids": [d["id"] for d in docs],
            "flagged_passages": flagged,
        }
    except Exception as exc:  # noqa: BLE001 - the research's own evidence still stands
        logger.warning("lean retrieval for the letter failed: %s", exc)
    shown, evidence_text = mc_evidence(state, extra)
    result = mc.select_answer(ctx.client, q.text, choices, evidence_text)
    record = dict(state.get("answer") or {})
    line = mc.answer_line(result.letter, choices)
    if evidence_text is None and result.letter:
        line = f"{line}\n{CLOSED_BOOK_NOTE}"
    body = "" if record.get("abstained") else (record.get("text") or "")
    if answer_mode(state, ctx) == "lean" and lean:
        read = "; ".join(f"[{n}] {d.get('title') or d['id']}" for n, d in enumerate(extra, 1))
        how = (
            f"evidence score {lean['evidence_score']:.3f} ≥ LEAN_GATE {lean['gate']}: answered "
            f"with {len(extra)} passages: {read}"
            if extra
            else f"evidence score {lean['evidence_score']:.3f} < LEAN_GATE {lean['gate']}: "
            "answered closed-book (the passages were not shown; --issues 'A; B' researches "
            "the doctrines you name, then picks the letter from what they find)"
        )
        # The reply's reasoning cites nothing: it is shown as the model's, not as the law.
        said = mc.reasoning(result.text)
        body = f"{LEAN_REASONING}\n{said}\n\n" if said else ""
        body += f"[lean mode: {how}]"
    final = f"{body}\n\n{line}".strip()
    mc_answer = {
        **result.to_dict(),
        "closed_book": evidence_text is None,
        "evidence_ids": [d["id"] for d in shown] if evidence_text else [],
        "text": final,  # what the CLI prints: the answer's text, then the letter
    }
    record.update(letter=result.letter, mc=mc_answer, lean=lean)
    if answer_mode(state, ctx) == "lean" and not result.letter:  # lean's answer is its letter
        record.update(abstained=True, why="the model named no letter")
    retried = " after strict retry" if result.retried else ""
    closed = ", closed-book" if evidence_text is None else ""
    return {"answer": record}, f"({result.letter}) via {result.strategy}{retried}{closed}"


ROUTINE_GUARDS = frozenset(
    {"off_doctrine", "off_facts", "not_asked", "named_issue", "defined_term", "case_narrative"}
)
"""Guards that sort the research (a passage or an issue set aside) rather than repair a reply:
an answer where they fired may still be cached."""


@_traced("memory_writeback")
def memory_writeback(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """Cache the answer (never the MC selection) when it is trustworthy and new."""
    why: list[str] = []  # why it must not be cached; the first is the decision
    record, passages = state.get("answer") or {}, state.get("passages") or {}
    if _reading(state, "follow_up"):
        why.append("a follow-up: its facts are its thread's")
    if recalled(state):
        why.append("answer came from memory")
    if answer_mode(state, ctx) == "evidence":
        why.append("evidence-mode answers are not cached")
    if not record or record.get("abstained") or not record.get("text"):
        why.append("no answer")
    elif not record.get("grounded"):
        letter = record.get("letter")
        why.append("a letter whose reasoning cites no source" if letter else "an uncited sentence")
    guards = record.get("guards") or {}
    if fired := [k for k, v in guards.items() if v and k not in ROUTINE_GUARDS]:
        why.append(f"guard fired: {fired[0]}")
    records = ctx.client.records[ctx.record_offset :]
    if n := sum(1 for r in records if r.parse_failed):
        why.append(f"{n} unparsed LLM repl{'y' if n == 1 else 'ies'}")
    if n := sum(1 for r in records if r.error):
        why.append(f"{n} failed LLM call(s)")
    if state.get("fallbacks"):
        why.append(f"fallback: {state['fallbacks'][0]}")
    if why:
        return {}, f"skip: {why[0]}"
    sources = [  # the passages the answer cites, with the sentence each is cited for
        {
            **passages.get(c["passage_id"], {}),
            **dict(id=c["passage_id"], title=c["title"], support=c["support"], pin=c["pin"]),
            "ref": f"[{c['n']}]",
        }
        for c in record.get("citations") or []
    ]
    table = state.get("planning_table") or []
    confs = [s["execution"]["confidence"] for s in table if s["status"] == "completed"]
    confidence = sum(confs) / len(confs) if confs else 0.0
    try:
        ctx.write_memory(state["parsed"].text, record, confidence, sources)
    except Exception as exc:  # noqa: BLE001 - caching is best effort
        logger.warning("QA memory write failed: %s", exc)
        return {}, f"skip: write failed ({exc})"
    return {}, f"stored (confidence {confidence:.3f})"


def worst_case_calls(settings: Any) -> int:
    """The most LLM calls one question can take: classify and plan; per researched issue one
    application (and one grounding-gate call in evidence mode); the bottom line; MC, its retry."""
    per_issue = 2 if settings.agent.answer_mode == "evidence" else 1
    return 2 + per_issue * settings.agent.max_steps + 1 + 2


def compute_metrics(state: AgentState, ctx: AgentContext) -> dict[str, Any]:
    table = state.get("planning_table") or []
    per_node: dict[str, float] = {}
    for ev in state.get("trace") or []:
        per_node[ev["node"]] = round(per_node.get(ev["node"], 0.0) + ev["seconds"], 3)
    record = state.get("answer") or {}
    mc_answer = record.get("mc") or {}
    reading = state.get("reading") or {}
    issues = record.get("issues") or []
    sentences = [s for i in issues for s in i.get("sentences") or []]
    answered = sum(1 for i in issues if i.get("status") == "answered")
    return {
        **ctx.client.summary(since=ctx.record_offset),
        "node_latency_s": per_node,
        "total_node_s": round(sum(per_node.values()), 3),
        "iterations": len(_executed(state)),
        "steps_completed": sum(1 for s in table if s["status"] == "completed"),
        "steps_failed": sum(1 for s in table if s["status"] == "failed"),
        "answer_kind": record.get("kind"),
        "memory_hit": bool(recalled(state)),
        "follow_up": reading.get("follow_up"),
        "applications_reused": len(record.get("reused") or []),
        "abstained": bool(record.get("abstained")),
        "verdict": record.get("verdict"),
        "issues_answered": answered,
        "issues_not_answered": len(issues) - answered,
        "citations": len(record.get("citations") or []),
        "uncited_sentences": sum(1 for s in sentences if not s.get("cites")),
        "guards": dict(record.get("guards") or {}),
        "injection_verdict": (reading.get("injection") or {}).get("verdict"),
        "injection_check": (reading.get("injection") or {}).get("injection_check"),
        "stop_reason": state.get("stop_reason"),
        "flagged_passages": len(state.get("flagged_passages") or []),
        "fallbacks": list(state.get("fallbacks") or []),
        "mc_letter": mc_answer.get("letter"),
        "mc_parse_failed": bool(mc_answer.get("parse_failed")) if mc_answer else None,
        "mc_closed_book": bool(mc_answer.get("closed_book")) if mc_answer else None,
    }


@_traced("observability")
def observability(state: AgentState, ctx: AgentContext) -> tuple[dict, str]:
    """The run's metrics, and what its thread keeps of the question for follow-ups (``turns``)."""
    metrics = compute_metrics(state, ctx)
    logger.info("run metrics: %s", metrics)
    q, passages = state["parsed"], state.get("passages") or {}
    steps = [s for s in state.get("planning_table") or [] if s["status"] == "completed"]
    ids = {i for s in steps for i in s["execution"].get("retrieved_doc_ids") or []}
    turn: Turn = {
        "question": state["question"],
        "facts": list(q.facts),
        "asked": q.asked,
        "reading": _classified(state.get("reading") or {}),
        "issues": planned(state),
        "steps": steps,
        "passages": {i: passages[i] for i in ids if i in passages},
        "answer": state.get("answer") or {},
    }
    return (
        {"run_metrics": metrics, "turns": [turn]},
        f"{metrics['llm_calls']} LLM calls, {metrics['steps_completed']} completed / "
        f"{metrics['steps_failed']} failed steps",
    )


def route_after_injection(state: AgentState) -> Literal["classifier", "answer", "observability"]:
    """A rejected input ends the run; lean mode answers with zero research steps."""
    if not (_reading(state, "injection") or {}).get("is_safe"):
        return "observability"
    return "answer" if _reading(state, "mode") == "lean" else "classifier"


def route_after_classifier(state: AgentState) -> Literal["planner", "answer"]:
    """A question the QA memory answered is not planned."""
    return "answer" if recalled(state) else "planner"


def route_after_planner(state: AgentState) -> Literal["review", "executor", "answer"]:
    """A question declined as off topic skips the research; a plan review pauses first."""
    if _reading(state, "decline"):
        return "answer"
    return "review" if _reading(state, "review") else "executor"
