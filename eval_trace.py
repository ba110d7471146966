"""Trace the agent on a few questions, step by step, to see where it helps and where it fails."""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import eval_common as ec
import load_corpus
import main as agent
import nodes
import rag_utils
from llm_config import LLMClient
from settings import Settings, run_script

logger = logging.getLogger(__name__)

TRACE_K = 5
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


def _doc_rows(docs: Sequence[dict], gold: Sequence[str]) -> list[dict]:
    return [
        {
            "rank": i,
            "id": d["id"],
            "title": d.get("title") or "",
            "source": d.get("source") or "",
            "score": d.get("rerank_score"),
            "dense_score": d.get("dense_score"),
            "gold": d["id"] in gold,
            "preview": ec.preview(d.get("text"), 200),
        }
        for i, d in enumerate(docs, 1)
    ]


def _step_rows(state: dict) -> list[dict]:
    """The planning table (``state.PlanStep``) as plain rows."""
    return [
        {
            **{k: step[k] for k in ("step_id", "phase", "question", "status")},
            **{k: ex.get(k) for k in ("confidence", "optimized_query", "alternatives")},
            "retrieved_doc_ids": ex.get("retrieved_doc_ids"),
            "flagged_passages": ex.get("flagged_passages", []),
            "strategy": step.get("strategy"),
            "issue": step.get("issue"),
            "evidence_score": ex.get("evidence_score"),
        }
        for step in state.get("planning_table") or []
        for ex in [step["execution"] or {}]
    ]


def trace_query(
    query: str,
    *,
    item: dict | None = None,
    settings: Settings,
    llm_factory: ec.LLMFactory = None,
    out: Callable[[str], None] = print,
) -> dict:
    """Trace one query (a QA item when ``item`` is given); print as it goes; return the case study."""
    gold = ec.gold_ids(item) if item else []
    choices = ec.item_choices(item) if item and all(ec.item_choices(item).values()) else None
    case: dict[str, Any] = {
        "query": query,
        "item": ec.item_id(item) if item else None,
        "kind": (item.get("kind") or ("mc" if choices else "open")) if item else "query",
        "gold": gold,
    }
    if item:
        case["subject"] = ec.item_subject(item)
    if choices:
        case["choices"] = choices
        case["answer"] = ec.item_answer(item)

    out("=" * 100)
    label = f" [{case['item']}]" if item else ""
    out(f"QUERY{label}: {ec.preview(query, 300)}")
    if gold:
        out(f"gold passage(s): {', '.join(gold)}")

    t = time.perf_counter()
    raw = rag_utils.retrieve_documents(query, k=TRACE_K, settings=settings)
    case["raw_retrieval"] = _doc_rows(raw, gold)
    case["raw_retrieval_s"] = round(time.perf_counter() - t, 3)
    _print_docs(out, "raw retrieval (question only, no rewrite)", case["raw_retrieval"])

    client = LLMClient(settings, llm_factory=llm_factory)
    t = time.perf_counter()
    primary, alternatives = ec.agent_rewrite(client, query)
    case["rewrite"] = {"primary": primary, "alternatives": alternatives}
    case["rewrite_s"] = round(time.perf_counter() - t, 3)
    out(f"rewrite ({case['rewrite_s']:.1f}s): primary = {ec.preview(primary, 200)}")
    for alt in alternatives:
        out(f"    alternative = {ec.preview(alt, 200)}")
    multi = rag_utils.retrieve_documents_multi_query(
        [primary, *alternatives], k=TRACE_K, settings=settings
    )
    case["multi_query_retrieval"] = _doc_rows(multi, gold)
    _print_docs(out, "multi-query retrieval (rewritten queries)", case["multi_query_retrieval"])
    rewrite_usage = ec.usage_of(client)

    client = LLMClient(settings, llm_factory=llm_factory)
    events: list[dict] = []
    t0 = time.perf_counter()

    def on_event(event: dict) -> None:  # {node, decision, seconds, t_s}
        events.append(event)
        decision = ec.preview(event["decision"], 150)
        out(f"  [{event['t_s']:7.2f}s] {event['node']}: {decision} ({event['seconds']:.1f}s)")

    out("agent trace:")
    context = ec.agent_context(settings, client)
    state = agent.run_agent(query, choices, context=context, on_event=on_event)
    agent_s = time.perf_counter() - t0
    usage = ec.usage_of(client)
    steps = _step_rows(state)
    sources = state.get("sources") or []
    confidences = [s["confidence"] for s in steps if isinstance(s.get("confidence"), int | float)]
    case.update(
        {
            "trace": events,
            "steps": steps,
            "query_type": state.get("query_type"),
            "memory_hit": bool(state.get("memory_hit")),
            "final_answer": state.get("final_cited_answer"),
            "answer_record": state.get("answer"),
            "sources": [
                {
                    "id": s.get("id"),
                    "title": s.get("title"),
                    "gold": s.get("id") in gold,
                    "preview": ec.preview(s.get("support") or s.get("text"), 200),
                }
                for s in sources
            ],
            "confidence": ec.mean(confidences) if confidences else None,
            "steps_completed": sum(s["status"] == "completed" for s in steps),
            "steps_failed": sum(s["status"] == "failed" for s in steps),
            "unique_docs": len({s.get("id") for s in sources}),
            "agent_s": round(agent_s, 3),
            "llm": usage,
            "rewrite_llm": rewrite_usage,
            "chain_of_thought": state.get("chain_of_thought") or [],
            "run_metrics": state.get("run_metrics") or {},
        }
    )
    if choices:
        mc_answer = state["mc_answer"] or {}
        letter = mc_answer.get("letter")
        case["mc"] = {
            "predicted": letter,
            "answer": case["answer"],
            "correct": letter == case["answer"],
            "gold_in_raw": any(r["gold"] for r in case["raw_retrieval"]),
            "gold_in_multi": any(r["gold"] for r in case["multi_query_retrieval"]),
            "gold_in_sources": any(i in gold for i in mc_answer.get("evidence_ids") or []),
        }
        verdict = "CORRECT" if case["mc"]["correct"] else "WRONG"
        out(f"MC: predicted {letter} / answer {case['answer']} -> {verdict}")
    if quotes := (state.get("answer") or {}).get("quotes"):
        out("grounding gate:")
        for q in quotes:
            out(f"  {q['verdict']:<15} {q['issue']}: {ec.preview(q['text'], 100)}")
    if case["chain_of_thought"]:
        out("working memory (search type per step):")
        out(nodes.memory_lines(state))
    out(f"answer: {ec.preview(case['final_answer'], 400)}")
    out(
        f"{case['steps_completed']} step(s) completed, {case['steps_failed']} failed; "
        f"{usage['llm_calls']} LLM calls; {agent_s:.1f}s"
    )
    return case


def _print_docs(out: Callable[[str], None], title: str, rows: Sequence[dict]) -> None:
    """One line per passage: gold mark, rank, its cosine to the query (a fused search's rank score
    says little: reciprocal-rank fusion gives ~0.01-0.03 to every passage), id and title."""
    out(f"{title}:")
    for r in rows:
        mark = "★" if r["gold"] else " "
        dense = r.get("dense_score")
        score = (
            f"cos {ec.fmt_num(dense)}"
            if dense is not None
            else f"rank score {ec.fmt_num(r['score'])}"
        )
        out(
            f"  {mark} {r['rank']}. [{score}] {r['id']} — {ec.preview(r['title'] or r['preview'], 70)}"
        )


def summary_rows(cases: Sequence[dict]) -> list[dict[str, Any]]:
    def yes_no(key: str, mc: dict) -> str:
        return ("yes" if mc.get(key) else "no") if mc else "–"

    return [
        {
            "query": c.get("item") or ec.preview(c["query"], 30),
            "kind": c.get("kind"),
            "type": c.get("query_type"),
            "done": c["steps_completed"],
            "failed": c["steps_failed"],
            "confidence": c["confidence"],
            "docs": c["unique_docs"],
            "gold raw": yes_no("gold_in_raw", mc),
            "gold used": yes_no("gold_in_sources", mc),
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
        description="Trace retrieval, rewrite and every agent node on a few questions.",
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
    ec.add_cli_arguments(p, run_dir=False)
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
    targets: list[tuple[str, dict | None]]
    if args.query is not None:
        targets = [(args.query.strip(), None)]
    elif qa_items is not None:
        with_gold, _ = ec.split_by_gold_in_store(qa_items, settings)
        items = (with_gold or qa_items)[: args.n or DEFAULT_N]
        targets = [(ec.item_question(it), it) for it in items]
    else:
        targets = [(ec.item_question(it), it) for it in load_trace_questions()[: args.n]]
    llm = ec.llm_record(settings).get("mc_select", {})
    logger.info("LLM provider=%s model=%s", llm.get("provider"), llm.get("model", llm.get("error")))
    cases = []
    for query, item in targets:
        case = trace_query(query, item=item, settings=settings, llm_factory=llm_factory, out=out)
        case["config"] = {"llm": llm, "retrieval": ec.retrieval_record(settings)}
        if args.save:
            case["saved_to"] = str(save_case(case, args.case_dir))
        cases.append(case)
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
    )
    if rc:
        return rc
    if args.json:
        print(json.dumps(cases, indent=2, ensure_ascii=False, default=str))
    return 0


if __name__ == "__main__":
    run_script(main)
