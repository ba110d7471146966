"""Retrieval metrics, multiple-choice accuracy and open answers of the agent against its baselines
(the phases and their flags: ``--help``)."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import eval_answers
import eval_common as ec
import load_corpus
import main as agent
import mc
import nodes
import prompts
import rag_utils
from llm_config import LLMClient
from providers import LLMConfigError, check_config, resolve
from settings import RERANKER_CHOICES, Settings, run_script

logger = logging.getLogger(__name__)

MODES = {
    "llm_only": "closed book: the MC prompt with no evidence",
    "rag": "one retrieval of the question, its passages as evidence",
    "lean": "one retrieval of the question + choices, the evidence only when its score clears "
    "LEAN_GATE, else closed book (the agent in ANSWER_MODE=lean, the default for a "
    "multiple-choice question)",
    "pipeline": "the full agent (main.run_agent) with the choices",
    "gold_passage": "the gold passage as evidence (an upper bound for the reader)",
    "evidence": "the agent in evidence mode (coverage = share grounded, accuracy on the grounded "
    "items)",
    "adaptive": "the full agent with RESEARCH_POLICY=adaptive (the model picks each next step "
    "from the findings; not in the default list)",
}
"""Phase 2's modes (``--modes``)."""
AGENT_MODES = {"pipeline": ("research", "agenda"), "adaptive": ("research", "adaptive")}
"""An eval mode named for how it runs the whole agent: its ANSWER_MODE and RESEARCH_POLICY (any
other mode is its own ANSWER_MODE on the agenda)."""
SLOW_MODES = ("pipeline", "evidence", "adaptive")
"""Phase-2 modes that run the research (``--pipeline-n`` bounds them)."""
QUERY_VARIANTS = ("question", "question+choices")
"""Phase-1 query variants scored on every run (no LLM)."""
EXTRA_VARIANTS = {
    "rewrite": "the agent's rewrites (primary + 2 alternatives, pooled)",
    "hyde": "a model-written outline paragraph stating the rule (HyDE)",
    "hyde+question": "hyde's ranking RRF-fused with the question's",
    "per_choice": "question + each choice, RRF-fused",
}
"""Phase-1 variants on request (``--variants``)."""
LLM_VARIANTS = ("rewrite", "hyde", "hyde+question")
"""The variants that call the LLM (through the response cache)."""
RETRIEVER_COLUMNS = {
    "dense": "the vector store without reranking",
    "bm25": "BM25",
    "hybrid": "their fusion",
}
"""Phase-1 columns on request (``--columns``): the question alone through one retriever each."""
RETRIEVAL_K = 10
PER_Q = ("llm_calls", "provider_calls", "input_tokens", "output_tokens", "seconds", "llm_seconds")
"""Row fields phase 2 reports as a mean per question (``<field>_per_q``)."""
RETRIEVAL_PREFIX = "retrieval:"
RESUME_KEYS = (
    "phase",
    "qa",
    "llm",
    "embedding_model",
    "reranker",
    "retrieval_k",
    "max_steps",
    "corpus_count",
)
"""What a run resumed (or continued under the same --run-id) must share with the rows it has."""


# --- Phase 1: retrieval -------------------------------------------------------------------------


def retrieval_queries(item: dict, variant: str, client: Any = None) -> list[str]:
    """The query list of one variant for one item."""
    question = ec.item_question(item)
    if variant in ("question", *RETRIEVER_COLUMNS):
        return [question]
    if variant == "question+choices":
        return [ec.question_with_choices(item)]
    if variant == "rewrite":  # skills/query_rewrite.md: a baseline, the agent does not rewrite
        parsed = prompts.call(client, "rewrite", question=question).parsed
        if parsed is None:
            return [question]
        primary = " ".join(parsed.primary.split()) or question
        unique = {primary.lower(): primary}  # then up to 2 distinct alternatives
        for alt in parsed.alternatives:
            if alt := " ".join(str(alt).split()):
                unique.setdefault(alt.lower(), alt)
        return list(unique.values())[:3]
    if variant in ("hyde", "hyde+question"):
        # the question itself when the model's paragraph is empty
        reply = " ".join((prompts.call(client, "hyde", question=question).text or "").split())
        return [reply or question] if variant == "hyde" else [question, reply or question]
    # per_choice
    return [f"{question}\n{text}" for _, text in sorted(ec.item_choices(item).items())]


def run_retrieval_item(
    item: dict, variant: str, *, settings: Settings, llm_factory: ec.LLMFactory = None
) -> dict:
    """Retrieve the top 10 for one (item, variant) and score it against the gold passages."""
    client = LLMClient(settings, llm_factory=llm_factory) if variant in LLM_VARIANTS else None
    start = time.perf_counter()
    queries = retrieval_queries(item, variant, client)
    if variant in ("hyde+question", "per_choice"):  # one ranking per query, RRF-fused
        rankings = [
            rag_utils.retrieve_documents(q, k=2 * RETRIEVAL_K, settings=settings) for q in queries
        ]
        docs = rag_utils.rrf_merge(rankings, RETRIEVAL_K)
    else:
        reranker = {"dense": "none", "bm25": "bm25", "hybrid": "hybrid"}.get(variant)
        docs = rag_utils.retrieve_documents_multi_query(
            queries, k=RETRIEVAL_K, reranker=reranker, settings=settings
        )
    seconds = round(time.perf_counter() - start, 4)
    mode = RETRIEVAL_PREFIX + variant
    row = ec.ranking_row(item, mode, docs, seconds, phase="retrieval", variant=variant)
    if client is not None:
        row["queries"] = queries
        row.update(ec.usage_of(client))
    return row


# --- Phase 2: MC accuracy per mode --------------------------------------------------------------


def _mc_fields(answer: Mapping[str, Any]) -> dict:
    """A row's answer fields from ``mc.MCResult.to_dict()`` ({}: the run ended before mc_select)."""
    return {
        "predicted": answer.get("letter"),
        "strategy": answer.get("strategy", "none"),
        "parse_failed": bool(answer.get("parse_failed", True)),
        "retried": bool(answer.get("retried", False)),
        "reply": ec.preview(answer.get("text"), 300),
    }


class AgentRunError(RuntimeError):
    """The agent's run failed (an LLM call that kept failing): no answer to score."""


def _run_agent(
    settings: Settings,
    answer_mode: str,
    client: Any,
    question: str,
    choices: dict | None,
    issues: Sequence[str] = (),
) -> tuple[dict, dict]:
    """The agent's final state and answer record.  A run the model's API failed is a failed pair,
    not a wrong answer; one cut by RUN_TIMEOUT is scored: answering in time is measured."""
    answer_mode, policy = AGENT_MODES.get(answer_mode, (answer_mode, "agenda"))
    settings = settings.replace(answer_mode=answer_mode, research_policy=policy)
    context = ec.agent_context(settings, client)
    state = agent.run_agent(question, choices, context=context, issues=issues)
    if state.get("stop_reason") == "error":
        raise AgentRunError(str(state.get("error") or "the run failed"))
    return state, state.get("answer") or {}


def run_mc_item(
    item: dict, mode: str, *, settings: Settings, llm_factory: ec.LLMFactory = None
) -> dict:
    """Answer one item in one mode; the row holds the letter, correctness, usage and timing."""
    client = LLMClient(settings, llm_factory=llm_factory)
    question = ec.item_question(item)
    choices = ec.item_choices(item)
    gold = ec.gold_ids(item)
    extra: dict[str, Any] = {}
    start = time.perf_counter()
    if mode in ("llm_only", "rag", "gold_passage"):
        evidence = None
        if mode != "llm_only":
            if mode == "rag":
                k = settings.agent.retrieval_k
                docs = rag_utils.retrieve_documents(question, k=k, settings=settings)
            else:  # in the order of the item's gold ids
                fetched = ec.fetch_passages(gold, settings)
                if not (docs := [fetched[g] for g in gold if g in fetched]):
                    raise LookupError(f"item {ec.item_id(item)}: gold passage not in the store")
            extra["evidence_ids"] = [d["id"] for d in docs]
            if mode == "rag":
                extra["gold_in_evidence"] = any(d["id"] in gold for d in docs)
            evidence = prompts.format_evidence(docs)
        fields = _mc_fields(mc.select_answer(client, question, choices, evidence).to_dict())
    else:  # lean and the modes that run the research
        state, record = _run_agent(settings, mode, client, question, choices)
        mc_answer = record.get("mc") or {}
        fields = _mc_fields(mc_answer)
        sources = list(mc_answer.get("evidence_ids") or [])  # what the letter read
        table = state.get("planning_table") or []
        lean = record.get("lean") or {}
        extra = {
            "evidence_ids": sources,
            "gold_in_evidence": any(s in gold for s in sources),
            "closed_book": bool(mc_answer.get("closed_book")),
            "route": lean.get("route"),
            "evidence_score": lean.get("evidence_score"),
            "gate": lean.get("gate"),
            "gold_retrieved": any(d in gold for d in lean.get("retrieved_ids") or []),
            "memory_hit": bool(nodes.recalled(state)),  # type: ignore[arg-type]
            "steps": len(table),
            "steps_failed": sum(1 for s in table if s["status"] == "failed"),
            "run_metrics": state.get("run_metrics") or {},
            "error": state.get("error"),
        }
        if mode == "evidence":
            extra["abstained"] = bool(record.get("abstained"))
            extra["grounded"] = bool(record.get("grounded")) and not extra["abstained"]
    answer = ec.item_answer(item)
    return {
        "item": ec.item_id(item),
        "mode": mode,
        "phase": "mc",
        "subject": ec.item_subject(item),
        "answer": answer,
        **fields,
        "correct": fields["predicted"] == answer,
        **extra,
        **ec.usage_of(client),
        "seconds": round(time.perf_counter() - start, 3),
    }


# --- Summary ------------------------------------------------------------------------------------


def summarize_retrieval(rows: Sequence[dict]) -> dict[str, dict]:
    by_variant = ec.group_by((r for r in rows if r.get("phase") == "retrieval"), "variant")
    return {
        v: {
            **ec.summarize_rankings(by_variant[v], RETRIEVAL_K),
            "seconds_per_query": ec.mean(r["seconds"] for r in by_variant[v]),
        }
        for v in (*QUERY_VARIANTS, *EXTRA_VARIANTS, *RETRIEVER_COLUMNS)
        if v in by_variant
    }


def summarize_mc(rows: Sequence[dict]) -> dict[str, dict]:
    by_mode = ec.by_mode(r for r in rows if r.get("phase") == "mc")
    base = by_mode.get("llm_only", {})
    out: dict[str, dict] = {}
    for mode in [m for m in MODES if m in by_mode]:
        rs = list(by_mode[mode].values())
        correct = [bool(r["correct"]) for r in rs]
        lo, hi = ec.bootstrap_ci(correct)
        entry: dict[str, Any] = {
            "n": len(rs),
            "correct": sum(correct),
            "accuracy": ec.accuracy(correct),
            "ci_low": lo,
            "ci_high": hi,
            "wilson_ci": list(ec.wilson_ci(sum(correct), len(correct))),
            "predicted_letters": dict(
                sorted(Counter(r.get("predicted") or "none" for r in rs).items())
            ),
            "parse_failure_rate": ec.mean(float(r["parse_failed"]) for r in rs),
            "strategies": dict(Counter(r.get("strategy") or "none" for r in rs)),
            **{f"{k}_per_q": ec.mean(r.get(k) or 0 for r in rs) for k in PER_Q},
            "per_subject": {
                s: {"n": len(v), "accuracy": ec.accuracy(r["correct"] for r in v)}
                for s, v in sorted(ec.group_by(rs, "subject").items())
            },
        }
        if mode == "lean":
            entry["rag_share"] = ec.accuracy(r.get("route") == "rag" for r in rs)
            entry["gate"] = rs[0].get("gate")
        if mode in ("pipeline", "adaptive"):  # closed-book when its research found nothing
            read = [r["correct"] for r in rs if not r.get("closed_book")]
            entry["closed_book_share"] = ec.accuracy(r.get("closed_book") for r in rs)
            entry["accuracy_with_evidence"] = ec.accuracy(read) if read else None
        if mode == "evidence":
            grounded = [r["correct"] for r in rs if r.get("grounded")]
            entry["coverage"] = ec.accuracy(r.get("grounded") for r in rs)
            entry["grounded_n"] = len(grounded)
            entry["accuracy_grounded"] = ec.accuracy(grounded) if grounded else None
        if any("gold_in_evidence" in r for r in rs):
            entry["gold_in_evidence_rate"] = ec.accuracy(r.get("gold_in_evidence") for r in rs)
        a, b = ec.paired(base, by_mode[mode], "correct")
        if mode != "llm_only" and a:
            diff = [float(y) - float(x) for x, y in zip(a, b, strict=True)]
            entry["vs_llm_only"] = {
                **ec.mcnemar_exact(a, b),
                "accuracy_diff": ec.mean(diff),
                "diff_ci": list(ec.bootstrap_ci(diff)),
            }
        out[mode] = entry
    return out


def write_summary(run: ec.RunDir, config: dict[str, Any], started: float) -> dict[str, Any]:
    """The run's summary, written with its markdown page and plots."""
    rows, open_errors = run.rows, run.open_errors()
    mc_items = {r["item"]: r["answer"] for r in rows if r.get("phase") == "mc"}
    letters = dict(sorted(Counter(mc_items.values()).items()))
    summary = {
        "run_id": run.run_id,
        "config": config,
        "answer_letters": letters,
        "constant_letter_baseline": max(letters.values()) / len(mc_items) if mc_items else None,
        "retrieval": summarize_retrieval(rows),
        "mc": summarize_mc(rows),
        "rows": len(rows),
        "items_done": len({r["item"] for r in rows}),
        "unresolved_errors": len({(e["item"], e["mode"]) for e in open_errors}),
        "error_examples": [e.get("error") for e in open_errors[:5]],
        "wall_seconds_this_invocation": round(time.time() - started, 2),
        "interrupted": run.interrupted,
    }
    run.write_json("summary.json", summary)
    run.write_text("summary.md", render_markdown(summary))
    if summary["mc"]:
        ec.plot_accuracy(summary["mc"], run.path / "accuracy.png", f"MC accuracy — {run.run_id}")
    if summary["retrieval"]:
        curves = {v: m["recall_curve"] for v, m in summary["retrieval"].items()}
        ec.plot_recall_curve(curves, run.path / "recall_at_k.png", f"Recall@k — {run.run_id}")
    return summary


def render_markdown(summary: dict[str, Any]) -> str:
    cfg, mcs = summary["config"], summary["mc"]
    llm = cfg.get("llm", {}).get("mc_select", {})
    lines = [
        f"# Evaluation run `{summary['run_id']}`",
        "",
        f"- QA set: `{cfg.get('qa')}` — {summary['items_done']} of {cfg.get('n_items')} items "
        f"evaluated ({cfg.get('n_items_with_gold')} with the gold passage in the store)"
        + (" — **interrupted**: resume to finish" if summary.get("interrupted") else ""),
        f"- LLM: {llm.get('provider', '?')} / {llm.get('model', '?')}",
        f"- embedder: {cfg.get('retrieval', {}).get('embedder', '?')}, reranker: "
        f"{cfg.get('reranker')}, passages in store: {cfg.get('retrieval', {}).get('corpus_count', '?')}",
        "",
    ]
    if summary["retrieval"]:
        table = [
            {
                "query": v,
                "n": m["n"],
                **{f"R@{k}": m[f"recall@{k}"] for k in (1, 5, 10)},
                "MRR": m["mrr"],
                "MRR 95% CI": f"{m['mrr_ci'][0]:.3f}–{m['mrr_ci'][1]:.3f}",
                "nDCG@10": m["ndcg@10"],
                "s/query": m["seconds_per_query"],
            }
            for v, m in summary["retrieval"].items()
        ]
        lines += ["## Retrieval (phase 1)", "", ec.markdown_table(table), ""]
    if mcs:
        table = [
            {
                "mode": mode,
                "n": m["n"],
                "accuracy": m["accuracy"],
                "95% CI": f"{m['ci_low']:.3f}–{m['ci_high']:.3f}",
                "vs llm_only (McNemar p)": (
                    f"{vs['accuracy_diff']:+.3f} (p={vs['p_value']:.3g})" if vs else "–"
                ),
                "parse fail": m["parse_failure_rate"],
                "calls/q": m["llm_calls_per_q"],
                "uncached calls/q": m["provider_calls_per_q"],
                "tokens/q": m["input_tokens_per_q"] + m["output_tokens_per_q"],
                "s/q": m["seconds_per_q"],
                "extraction": ", ".join(f"{k}:{v}" for k, v in sorted(m["strategies"].items())),
            }
            for mode, m in mcs.items()
            for vs in [m.get("vs_llm_only")]
        ]
        lines += [
            "## Multiple-choice accuracy (phase 2)",
            "",
            ec.markdown_table(table),
            "",
            f"Correct letters of these items: {summary['answer_letters']}; always answering the "
            f"most common one scores {summary['constant_letter_baseline']:.3f}. Predicted letters: "
            + "; ".join(f"{m}: {v['predicted_letters']}" for m, v in mcs.items()),
        ]
        if ev := mcs.get("evidence"):
            lines += [
                "",
                f"Evidence mode: grounded on {ev['grounded_n']} of {ev['n']} items "
                f"(coverage {ev['coverage']:.3f}); accuracy on the grounded items "
                f"{_or_na(ev['accuracy_grounded'])} vs {ev['accuracy']:.3f} overall.",
            ]
        if ln := mcs.get("lean"):
            lines += [
                "",
                f"Lean mode: evidence used on {ln['rag_share']:.0%} of items (LEAN_GATE "
                f"{ln['gate']}), closed-book on the rest.",
            ]
        if (pl := mcs.get("pipeline")) and pl.get("closed_book_share") is not None:
            lines += [
                "",
                f"Pipeline: closed-book on {pl['closed_book_share']:.0%} of items (its "
                "research found nothing to stand on); accuracy on the others "
                f"{_or_na(pl['accuracy_with_evidence'])}.",
            ]
        table = [
            {
                "subject": s,
                **{
                    mode: f"{ps['accuracy']:.2f} ({ps['n']})" if ps else "–"
                    for mode, m in mcs.items()
                    for ps in [m["per_subject"].get(s)]
                },
            }
            for s in sorted({s for m in mcs.values() for s in m["per_subject"]})
        ]
        lines += ["", "### Accuracy per subject", "", ec.markdown_table(table), ""]
    if summary["unresolved_errors"]:
        lines += [
            f"**{summary['unresolved_errors']} (item, mode) pairs failed** (see errors.jsonl); "
            "rerun with the same --run-id to retry them.",
            "",
        ]
    return "\n".join(lines)


def _or_na(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


# --- Injection detection: recall and false-positive rate of injection.detect on a labelled set ---

INJECTION_QA = Path(__file__).resolve().parent / "datasets" / "injection" / "prompts.jsonl"


def build_injection_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval_comprehensive.py injection",
        description=(
            "Recall and false-positive rate (95% Wilson CIs) of the agent's injection check "
            "(injection.detect: the pre-screen, then the model's verdict) on a labelled JSONL file "
            "with 'text' and 'label' (injection|safe), optional 'id', 'style' and 'split'. "
            "Results go to eval_results/<run-id>/."
        ),
    )
    p.add_argument("--qa", help="labelled JSONL (default datasets/injection/prompts.jsonl)")
    p.add_argument("--split", help="only rows whose 'split' is this (e.g. test)")
    p.add_argument(
        "--prescreen-only", action="store_true", help="the deterministic pre-screen alone (no LLM)"
    )
    ec.add_cli_arguments(p, model=True, passage_filters=False)
    return p


def read_injection_set(path: Path, split: str | None = None) -> list[dict]:
    """Rows of a labelled injection file; a bad row is a ValueError naming the file and row."""
    rows, seen = [], set()
    for n, rec in load_corpus.iter_rows(path):
        if not str(rec.get("text") or "").strip():
            raise ValueError(f"{path}: row {n}: needs a non-empty 'text'")
        if rec.get("label") not in ("injection", "safe"):
            raise ValueError(f"{path}: row {n}: 'label' must be injection or safe")
        rec["id"] = str(rec.get("id") or f"row{n}")
        if rec["id"] in seen:
            raise ValueError(f"{path}: row {n}: duplicate id {rec['id']!r}")
        seen.add(rec["id"])
        rec["style"] = str(rec.get("style") or "unspecified")
        if split is None or rec.get("split") == split:
            rows.append(rec)
    if not rows:
        raise ValueError(f"{path}: no rows" + (f" with split={split!r}" if split else ""))
    return rows


def summarize_injection(rows: Sequence[dict]) -> dict[str, Any]:
    """Recall (attacks flagged) and FPR (safe prompts flagged) with Wilson CIs, per style."""
    attacks = [r for r in rows if r["label"] == "injection"]
    safe = [r for r in rows if r["label"] == "safe"]
    tp, fp = sum(r["flagged"] for r in attacks), sum(r["flagged"] for r in safe)
    styles = ec.group_by(rows, "style")
    label = {s: rs[0]["label"] for s, rs in styles.items()}  # a style's prompts share a label
    wrong = {s: [r["item"] for r in rs if not r["correct"]] for s, rs in styles.items()}
    return {
        "n": len(rows),
        "attacks": len(attacks),
        "safe": len(safe),
        "recall": ec.accuracy(r["flagged"] for r in attacks),
        "recall_ci": list(ec.wilson_ci(tp, len(attacks))),
        "fpr": ec.accuracy(r["flagged"] for r in safe),
        "fpr_ci": list(ec.wilson_ci(fp, len(safe))),
        "tp": tp,
        "fn": len(attacks) - tp,
        "fp": fp,
        "tn": len(safe) - fp,
        "prescreen_recall": ec.accuracy(r["prescreen"] for r in attacks),
        "prescreen_fpr": ec.accuracy(r["prescreen"] for r in safe),
        "model_verdict_used": sum(r["llm_verdict"] in ("safe", "injection") for r in rows),
        "prescreen_only": sum(r["injection_check"] == "prescreen_only" for r in rows),
        "llm_verdicts": dict(Counter(r["llm_verdict"] for r in rows)),
        "overruled": sum(r["llm_verdict"] == "injection" and not r["flagged"] for r in rows),
        "misses": {s: w for s, w in wrong.items() if w and label[s] == "injection"},
        "false_positives": {s: w for s, w in wrong.items() if w and label[s] == "safe"},
        "per_style": {
            s: {"label": label[s], "n": len(rs), "flagged": sum(r["flagged"] for r in rs)}
            for s, rs in styles.items()
        },
        "seconds_per_item": ec.mean(r["seconds"] for r in rows),
    }


def render_injection_markdown(summary: dict[str, Any]) -> str:
    inj, cfg = summary["injection"], summary["config"]
    wrong = inj["misses"] | inj["false_positives"]
    lines = [
        f"# Injection detection — {summary['run_id']}",
        "",
        f"{cfg['qa']} (split {cfg['split'] or 'all'}): {inj['attacks']} attacks, {inj['safe']} safe; "
        f"check: {cfg['check']}; model verdict used on {inj['model_verdict_used']} of {inj['n']} "
        f"(pre-screen only: {inj['prescreen_only']}, overruled: {inj['overruled']})",
        "",
        ec.markdown_table(
            [
                {
                    "metric": name,
                    "value": inj[key],
                    "95% CI (Wilson)": "–".join(map(ec.fmt_num, inj[f"{key}_ci"])),
                    "pre-screen alone": inj[f"prescreen_{key}"],
                }
                for name, key in (("recall", "recall"), ("false-positive rate", "fpr"))
            ]
        ),
        "",
        ec.markdown_table(
            [
                {"style": k, **v, "wrong": ", ".join(wrong.get(k, [])) or "–"}
                for k, v in sorted(inj["per_style"].items(), key=lambda kv: (kv[1]["label"], kv[0]))
            ]
        ),
    ]
    return "\n".join(lines) + "\n"


def run_injection(
    args: argparse.Namespace, settings: Settings, *, llm_factory: ec.LLMFactory = None
) -> dict[str, Any]:
    """Run injection.detect over the labelled set; one row per prompt, then the summary."""
    import injection

    started = time.time()
    qa_path = Path(args.qa) if args.qa else INJECTION_QA
    items = read_injection_set(qa_path, args.split)
    check = "prescreen_only" if args.prescreen_only else "prescreen+llm"
    mode = f"injection:{check}"
    if not args.prescreen_only and llm_factory is None:
        resolve("injection", settings)  # a missing key or unknown provider: exit 2 before work
    run_dir = ec.open_run("injection", args.run_id, None, args.results_dir)
    config = {
        "script": "eval_comprehensive.py",
        "phase": "injection",
        "qa": str(qa_path),
        "split": args.split,
        "check": check,
        "n_items": len(items),
        "llm": ec.llm_record(settings, ("injection",)) if not args.prescreen_only else {},
        "settings": ec.settings_record(settings),
        "command": list(args.argv),
    }
    run_dir.check_config(config, ("qa", "split", "check", "llm"))

    def one(item: dict) -> dict:
        client = None if args.prescreen_only else LLMClient(settings, llm_factory=llm_factory)
        start = time.perf_counter()
        result = injection.detect(item["text"], client, skip_llm=args.prescreen_only)
        row = {
            "item": item["id"],
            "mode": mode,
            "phase": "injection",
            "label": item["label"],
            "style": item["style"],
            "split": item.get("split"),
            "flagged": not result["is_safe"],
            "correct": (not result["is_safe"]) == (item["label"] == "injection"),
            **{k: result[k] for k in ("prescreen", "llm_verdict", "injection_check", "reason")},
            "text": ec.preview(item["text"], 160),
            "seconds": round(time.perf_counter() - start, 4),
        }
        return row if client is None else row | ec.usage_of(client)

    with run_dir.until_interrupted("--resume"):
        run_dir.run(
            one, items, key=lambda it: (it["id"], mode), desc="injection", fatal=ec.USER_ERRORS
        )
    wanted = {it["id"] for it in items}
    rows = [r for r in run_dir.rows if r["item"] in wanted and r["mode"] == mode]
    summary = {
        "run_id": run_dir.run_id,
        "config": config,
        "injection": summarize_injection(rows),
        "items_without_result": len(wanted) - len(rows),
        "interrupted": run_dir.interrupted,
        "wall_seconds_this_invocation": round(time.time() - started, 2),
    }
    run_dir.write_json("summary.json", summary)
    run_dir.write_text("summary.md", render_injection_markdown(summary))
    return summary


# --- Phase 3: open answers (research vs evidence mode) ------------------------------------------

ANSWER_MODES = ("research", "evidence")
"""Phase 3's default modes; ``adaptive`` (research on RESEARCH_POLICY=adaptive) is asked for."""
OPEN_MODES = (*ANSWER_MODES, "adaptive")
FACT_MODES = (*OPEN_MODES, "ceiling")
"""Fact-pattern modes: the agent per answer mode, and the ceiling (eval_answers.ceiling_answer)."""


def build_answers_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval_comprehensive.py answers",
        description=(
            "Phase 3: the agent's open answers per answer mode (research, evidence) on the open "
            "question set: abstention recall on out-of-corpus questions and false abstention on "
            "in-corpus ones, key-point coverage, the share of answer sentences with a valid "
            "citation, quote validity, and with --grade an A-F grade by the judge model "
            "(skills/grade_answer.md; JUDGE_PROVIDER / JUDGE_MODEL choose the grader), all with 95% CIs."
        ),
    )
    p.add_argument(
        "n",
        nargs="?",
        type=int,
        help="number of questions, taken round-robin over the categories (default all)",
    )
    p.add_argument("--qa", help="open questions JSONL (default datasets/open_questions.jsonl)")
    p.add_argument(
        "--facts",
        action="store_true",
        help="the fact patterns (datasets/fact_patterns.jsonl, or --qa) instead of the open "
        "questions: gold passage cited, issue recall, conclusion correct (verdict and key "
        "phrases), declined, uncited and misgrounded sentences; modes research, evidence and "
        "ceiling (the model handed the gold passages and the facts in one IRAC call)",
    )
    p.add_argument(
        "--split",
        choices=["tune", "report", "all"],
        default="all",
        help="with --facts: the half to run (tune what you change on one, report on the other)",
    )
    p.add_argument(
        "--modes", default=",".join(ANSWER_MODES), help="research,evidence[,adaptive][,ceiling]"
    )
    p.add_argument("--grade", action="store_true", help="grade every answer A-F with the judge")
    p.add_argument(
        "--issues-from",
        choices=["gold"],
        help="with --facts: set each fact pattern's agenda to its gold doctrines' names (main.py "
        "--issues), as a user who knows the field would name them",
    )
    ec.add_cli_arguments(p)
    return p


def agent_answer(
    settings: Settings, client: Any, mode: str, question: str, issues: Sequence[str]
) -> dict:
    """The answer dict (eval_answers' shape) of the whole agent in ``mode``; ``issues``: the agenda
    a user sets (``--issues-from gold``)."""
    state, record = _run_agent(settings, mode, client, question, None, issues)
    ids = {c["n"]: c["passage_id"] for c in record.get("citations") or []}
    return {
        "answer": record.get("text") or "",
        "abstained": bool(record.get("abstained")),
        "verdict": record.get("verdict"),
        "reading": record.get("reading"),
        "support": record.get("support"),
        # the legal sentences, each with its issue and the passage ids it cites
        "sentences": [
            {
                "text": s["text"],
                "role": s["role"],
                "issue": issue["issue"],
                "passage_ids": [ids[n] for n in s.get("cites") or [] if n in ids],
            }
            for issue in record.get("issues") or []
            for s in issue.get("sentences") or []
        ],
        "passages": {pid: p["text"] for pid, p in (state.get("passages") or {}).items()},
        "quotes": record.get("quotes") or [],
        "others": record.get("others") or [],
        "llm_calls": client.summary()["llm_calls"],
    }


def same_doctrine_fn(settings: Settings) -> Callable[[str, Sequence[str]], bool]:
    """``(passage id, gold ids) -> bool``: the passage is about the same doctrine as one of the
    gold passages (embedding cosine >= ``eval_answers.SAME_DOCTRINE_COSINE``)."""

    @functools.cache
    def vector(pid: str) -> Any:
        text = (ec.fetch_passages([pid], settings).get(pid) or {}).get("text") or ""
        return rag_utils.get_embedder(settings).embed_documents([text])[0]

    def same(pid: str, gold: Sequence[str]) -> bool:
        return any(
            float(vector(pid) @ vector(g)) >= eval_answers.SAME_DOCTRINE_COSINE for g in gold
        )

    return same


def steer_hits(
    context: Any, item: Mapping[str, Any], others: Sequence[str], cited: Collection[str] = ()
) -> list[str]:
    """The doctrines an answer names as passed over whose research step would find a gold passage
    the answer does not cite (ids ``cited``; ``nodes.candidate_search`` in ``context``, the
    executor's first search): a user's ``--issues`` for one of them researches what it missed."""
    from question import Question

    facts = list(Question.read(str(item["question"])).facts)
    gold = {g for issue in item.get("issues") or [] for g in issue["gold_ids"]}
    gold = (gold | set(item.get("gold_ids") or [])) - set(cited)
    return [
        name
        for name in others
        if gold & {d["id"] for d in nodes.candidate_search(context, name, facts)}
    ]


def answer_rows(
    run_dir: ec.RunDir, items: Sequence[Mapping[str, Any]], modes: Sequence[str]
) -> list[dict]:
    """The run's answer rows of ``items`` in ``modes``, each with its ``answers_grade`` if any."""
    wanted = {it["id"] for it in items}
    grades = {
        (r["item"], r["mode"]): {"grade": r.get("grade"), "reason": r.get("reason")}
        for r in run_dir.rows
        if r.get("phase") == "answers_grade"
    }
    return [
        {**r, **grades.get((r["item"], r["mode"]), {})}
        for r in run_dir.rows
        if r.get("phase") == "answers" and r["item"] in wanted and r["mode"] in modes
    ]


def grade_answer_rows(
    run_dir: ec.RunDir,
    items: Sequence[Mapping[str, Any]],
    modes: Sequence[str],
    judge: Any,
    judge_record: Mapping[str, Any] | None,
) -> None:
    """Grade every answer row of the run that has no grade yet (answered now or by an earlier,
    ungraded run), one ``answers_grade`` row each, so grading resumes too."""
    by_id = {it["id"]: it for it in items}
    todo = [r for r in answer_rows(run_dir, items, modes) if "grade" not in r]
    grade = lambda row: eval_answers.grade_answer(judge, by_id[row["item"]], row["answer"])  # noqa: E731
    for row, graded, err in ec.run_tasks(grade, todo, desc="grading"):
        if err is not None:  # ungraded now, graded by the next resume
            logger.warning("grading %s/%s failed: %s", row["item"], row["mode"], err)
            continue
        key = {"item": row["item"], "mode": row["mode"]}
        run_dir.append({**key, "phase": "answers_grade", **graded, "judge": judge_record})


def read_answer_items(args: argparse.Namespace) -> list[dict]:
    """The first N open questions (``--facts``: fact patterns of ``--split``); none is an error."""
    default = eval_answers.FACT_PATTERNS if args.facts else eval_answers.OPEN_QUESTIONS
    path = Path(args.qa) if args.qa else default
    if not path.exists():
        raise FileNotFoundError(f"QA file not found: {path}")
    if args.facts:
        items = eval_answers.load_fact_patterns(path, args.split)
        what = f"fact patterns in split {args.split!r}"
    else:
        items = eval_answers.interleave_categories(eval_answers.load_open_questions(path))
        what = "questions"
    if not items:
        raise ValueError(f"{path}: no {what}")
    return items[: args.n]


def run_answers_phase(
    args: argparse.Namespace, settings: Settings, *, llm_factory: ec.LLMFactory = None
) -> dict[str, Any]:
    modes = ec.comma_list(args.modes, FACT_MODES if args.facts else OPEN_MODES, "answer mode")
    items = read_answer_items(args)  # bad input: no model, no index, no run folder
    doc_files = eval_answers.pattern_documents(items, args.qa or eval_answers.FACT_PATTERNS)
    ec.require_llm(settings, llm_factory)
    rag_utils.require_reranker(settings)
    if args.grade and llm_factory is None:
        check_config(settings, roles=("judge",))  # JUDGE_PROVIDER / JUDGE_MODEL, before any work
    run_dir = ec.open_run("answers", args.run_id, None, args.results_dir)
    if doc_files:  # the patterns' documents beside the starter corpus, in a store of the run's
        settings = settings.replace(chroma_dir=str(run_dir.path / "chroma"), chroma_host=None)
    load_corpus.ensure_starter_index(settings)
    if doc_files:
        import documents

        load_corpus.load_documents(doc_files, settings, progress=False)
        store = rag_utils.get_store(settings)
        ids = [c for d in doc_files for c in store.document_chunks(documents.document_id(d))]
        eval_answers.resolve_gold_text(items, store.get(ids))
    config = {
        "script": "eval_comprehensive.py",
        "phase": "answers",
        "command": list(args.argv),  # what --resume RUN_ID replays
        "qa": args.qa
        or ("datasets/fact_patterns.jsonl" if args.facts else "datasets/open_questions.jsonl"),
        "facts": bool(args.facts),
        "split": args.split if args.facts else None,
        "issues_from": args.issues_from,
        "modes": modes,
        "documents": [d.name for d in doc_files],
        "n_items": len(items),
        "llm": ec.llm_record(settings),
        # Not checked on resume: a finished run can be graded later; each grade row names its judge.
        "judge": ec.llm_record(settings, ("judge",))["judge"] if args.grade else None,
        "retrieval": ec.retrieval_record(settings),
        "settings": ec.settings_record(settings),
    }
    run_dir.check_config(config, ("qa", "llm", "facts", "split"))
    scorer = eval_answers.score_fact_pattern if args.facts else eval_answers.score_answer
    same_doctrine = same_doctrine_fn(settings)
    # the searches steer_hits runs, in one context built when first needed
    steer_context = functools.cache(lambda: ec.agent_context(settings, LLMClient(settings)))

    def answer(task: tuple[dict, str]) -> dict:
        item, mode = task
        start = time.perf_counter()
        client = LLMClient(settings, llm_factory=llm_factory)
        if mode == "ceiling":
            ids = [g for issue in item["issues"] for g in issue["gold_ids"]]
            gold = list(ec.fetch_passages(ids, settings).values())
            result = eval_answers.ceiling_answer(client, item, gold)
        else:  # --issues-from gold: the gold doctrines, as a user who knows the field names them
            issues = [i["name"] for i in item["issues"]] if args.issues_from == "gold" else ()
            result = agent_answer(settings, client, mode, str(item["question"]), issues)
        row = scorer(item, mode, result, time.perf_counter() - start, same_doctrine=same_doctrine)
        if row.get("others"):  # which named, passed-over doctrines would find a gold passage?
            cited = {p for s in result.get("sentences") or [] for p in s["passage_ids"]}
            row["steer"] = steer_hits(steer_context(), item, row["others"], cited)
        return {**row, "item": row["id"], "phase": "answers"}

    with run_dir.until_interrupted("--resume"):
        run_dir.run(  # one item's modes in a row, so a run cut short stays paired
            answer,
            [(item, mode) for item in items for mode in modes],
            key=lambda task: (str(task[0]["id"]), task[1]),
            desc="answers",
        )
        if args.grade:
            judge = LLMClient(settings, llm_factory=llm_factory)
            grade_answer_rows(run_dir, items, modes, judge, config["judge"])
    answers = eval_answers.summarize_answers(answer_rows(run_dir, items, modes), args.facts)
    summary = {"run_id": run_dir.run_id, "config": config, "answers": answers}
    summary |= {"interrupted": run_dir.interrupted, "failed": len(run_dir.errors)}
    run_dir.write_json("summary.json", summary)
    return summary


def answers_table(by_mode: Mapping[str, Mapping[str, Any]]) -> str:
    """Phase 3's summary as a table: one row per metric, one column per mode; a share reads
    ``k/n rate (95% CI)``, a mean its value."""

    def cell(value: Any) -> str:
        if isinstance(value, dict) and "k" in value:
            if not value["n"]:
                return "—"
            lo, hi = value["ci95"]
            return f"{value['k']}/{value['n']} {value['rate']:.2f} ({lo:.2f}–{hi:.2f})"
        if isinstance(value, dict) and "mean" in value:
            return "—" if value["mean"] is None else f"{value['mean']:.2f}"
        return "—" if value in (None, {}) else str(value)

    metrics = dict.fromkeys(k for v in by_mode.values() for k in v)
    rows = [{"metric": m, **{mode: cell(v.get(m)) for mode, v in by_mode.items()}} for m in metrics]
    return ec.text_table(rows, rule=False)


# --- CLI ----------------------------------------------------------------------------------------


MC_PHASES = ("retrieval", "pipeline", "both")
"""The phases of the main parser (the first of them, or N alone, runs ``both``)."""
SUBCOMMANDS = {
    "answers": (build_answers_parser, run_answers_phase, lambda s: answers_table(s["answers"])),
    "injection": (build_injection_parser, run_injection, render_injection_markdown),
}
"""The phases with their own parser (the first argument): parser, run, summary as printed."""
PHASES = {
    "retrieval": (
        "[N] [--variants V,...] [--columns C,...] [--reranker R]",
        "phase 1: Recall@1/5/10, MRR, nDCG@10 of the gold passages (no LLM unless a variant asks)",
    ),
    "pipeline": (
        "[N] [--modes M,...] [--pipeline-n M] [--workers W]",
        "phase 2: multiple-choice accuracy per mode with bootstrap CIs and McNemar tests",
    ),
    "both": ("[N]", "phase 1 then phase 2 on the same items, with the flags of both (the default)"),
    "answers": (
        "[N] [--facts] [--split tune|report|all] [--modes research,evidence[,ceiling]] [--grade]",
        "phase 3: open answers and fact patterns: abstention, citations, quotes, conclusions",
    ),
    "injection": (
        "[--split S] [--prescreen-only]",
        "the prompt-injection check's recall and false-positive rate on a labelled set",
    ),
}
"""Every phase ``--help`` names: its own arguments and what it measures."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval_comprehensive.py",
        usage="%(prog)s [PHASE] [N] [options]",
        description=(
            "Evaluate the agent on a labelled question set. Results go to eval_results/<run-id>/."
            "\n\nphases (the first argument; answers and injection have their own --help):"
            + "".join(
                f"\n  {name} {flags}\n      {measures}"
                for name, (flags, measures) in PHASES.items()
            )
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  python eval_comprehensive.py retrieval\n"
            "  python eval_comprehensive.py both 40 --qa ../shared/data/qa/barexam_dev.jsonl "
            "--passages ../shared/data/corpus/passages.jsonl\n"
            "  python eval_comprehensive.py pipeline 20 --modes llm_only,rag --run-id trial\n"
            "  python eval_comprehensive.py --resume trial\n"
            "  python eval_comprehensive.py answers --facts --split report\n"
            "  python eval_comprehensive.py injection --prescreen-only"
        ),
    )
    p.add_argument(
        "positional",
        nargs="*",
        metavar="PHASE N",
        help="PHASE: " + " | ".join(PHASES) + " (default both); N: number of items (default all)",
    )
    p.add_argument(
        "--qa", help="QA file (CSV/TSV/JSONL/Parquet, Bar Exam QA fields); default: starter set"
    )
    p.add_argument("--passages", help="passages file to index first (load_corpus)")
    p.add_argument(
        "--modes",
        default=",".join(m for m in MODES if m != "adaptive"),
        help="comma-separated phase-2 modes (default all but adaptive): " + _described(MODES),
    )
    p.add_argument(
        "--pipeline-n",
        type=int,
        help="run the (slow) pipeline, evidence and adaptive modes on only the first M of the N items",
    )
    p.add_argument(
        "--variants",
        default="",
        help="phase 1 also scores these query variants (rewrite and hyde* call the LLM, through "
        "the response cache): " + _described(EXTRA_VARIANTS),
    )
    p.add_argument("--rewrite", action="store_true", help="same as --variants rewrite")
    p.add_argument(
        "--columns",
        default="",
        help="phase 1 also scores the question alone through these retrievers: "
        + _described(RETRIEVER_COLUMNS),
    )
    p.add_argument(
        "--workers", type=int, default=1, help="items in parallel (API providers; default 1)"
    )
    p.add_argument("--resume", metavar="RUN_ID", help="resume this existing run")
    p.add_argument("--reranker", choices=RERANKER_CHOICES)
    ec.add_cli_arguments(p, model=True)
    return p


def _described(options: Mapping[str, str]) -> str:
    return "; ".join(f"{name} = {what}" for name, what in options.items())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.phase, args.n = "both", None
    for tok in args.positional:
        if tok in MC_PHASES:
            args.phase = tok
        elif tok.isdigit() and int(tok) > 0:
            args.n = int(tok)
        elif tok in SUBCOMMANDS:
            parser.error(f"{tok} must be the first argument: eval_comprehensive.py {tok} ...")
        else:
            parser.error(f"unexpected argument {tok!r}: expected {'|'.join(MC_PHASES)} and/or N")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    try:
        args.mode_list = ec.comma_list(args.modes, MODES, "mode")
        args.variant_list = ec.comma_list(args.variants, EXTRA_VARIANTS, "variant")
        args.column_list = ec.comma_list(args.columns, RETRIEVER_COLUMNS, "column")
    except ValueError as exc:
        parser.error(str(exc))
    if args.rewrite and "rewrite" not in args.variant_list:
        args.variant_list.append("rewrite")
    return args


def run(
    args: argparse.Namespace, settings: Settings, *, llm_factory: ec.LLMFactory = None
) -> dict[str, Any]:
    """Run the phases of ``args`` and return the summary (also written to the run directory)."""
    started = time.time()
    # bad input: no model, no index, no run folder
    qa_path, items, passages = ec.read_inputs(args.qa, args.passages)
    llm_variants = [v for v in args.variant_list if v in LLM_VARIANTS]
    if args.phase != "retrieval" or llm_variants:
        ec.require_llm(settings, llm_factory)
    rag_utils.require_reranker(settings)
    ec.index_corpus(settings, passages, args.passages)
    if has_gold := any(ec.gold_ids(it) for it in items):
        items = ec.items_with_gold(items, settings, qa_path)
    else:
        logger.info("%s has no gold passage ids: phase 1 and gold_passage are skipped", qa_path)
    n_with_gold, items = len(items) if has_gold else 0, items[: args.n]
    run_dir = ec.open_run(args.phase, args.run_id, args.resume, args.results_dir)
    modes = [m for m in args.mode_list if m != "gold_passage" or has_gold]
    variants = [*QUERY_VARIANTS, *args.variant_list, *args.column_list] if has_gold else []
    llm = ec.llm_record(settings)
    config = {
        "script": "eval_comprehensive.py",
        "phase": args.phase,
        "qa": str(qa_path),
        "passages": args.passages,
        "n_requested": args.n,
        "n_items": len(items),
        "n_items_with_gold": n_with_gold,
        "modes": modes if args.phase != "retrieval" else [],
        "pipeline_n": args.pipeline_n,
        "query_variants": variants if args.phase != "pipeline" else [],
        "workers": args.workers,
        "llm": llm,
        "embedding_model": settings.retrieval.embedding_model,
        "reranker": settings.retrieval.reranker,
        "retrieval_k": settings.agent.retrieval_k,
        "max_steps": settings.agent.max_steps,
        "retrieval": ec.retrieval_record(settings),
        "settings": ec.settings_record(settings),
        "bootstrap": {"resamples": ec.BOOTSTRAP_RESAMPLES, "seed": ec.BOOTSTRAP_SEED},
        "command": list(args.argv),
    }
    config["corpus_count"] = config["retrieval"].get("corpus_count")
    run_dir.check_config(config, RESUME_KEYS)
    mc_llm = llm.get("mc_select", {})
    logger.info(
        "run %s%s: %d items; LLM provider=%s model=%s; results in %s",
        run_dir.run_id,
        " (resumed)" if run_dir.resumed else "",
        len(items),
        mc_llm.get("provider", "?"),
        mc_llm.get("model", mc_llm.get("error", "?")),
        run_dir.path,
    )
    with run_dir.until_interrupted("--resume"):
        if args.phase in ("retrieval", "both") and variants:
            run_dir.run(
                lambda t: run_retrieval_item(*t, settings=settings, llm_factory=llm_factory),
                [(it, v) for v in variants for it in items],
                key=lambda t: (ec.item_id(t[0]), RETRIEVAL_PREFIX + t[1]),
                workers=args.workers if llm_variants else 1,
                desc="retrieval",
                fatal=(LLMConfigError,),
            )
        if args.phase in ("pipeline", "both") and modes:
            pipe_n = args.pipeline_n if args.pipeline_n is not None else len(items)
            run_dir.run(
                lambda t: run_mc_item(*t, settings=settings, llm_factory=llm_factory),
                [
                    (it, m)
                    for i, it in enumerate(items)
                    for m in modes
                    if m not in SLOW_MODES or i < pipe_n
                ],
                key=lambda t: (ec.item_id(t[0]), t[1]),
                workers=args.workers,
                desc="MC",
                fatal=(LLMConfigError,),
            )
    return write_summary(run_dir, config, started)


def _without(tokens: Sequence[str], option: str) -> list[str]:
    """``tokens`` without ``option VALUE`` / ``option=VALUE``."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(option)
    return parser.parse_known_args(tokens)[1]


def resume_command(given: list[str]) -> list[str]:
    """The command a bare ``--resume RUN_ID`` stands for: the run's own (its ``config.json``), then
    the options given now, which win; anything else (a phase given, no saved command) unchanged."""
    if given[:1] and given[0] in SUBCOMMANDS:
        return given
    args = build_parser().parse_args(given)
    if not args.resume or args.positional:
        return given
    config = Path(args.results_dir) / args.resume / "config.json"
    try:
        saved = json.loads(config.read_text(encoding="utf-8")).get("command")
    except (OSError, ValueError):
        return given
    if not saved:  # a run made before commands were saved, or an answers run
        return given
    saved = _without(saved, "--run-id")  # the run is the one named by --resume
    if saved[:1] and saved[0] in SUBCOMMANDS:  # these phases resume by their --run-id
        return [*saved, *_without(given, "--resume"), "--run-id", args.resume]
    return [*saved, *given]


def main(argv: Sequence[str] | None = None, *, llm_factory: ec.LLMFactory = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    command = resume_command(given)
    if command != given:
        print(
            f"eval_comprehensive.py: resuming with the run's command: {' '.join(command)}",
            file=sys.stderr,
        )
    if command[:1] and command[0] in SUBCOMMANDS:
        build_phase_parser, run_phase, render = SUBCOMMANDS[command[0]]
        args = build_phase_parser().parse_args(command[1:])
    else:
        args, run_phase, render = parse_args(command), run, render_markdown
    args.argv = command
    rc, summary = ec.cli_run(
        args,
        lambda s: run_phase(args, s, llm_factory=llm_factory),
        reranker=getattr(args, "reranker", None),
    )
    return rc or ec.print_summary(args, summary, render)


if __name__ == "__main__":
    run_script(main)
