"""Bi-encoder only against each available reranker, on the QA items whose gold passage is indexed.

Per reranker: Recall@1/5/10, MRR, nDCG@10, latency after one warm-up query, and a paired test
against ``none`` on the gold passage's reciprocal rank.  A reranker whose model cannot load is
reported as unavailable, not replaced.
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

import eval_common as ec
import rag_utils
from settings import Settings, run_script

logger = logging.getLogger(__name__)

RERANKERS = tuple(r for r in rag_utils.RERANKERS if r != "auto")
DEFAULT_RERANKERS = ("none", "hybrid", "cross-encoder")
BASELINE = "none"
K = 10


def run_item(item: dict, reranker: str, *, settings: Settings, query: str) -> dict:
    text = ec.question_with_choices(item) if query == "question+choices" else ec.item_question(item)
    start = time.perf_counter()
    docs = rag_utils.retrieve_documents(text, k=K, reranker=reranker, settings=settings)
    return ec.ranking_row(item, reranker, docs, round(time.perf_counter() - start, 5))


def summarize(rows: Sequence[dict], rerankers: Sequence[str]) -> dict[str, dict]:
    by = ec.by_mode(rows)
    base = by.get(BASELINE, {})
    out: dict[str, dict] = {}
    for name in [n for n in rerankers if by.get(n)]:
        secs = sorted(r["seconds"] for r in by[name].values())
        out[name] = {
            **ec.summarize_rankings(list(by[name].values()), K),
            "latency_mean_s": ec.mean(secs),
            "latency_median_s": statistics.median(secs),
            "latency_p95_s": secs[round(0.95 * (len(secs) - 1))],
        }
        if name != BASELINE and base:
            out[name]["vs_" + BASELINE] = ec.paired_comparison(*ec.paired(base, by[name], "rr"))
    return out


def render(summary: dict[str, Any], table: Any = ec.markdown_table) -> str:
    rows = [
        {
            "reranker": name,
            "n": m["n"],
            **{f"R@{k}": m[f"recall@{k}"] for k in (1, 5, 10)},
            "MRR": m["mrr"],
            "nDCG@10": m["ndcg@10"],
            "ms/query": m["latency_mean_s"] * 1000,
            "p95 ms": m["latency_p95_s"] * 1000,
            f"RR vs {BASELINE} W/L/T": f"{vs['wins']}/{vs['losses']}/{vs['ties']}" if vs else "–",
            "sign p": vs.get("sign_test_p"),  # the table shows None as "–"
            "Wilcoxon p": vs.get("wilcoxon_p"),
        }
        for name, m in summary["rerankers"].items()
        for vs in [m.get("vs_" + BASELINE) or {}]
    ]
    notes = [f"\n{name}: unavailable ({why})" for name, why in summary["unavailable"].items()]
    return "\n".join([table(rows), *notes])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval_reranker.py",
        description="Bi-encoder only vs each available reranker: Recall@k, MRR, latency, paired test.",
    )
    p.add_argument(
        "n", nargs="?", type=int, help="number of items (default all with gold in store)"
    )
    p.add_argument("--qa", help="QA file with gold_idx (default: the starter set)")
    p.add_argument("--passages", help="passages file to index first (load_corpus)")
    p.add_argument(
        "--rerankers",
        default=",".join(DEFAULT_RERANKERS),
        help=f"comma-separated, from {', '.join(RERANKERS)} (default {','.join(DEFAULT_RERANKERS)})",
    )
    p.add_argument("--query", choices=["question", "question+choices"], default="question")
    ec.add_cli_arguments(p, provider=False)
    return p


def run(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    if args.n is not None and args.n < 1:
        raise ValueError(f"N must be at least 1 (got {args.n})")
    names = ec.comma_list(args.rerankers, RERANKERS, "reranker")
    if BASELINE not in names:
        names.insert(0, BASELINE)
    # bad input: no index, no run folder
    qa_path, qa_items, passages = ec.read_inputs(args.qa, args.passages)
    ec.index_corpus(settings, passages, args.passages)
    items = ec.items_with_gold(qa_items, settings, qa_path)[: args.n]
    run_dir = ec.open_run("reranker", args.run_id, None, args.results_dir)
    config = {
        "script": "eval_reranker.py",
        "qa": str(qa_path),
        "passages": args.passages,
        "n_items": len(items),
        "query": args.query,
        "k": K,
        "embedding_model": settings.retrieval.embedding_model,
        "reranker_model": settings.retrieval.reranker_model,
        "retrieval": ec.retrieval_record(settings),
        "settings": ec.settings_record(settings),
    }
    run_dir.check_config(config, ("qa", "query", "embedding_model", "reranker_model"))
    unavailable: dict[str, str] = {}
    with run_dir.until_interrupted():  # Ctrl-C: the summary of the rows so far, then exit 130
        for name in names:
            try:  # one warm-up query loads the model: latency is timed warm
                rag_utils.retrieve_documents("warm-up query", k=K, reranker=name, settings=settings)
            except Exception as exc:  # reported as unavailable, not replaced
                unavailable[name] = f"{exc.__class__.__name__}: {exc}"
                logger.warning("reranker %s unavailable: %s", name, unavailable[name])
                continue
            run_dir.run(
                functools.partial(run_item, reranker=name, settings=settings, query=args.query),
                items,
                key=lambda it, name=name: (ec.item_id(it), name),
                desc=name,
                fatal=(Exception,),
            )
    summary = {
        "run_id": run_dir.run_id,
        "config": config,
        "rerankers": summarize(run_dir.rows, [n for n in names if n not in unavailable]),
        "unavailable": unavailable,
        "interrupted": run_dir.interrupted,
    }
    run_dir.write_json("summary.json", summary)
    run_dir.write_text(
        "summary.md", f"# Reranker comparison `{run_dir.run_id}`\n\n{render(summary)}\n"
    )
    if summary["rerankers"]:
        ec.plot_recall_curve(
            {n: m["recall_curve"] for n, m in summary["rerankers"].items()},
            run_dir.path / "recall_at_k.png",
            f"Recall@k by reranker — {run_dir.run_id}",
        )
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc, summary = ec.cli_run(args, lambda settings: run(args, settings))
    return rc or ec.print_summary(args, summary, lambda s: render(s, ec.text_table))


if __name__ == "__main__":
    run_script(main)
