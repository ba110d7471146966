"""Trace the agent on a few questions, node by node, to see where it helps and where it fails.

Each question runs through the agent's graph (``main.run_agent``; the QA memory neither read nor
written).  The case study holds each node's trace event, each research step's search type,
queries, passages and evidence score, lean's retrieval for a multiple-choice letter, and the
answer record."""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import answer as answer_stage
import eval_common as ec
import load_corpus
import main as agent
import nodes
import rag_utils
from llm_config import LLMClient
from settings import Settings, run_script

logger = logging.getLogger(__name__)

DEFAULT_N = 3
"""QA items traced from --qa when N is not given."""
CASE_DIR = "case_studies"
TRACE_QUESTIONS = Path(__file__).resolve().parent / "datasets" / "trace_questions.jsonl"
TRACE_KINDS = ("mc", "multi_hop", "out_of_corpus")


def load_trace_questions(path: str | Path = TRACE_QUESTIONS) -> list[dict]:
    """The built-in trace questions: JSONL rows with ``idx``, ``kind`` (mc | multi_hop |
    out_of_corpus), ``question``, ``subject``, ``gold_idx`` (';'-separated, optional) and, for
    ``mc``, ``choice_a..choice_d`` and ``answer``.  Raises ValueError naming a bad row."""
    rows = []
    for n, row in load_corpus.iter_rows(path):
        kind = row.get("kind")
        if kind not in TRACE_KINDS or not str(row.get("question") or "").strip():
            raise ValueError(f"{path}:{n}: needs a question and a kind in {TRACE_KINDS}")
        has_choices = all(ec.item_choices(row).values())
        if (kind == "mc") != has_choices or (kind == "mc" and not ec.item_answer(row)):
            raise ValueError(f"{path}:{n}: an mc row (only) has four choices and an answer")
        rows.append(row)
    return rows


def _passage_row(rank: int, pid: str, passages: dict[str, dict], gold: Sequence[str]) -> dict:
    """One passage a step (or lean's retrieval) read, as the run recorded it."""
    p = passages.get(pid) or {}
    return {
        "rank": rank,
        "id": pid,
        "title": p.get("title") or "",
        "source": p.get("source") or "",
        "gold": pid in gold,
        "preview": ec.preview(p.get("text"), 200),
    }


def _step_rows(state: dict, gold: Sequence[str]) -> list[dict]:
    """The research steps (``state.PlanStep``) as they ran: the issue, the search, the passages kept
    (best first), the evidence score; a step never reached has no passages and no score."""
    passages = state.get("passages") or {}
    memory = {e["step_id"]: e for e in state.get("chain_of_thought") or []}
    rows = []
    for step in state.get("planning_table") or []:
        ex = step.get("execution") or {}
        strategy = step.get("strategy") or {}
        ids = ex.get("retrieved_doc_ids") or []
        entry = memory.get(step.get("step_id")) or {}
        rows.append(
            {
                **{k: step.get(k) for k in ("step_id", "phase", "issue", "question", "status")},
                "facts": step.get("facts") or [],
                "search_type": strategy.get("search_type"),
                "queries": strategy.get("queries") or [],
                # an adaptive step's own queries (the rewrite), searched with the others, pooled
                "rewritten": [
                    q for q in [ex.get("optimized_query"), *(ex.get("alternatives") or [])] if q
                ],
                "leads": entry.get("leads") or [],
                "next_steps": entry.get("next_steps") or [],
                "ran": bool(ex),
                "passages": [_passage_row(i, pid, passages, gold) for i, pid in enumerate(ids, 1)],
                "evidence_score": ex.get("evidence_score"),
                "confidence": ex.get("confidence"),
                "gated": ex.get("gated"),
                "flagged_passages": ex.get("flagged_passages") or [],
            }
        )
    return rows


def _lean_row(state: dict, gold: Sequence[str], settings: Settings) -> dict | None:
    """Lean's retrieval for the letter (the question with its choices) as ``mc_select`` recorded
    it: route, evidence score against the gate, the passages retrieved and those the letter read."""
    lean = (state.get("answer") or {}).get("lean") or {}
    if not lean:
        return None
    ids = lean.get("retrieved_ids") or []
    known = state.get("passages") or {}
    passages = {**known, **ec.fetch_passages([i for i in ids if i not in known], settings)}
    used = set(lean.get("evidence_ids") or [])
    return {
        **{k: lean.get(k) for k in ("route", "evidence_score", "gate")},
        "passages": [
            {**_passage_row(i, pid, passages, gold), "read_by_letter": pid in used}
            for i, pid in enumerate(ids, 1)
        ],
        "flagged_passages": lean.get("flagged_passages") or [],
    }


def _print_passages(out: Callable[[str], None], rows: Sequence[dict]) -> None:
    for r in rows:
        mark = "★" if r["gold"] else " "
        out(f"      {mark} {r['rank']}. {r['id']} — {ec.preview(r['title'] or r['preview'], 70)}")


def _print_steps(out: Callable[[str], None], steps: Sequence[dict], gate: float) -> None:
    out("research steps (executor: search, injection screen, evidence gate):")
    if not steps:
        out("  (none: the question was answered or declined before research)")
    for s in steps:
        head = f"  step {s['step_id']} [{s['search_type']}] {s['issue']} ({s['phase']})"
        if not s["ran"]:
            out(f"{head}: not run ({s['status']})")
            continue
        below = " — below the gate" if s["gated"] else ""
        out(
            f"{head}: {s['status']}, evidence {ec.fmt_num(s['evidence_score'])} (gate {gate}){below}"
        )
        for label, key in (("query (rewritten)", "rewritten"), ("query", "queries")):
            for q in s[key]:
                out(f"      {label}: {ec.preview(q, 110)}")
        _print_passages(out, s["passages"])
        if s["leads"]:
            out(f"      leads: {'; '.join(s['leads'])}")
        for move in s["next_steps"]:
            out(f"      next: {ec.preview(move, 110)}")
        for f in s["flagged_passages"]:
            out(f"      dropped by the injection screen: {f.get('id')}")


def _print_answer(out: Callable[[str], None], record: dict) -> None:
    """Per issue its status, outcome and sentences by role; the bottom line; the guards fired."""
    out("answer stage (per issue: rule, application, conclusion):")
    for issue in record.get("issues") or []:
        roles = Counter(s["role"] for s in issue.get("sentences") or [])
        counts = ", ".join(
            f"{roles[r]} {r}" for r in ("rule", "application", "conclusion") if roles[r]
        )
        outcome = f", outcome {issue['outcome']}" if issue.get("outcome") else ""
        out(f"  {issue['issue']}: {issue['status']}{outcome}" + (f" ({counts})" if counts else ""))
    for issue in record.get("issues") or []:
        for s in issue.get("sentences") or []:
            if s["role"] == "bottom_line":
                out(f"  bottom line: {ec.preview(s['text'], 200)}")
    if record.get("abstained"):
        out(f"  abstained: {ec.preview(record.get('why'), 200)}")
    if guards := {k: v for k, v in (record.get("guards") or {}).items() if v}:
        out("  guards fired: " + ", ".join(f"{k} {v}" for k, v in guards.items()))


def trace_query(
    query: str,
    *,
    item: dict | None = None,
    settings: Settings,
    llm_factory: ec.LLMFactory = None,
    out: Callable[[str], None] = print,
    position: str = "",
) -> dict:
    """Run the agent's graph on one query (a QA item when ``item`` is given), print each node as
    it finishes, then what each research step searched and found and what the answer stage wrote;
    return the case study."""
    gold = ec.gold_ids(item) if item else []
    choices = ec.item_choices(item) if item and all(ec.item_choices(item).values()) else None
    case: dict[str, Any] = {
        "query": query,
        "item": ec.item_id(item) if item else None,
        "kind": (item.get("kind") or "mc") if item else "query",  # a QA file's items are MC
        "gold": gold,
        **({"subject": ec.item_subject(item)} if item else {}),
        **({"choices": choices, "answer": ec.item_answer(item)} if choices else {}),
    }

    out("=" * 100)
    label = f" [{case['item']}]" if item else ""
    out(f"{position}QUERY{label}: {ec.preview(query, 300)}")
    if gold:
        out(f"gold passage(s): {', '.join(gold)}")

    client = LLMClient(settings, llm_factory=llm_factory)
    events: list[dict] = []

    def on_event(event: dict) -> None:  # {node, decision, seconds, t_s}
        events.append(event)
        decision = ec.preview(event["decision"], 150)
        out(f"  [{event['t_s']:7.2f}s] {event['node']}: {decision} ({event['seconds']:.1f}s)")

    out("agent trace (one line per node):")
    context = ec.agent_context(settings, client)
    t0 = time.perf_counter()
    state = agent.run_agent(query, choices, context=context, on_event=on_event)
    agent_s = time.perf_counter() - t0
    usage = ec.usage_of(client)
    steps = _step_rows(state, gold)
    record = state.get("answer") or {}
    reading = state.get("reading") or {}
    lean = _lean_row(state, gold, settings)
    case |= {
        "trace": events,
        "injection_check": reading.get("injection"),
        "question_area": reading.get("area"),
        "question_topic": reading.get("topic"),
        "legal_question": reading.get("legal"),
        "decline": reading.get("decline") or "",
        "issues": nodes.planned(state),  # type: ignore[arg-type]
        "researched_issues": [s["issue"] for s in steps if s.get("phase") == "rule"],
        "not_researched": nodes.unresearched_issues(state),  # type: ignore[arg-type]
        "jurisdiction": reading.get("within") or "",
        "steps": steps,
        "lean": lean,
        "memory_hit": bool(nodes.recalled(state)),  # type: ignore[arg-type]
        "answer_record": record,
        "final_answer": answer_stage.AnswerRecord.shown(record),
        "abstained": bool(record.get("abstained")),
        "sources": [
            {
                "id": c.get("passage_id"),
                "title": c.get("title"),
                "gold": c.get("passage_id") in gold,
                "preview": ec.preview(c.get("support"), 200),
            }
            for c in record.get("citations") or []
        ],
        "steps_completed": sum(s["status"] == "completed" for s in steps),
        "steps_failed": sum(s["status"] == "failed" for s in steps),
        "gold_in_steps": any(p["gold"] for s in steps for p in s["passages"]),
        "stop_reason": state.get("stop_reason") or "",
        "error": state.get("error"),
        "fallbacks": state.get("fallbacks") or [],
        "agent_s": round(agent_s, 3),
        "llm": usage,
        "chain_of_thought": state.get("chain_of_thought") or [],
        "run_metrics": state.get("run_metrics") or {},
    }
    _print_steps(out, steps, settings.agent.lean_gate)
    if case["not_researched"]:
        out(f"not researched (MAX_STEPS): {'; '.join(case['not_researched'])}")
    _print_answer(out, record)
    if lean:
        out(
            f"lean retrieval for the letter: {lean['route']}, evidence "
            f"{ec.fmt_num(lean['evidence_score'])} (gate {lean['gate']})"
        )
        _print_passages(out, lean["passages"])
    if choices:
        mc_answer = record.get("mc") or {}
        letter = mc_answer.get("letter")
        case["mc"] = {
            "predicted": letter,
            "answer": case["answer"],
            "correct": letter == case["answer"],
            "closed_book": bool(mc_answer.get("closed_book")),
            "gold_in_steps": case["gold_in_steps"],
            "gold_in_lean": any(p["gold"] for p in (lean or {}).get("passages", [])),
            "gold_in_sources": any(i in gold for i in mc_answer.get("evidence_ids") or []),
        }
        verdict = "CORRECT" if case["mc"]["correct"] else "WRONG"
        out(f"MC: predicted {letter} / answer {case['answer']} -> {verdict}")
    if quotes := record.get("quotes"):
        out("grounding gate:")
        for q in quotes:
            out(f"  {q['verdict']:<15} {q['issue']}: {ec.preview(q['text'], 100)}")
    out(f"answer: {ec.preview(case['final_answer'], 400)}")
    out(
        f"{case['steps_completed']} step(s) completed, {case['steps_failed']} failed; "
        f"{usage['llm_calls']} LLM calls; {agent_s:.1f}s"
    )
    return case


def summary_rows(cases: Sequence[dict]) -> list[dict[str, Any]]:
    def yes_no(value: Any) -> str:
        return "yes" if value else "no"

    return [
        {
            "query": c.get("item") or ec.preview(c["query"], 30),
            "kind": c.get("kind"),
            "issues": len(c["researched_issues"]),
            "done": c["steps_completed"],
            "failed": c["steps_failed"],
            "gold found": yes_no(c["gold_in_steps"] or mc.get("gold_in_lean"))
            if c["gold"]
            else "–",
            "gold used": yes_no(mc.get("gold_in_sources")) if mc else "–",
            "abstained": yes_no(c["abstained"]),
            "seconds": c["agent_s"],
            "LLM calls": c["llm"]["llm_calls"],
            "MC": ("✓" if mc.get("correct") else "✗") if mc else "–",
        }
        for c in cases
        for mc in [c.get("mc") or {}]
    ]


def save_case(case: dict, directory: str | Path) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = case.get("item") or re.sub(r"[^a-z0-9]+", "_", case["query"].lower())[:40].strip("_")
    path = directory / f"{time.strftime('%Y%m%d-%H%M%S')}_{stem or 'query'}.json"
    path.write_text(json.dumps(case, indent=2, ensure_ascii=False, default=str) + "\n", "utf-8")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval_trace.py",
        description="Run the agent on a few questions and trace every node, each research step's "
        "search and the answer record.",
    )
    p.add_argument(
        "n",
        nargs="?",
        type=int,
        help="questions to trace (default: all 8 built-in questions; with --qa, "
        f"{DEFAULT_N} items)",
    )
    p.add_argument("--query", "-q", help="trace this free-text question instead")
    p.add_argument(
        "--qa",
        help="trace the items of this QA file (Bar Exam QA fields) instead of the built-in "
        "questions (datasets/trace_questions.jsonl)",
    )
    p.add_argument("--passages", help="passages file to index first (load_corpus)")
    p.add_argument(
        "--save", action="store_true", help=f"write one case-study JSON per query to {CASE_DIR}/"
    )
    p.add_argument("--case-dir", default=CASE_DIR, help=argparse.SUPPRESS)
    p.add_argument(
        "--mode",
        choices=["research", "evidence"],
        default="research",
        help="answer mode traced (default research, for multiple-choice items too, where the "
        "product's default answers lean); evidence shows the grounding gate's verdict on each "
        "candidate rule sentence too",
    )
    p.add_argument(
        "--policy",
        choices=["agenda", "adaptive"],
        default="agenda",
        help="research policy traced (RESEARCH_POLICY): adaptive shows each step's rewritten "
        "queries, its leads and the replanner's next move",
    )
    ec.add_cli_arguments(p, run_dir=False)
    p.set_defaults(interrupted=False)  # set by run() on Ctrl-C
    return p


def run(
    args: argparse.Namespace,
    settings: Settings,
    *,
    llm_factory: ec.LLMFactory = None,
    out: Callable[[str], None] = print,
) -> list[dict]:
    if args.query is not None and not args.query.strip():
        raise ValueError("--query is empty: give a question, or leave --query out")
    if args.n is not None and args.n < 1:
        raise ValueError("N must be at least 1")
    # the input files first: a missing or broken one stops here, before any model or index
    qa_items = ec.load_qa(args.qa) if args.qa and args.query is None else None
    passages = load_corpus.read_passages(args.passages) if args.passages else None
    ec.require_llm(settings, llm_factory)
    rag_utils.require_reranker(settings)
    ec.index_corpus(settings, passages, args.passages)
    targets: list[dict | None]  # None: the --query
    if args.query is not None:
        targets = [None]
    elif qa_items is not None:
        targets = (ec.with_gold_in_store(qa_items, settings) or qa_items)[: args.n or DEFAULT_N]
    else:
        targets = load_trace_questions()[: args.n]
    llm = ec.llm_record(settings).get("mc_select", {})
    logger.info("LLM provider=%s model=%s", llm.get("provider"), llm.get("model", llm.get("error")))
    cases: list[dict] = []
    try:
        for n, item in enumerate(targets, 1):
            query = ec.item_question(item) if item else args.query.strip()
            position = f"[{n}/{len(targets)}] "
            case = trace_query(
                query, item=item, settings=settings, llm_factory=llm_factory, out=out,
                position=position,
            )  # fmt: skip
            case["config"] = {"llm": llm, "retrieval": ec.retrieval_record(settings)}
            if args.save:
                case["saved_to"] = str(save_case(case, args.case_dir))
            cases.append(case)
            logger.info("traced %s%s (%.1fs)", position, case["item"] or "query", case["agent_s"])
    except KeyboardInterrupt:  # the questions traced so far are shown, and printed with --json
        logger.warning("interrupted: %d of %d question(s) traced", len(cases), len(targets))
        args.interrupted = True
    out("=" * 100)
    out(ec.text_table(summary_rows(cases)))
    mc_cases = [c for c in cases if c.get("mc")]
    if mc_cases:
        out(f"MC accuracy: {sum(c['mc']['correct'] for c in mc_cases)}/{len(mc_cases)}")
    if args.save:
        out(f"case studies written to {args.case_dir}/")
    return cases


def main(argv: Sequence[str] | None = None, *, llm_factory: ec.LLMFactory = None) -> int:
    args = build_parser().parse_args(argv)
    out = (lambda _line: None) if args.json else print
    rc, cases = ec.cli_run(
        args,
        lambda settings: run(args, settings, llm_factory=llm_factory, out=out),
        answer_mode=args.mode,
        research_policy=args.policy,
    )
    if args.json and not rc:
        print(json.dumps(cases, indent=2, ensure_ascii=False, default=str))
    return 130 if args.interrupted and not rc else rc


if __name__ == "__main__":
    run_script(main)
