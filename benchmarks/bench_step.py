"""What one research step costs without the LLM: its search, the injection screen and the
evidence gate (``nodes.executor``), on the starter corpus.

    python benchmarks/bench_step.py               # 8 doctrines, 5 repetitions
    python benchmarks/bench_step.py --repeats 9   # more repetitions (a shared CPU is noisy)
    python benchmarks/bench_step.py --json        # machine-readable

The steps are the planner's: one per issue of the fact patterns of datasets/fact_patterns.jsonl
(the first ``--steps`` distinct doctrines), built with ``nodes.step_for`` from the issue's name
and its closest fact sentences (``answer.issue_facts``, as the planner picks them), each run by
``nodes.executor`` with the context the CLI builds (``AgentContext.from_settings``: the default
store, the starter corpus indexed on first use).  Each step is also run as its retry angle (the
one ``nodes.replanner`` builds: BM25 over the issue's names and facts).  One untimed pass loads
the embedder, the BM25 index and the exact-search matrix; then every step runs ``--repeats``
times and the median milliseconds per step are reported, with what a step asks of the embedder
(calls, texts, how often the step's doctrinal question is among them) and how often it reads
passage vectors from the store (``PassageStore.get(..., with_embeddings=True)``).

Gate check: for each first-angle step of every doctrine, the evidence score (best cosine of the
doctrinal question to a kept passage) and the confidence (mean of the first two) from the
passages' ``dense_score`` (the search's batched embedding of its queries) against
``rag_utils.passage_cosines`` (the question embedded alone); the differences are reported, and
the steps that the two put on different sides of LEAN_GATE.  Results are also written to
benchmarks/results/bench_step.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import printer, save

import answer as answer_stage
import load_corpus
import nodes
import question as question_mod
import rag_utils
from context import AgentContext
from settings import Settings, load_dotenv_file

FACT_PATTERNS = REPO / "datasets" / "fact_patterns.jsonl"


class Counts:
    """Embedder calls and passage-vector reads, counted by :func:`instrument`."""

    def __init__(self) -> None:
        self.embed_calls = 0
        self.texts: list[str] = []
        self.vector_reads = 0

    def take(self) -> tuple[int, list[str], int]:
        out = (self.embed_calls, self.texts, self.vector_reads)
        self.__init__()
        return out


def instrument(settings: Settings, counts: Counts) -> None:
    """Count every call of the embedder (``embed_query`` goes through ``embed_documents``) and
    every read of passage vectors from the store."""
    embedder = rag_utils.get_embedder(settings)
    inner = embedder.embed_documents

    def embed_documents(texts: Any, *args: Any, **kwargs: Any) -> Any:
        counts.embed_calls += 1
        counts.texts.extend(str(t) for t in texts)
        return inner(texts, *args, **kwargs)

    embedder.embed_documents = embed_documents
    get = rag_utils.PassageStore.get

    def counting_get(self: Any, ids: Any, with_embeddings: bool = False) -> Any:
        counts.vector_reads += bool(with_embeddings)
        return get(self, ids, with_embeddings)

    rag_utils.PassageStore.get = counting_get


def planned_steps(ctx: AgentContext, n: int) -> list[dict]:
    """One first-angle step per distinct doctrine of the fact patterns (the first ``n``)."""
    steps: list[dict] = []
    seen: set[str] = set()
    for line in FACT_PATTERNS.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        facts, _ = question_mod.split_question(item["question"])
        for issue in item.get("issues") or []:
            name = " ".join(str(issue["name"]).split())
            if name.lower() in seen or len(steps) >= n:
                continue
            seen.add(name.lower())
            picked = answer_stage.issue_facts(name, facts, ctx.embed) if facts else []
            steps.append(nodes.step_for(len(steps) + 1, name, picked))
    return steps


def retry_of(step: dict, ctx: AgentContext) -> dict:
    """The retry angle the replanner builds for ``step`` once it failed the gate."""
    failed = {**step, "status": "failed", "execution": {"gated": True}}
    update = nodes.replanner.step({"planning_table": [failed], "chain_of_thought": []}, ctx)[0]
    return update["planning_table"][0]


def run_step(step: dict, ctx: AgentContext, counts: Counts) -> dict[str, Any]:
    asked = nodes.issue_question(nodes.issue_names(step["issue"])[0])
    counts.take()
    t0 = time.perf_counter()
    update, _ = nodes.executor.step({"planning_table": [step]}, ctx)
    ms = (time.perf_counter() - t0) * 1000
    calls, texts, reads = counts.take()
    execution = update["planning_table"][0]["execution"]
    return {
        "ms": ms,
        "embed_calls": calls,
        "texts_embedded": len(texts),
        "question_embedded": sum(t.strip() == asked for t in texts),
        "vector_reads": reads,
        "evidence_score": execution["evidence_score"],
        "confidence": execution["confidence"],
    }


def gate_check(steps: list[dict], ctx: AgentContext) -> dict[str, Any]:
    """The gate's numbers from the search's ``dense_score`` against ``passage_cosines``, and the
    steps whose side of LEAN_GATE differs between the two."""
    d_evidence, d_confidence, rows = [], [], []
    k, gate = ctx.settings.agent.retrieval_k, ctx.settings.agent.lean_gate
    for step in steps:
        strategy = step["strategy"]
        asked = nodes.issue_question(nodes.issue_names(step["issue"])[0])
        retrieved = ctx.search(
            strategy["search_type"], strategy["queries"], k + ctx.flag_headroom, []
        )
        docs, _ = ctx.keep_clean(retrieved, k)
        if not docs or any(d.get("dense_score") is None for d in docs):
            continue
        dense = [float(d["dense_score"]) for d in docs]
        alone = [float(c) for c in rag_utils.passage_cosines(asked, docs, ctx.settings)]
        d_evidence.append(abs(max(dense) - max(alone)))
        d_confidence.append(abs(statistics.fmean(dense[:2]) - statistics.fmean(alone[:2])))
        rows.append({"issue": step["issue"], "evidence": max(alone), "dense": max(dense)})
    return {
        "steps": len(rows),
        "gate": gate,
        "flips": [r for r in rows if (r["evidence"] < gate) != (r["dense"] < gate)],
        "mean_diff_evidence": statistics.fmean(d_evidence) if d_evidence else None,
        "max_abs_diff_evidence": max(d_evidence, default=None),
        "max_abs_diff_confidence": max(d_confidence, default=None),
        "rows": rows,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def per_step(key: str) -> float:
        return round(statistics.fmean(r[key] for r in runs), 2)

    ms = [r["ms"] for r in runs]
    return {
        "runs": len(runs),
        "median_ms": round(statistics.median(ms), 2),
        "p90_ms": round(sorted(ms)[int(0.9 * (len(ms) - 1))], 2),
        "embed_calls_per_step": per_step("embed_calls"),
        "texts_embedded_per_step": per_step("texts_embedded"),
        "question_embedded_per_step": per_step("question_embedded"),
        "vector_reads_per_step": per_step("vector_reads"),
    }


def run(args: argparse.Namespace, say: Any) -> dict[str, Any]:
    load_dotenv_file()
    settings = Settings.from_env(llm_cache=False)  # timings of the model, not of the cache
    added = load_corpus.ensure_starter_index(settings)
    if added:
        say(f"indexed the starter corpus: {added} passages")
    ctx = AgentContext.from_settings(settings)
    counts = Counts()
    instrument(settings, counts)
    first = planned_steps(ctx, args.steps)
    kinds = {"first": first, "retry": [retry_of(s, ctx) for s in first]}
    say(
        f"{len(first)} doctrines on {rag_utils.corpus_count(settings)} passages "
        f"({rag_utils.get_embedder(settings).backend} embedder, reranker "
        f"{rag_utils.resolve_reranker(None, settings)}); {args.repeats} repetitions"
    )
    for steps in kinds.values():  # untimed: models, BM25, the exact-search matrix
        for step in steps:
            run_step(step, ctx, counts)
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for _ in range(args.repeats):
        for kind, steps in kinds.items():
            runs[kind].extend(run_step(step, ctx, counts) for step in steps)
    return {
        "doctrines": [s["issue"] for s in first],
        "repeats": args.repeats,
        "passages": rag_utils.corpus_count(settings),
        **{kind: summarize(r) for kind, r in runs.items()},
        "gate": {
            kind: [[r["evidence_score"], r["confidence"]] for r in runs[kind][: len(first)]]
            for kind in kinds
        },
        "gate_check": gate_check(planned_steps(ctx, args.check_steps), ctx),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=8, help="distinct doctrines (8)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of every step (5)")
    p.add_argument(
        "--check-steps", type=int, default=100, help="doctrines of the gate check (100: all)"
    )
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/")
    args = p.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.ERROR)

    say = printer(args.json)
    result = run(args, say)
    if not args.no_save:
        save("bench_step", result)
    if args.json:
        print(json.dumps(result, indent=2))
    for kind in ("first", "retry"):
        r = result[kind]
        say(
            f"{kind} angle: median {r['median_ms']} ms/step (p90 {r['p90_ms']}, {r['runs']} runs); "
            f"per step {r['embed_calls_per_step']} embedder calls ({r['texts_embedded_per_step']} "
            f"texts, the question {r['question_embedded_per_step']}x), "
            f"{r['vector_reads_per_step']} passage-vector reads"
        )
    check = result["gate_check"]
    if not check["steps"]:
        return 0
    say(
        f"gate from the search's dense scores vs the question embedded alone ({check['steps']} "
        f"steps): |diff| evidence mean {check['mean_diff_evidence']:.2e}, max "
        f"{check['max_abs_diff_evidence']:.2e}; confidence max "
        f"{check['max_abs_diff_confidence']:.2e}; {len(check['flips'])} step(s) on the other "
        f"side of LEAN_GATE {check['gate']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
