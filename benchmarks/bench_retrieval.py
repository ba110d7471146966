"""Retrieval benchmarks: indexing throughput and memory, query latency, retrieval quality.

    python benchmarks/bench_retrieval.py                  # everything (about 10 minutes on 2 cores)
    python benchmarks/bench_retrieval.py --skip-synthetic # no 100K-passage corpus
    python benchmarks/bench_retrieval.py --json           # machine-readable

1. Indexing: ``load_corpus.load_passages`` of ../shared/data's 2,476 passages into a fresh temporary
   store with the default embedder (all-MiniLM-L6-v2, CPU); passages/s end to end (read file, load
   model, embed, upsert) and of the loader alone; peak resident memory (ru_maxrss) of the process.
2. Query latency p50/p95 of ``retrieve_documents_multi_query`` with 3 queries (k=5) at the shared
   corpus, and at a 100K-passage synthetic corpus. The synthetic texts recombine sentences of the
   shared corpus; their embeddings are random unit vectors (embedding 100K texts takes ~45 min
   here), so dense *quality* there is meaningless but the search cost is real. The BM25 index over
   the 100K synthetic texts is real (its build and reload times are reported).
3. Quality on ../shared/data/qa/barexam_dev.jsonl (gold_idx) against the full shared corpus:
   Recall@1/5/10 and MRR@10 for dense only, BM25 only and hybrid (RRF), with query = question
   (fact pattern + stem) and question + the four choices.

Results are also written to benchmarks/results/bench_retrieval.json.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import eval_common as ec
import load_corpus
import rag_utils
from settings import Settings, set_settings

RESULTS = REPO / "benchmarks" / "results" / "bench_retrieval.json"
METHODS = {"dense": "none", "bm25": "bm25", "hybrid": "hybrid"}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def bench_indexing(settings: Any, passages_path: Path) -> dict[str, Any]:

    t0 = time.perf_counter()
    passages = load_corpus.read_passages(passages_path)
    t_read = time.perf_counter() - t0
    rag_utils.get_embedder(settings)
    t_model = time.perf_counter() - t0 - t_read
    t1 = time.perf_counter()
    added = load_corpus.load_passages(passages, settings, progress=False)
    t_load = time.perf_counter() - t1
    total = time.perf_counter() - t0
    return {
        "passages": added,
        "read_s": round(t_read, 2),
        "model_load_s": round(t_model, 2),
        "embed_and_upsert_s": round(t_load, 2),
        "end_to_end_s": round(total, 2),
        "passages_per_s_end_to_end": round(added / total, 1),
        "passages_per_s_loader": round(added / t_load, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def bench_latency(
    settings: Any, question_triples: list[list[str]], rerankers: list[str], repeats: int
) -> dict[str, Any]:

    out: dict[str, Any] = {}
    for reranker in rerankers:
        rag_utils.retrieve_documents_multi_query(
            question_triples[0], k=5, reranker=reranker, settings=settings
        )
        times = []
        for i in range(repeats):
            queries = question_triples[i % len(question_triples)]
            t = time.perf_counter()
            rag_utils.retrieve_documents_multi_query(
                queries, k=5, reranker=reranker, settings=settings
            )
            times.append(time.perf_counter() - t)
        out[reranker] = {
            "p50_ms": round(1000 * ec.percentile(times, 0.5), 1),
            "p95_ms": round(1000 * ec.percentile(times, 0.95), 1),
            "n": len(times),
        }
    return out


def triples(items: list[dict]) -> list[list[str]]:
    """Three queries per item, as the agent sends them: the question, with choices, the stem."""
    return [
        [ec.item_question(it), ec.question_with_choices(it), str(it.get("question") or "")[:200]]
        for it in items
    ]


def bench_quality(settings: Any, qa: list[dict]) -> dict[str, Any]:

    store = rag_utils.get_store(settings)
    golds = {str(it["gold_idx"]) for it in qa if it.get("gold_idx")}
    present = {p["id"] for p in store.get(sorted(golds))}
    items = [it for it in qa if str(it.get("gold_idx")) in present]
    out: dict[str, Any] = {
        "items": len(items),
        "items_without_gold_in_corpus": len(qa) - len(items),
    }
    for variant, make in (
        ("question", ec.item_question),
        ("question+choices", ec.question_with_choices),
    ):
        for label, reranker in METHODS.items():
            hits = {1: 0, 5: 0, 10: 0}
            rr = 0.0
            for it in items:
                docs = rag_utils.retrieve_documents(
                    make(it), k=10, reranker=reranker, settings=settings
                )
                ids = [d["id"] for d in docs]
                gold = str(it["gold_idx"])
                if gold in ids:
                    rank = ids.index(gold) + 1
                    rr += 1.0 / rank
                    for k in hits:
                        hits[k] += rank <= k
            n = max(1, len(items))
            out[f"{variant}/{label}"] = {
                "recall@1": round(hits[1] / n, 3),
                "recall@5": round(hits[5] / n, 3),
                "recall@10": round(hits[10] / n, 3),
                "mrr@10": round(rr / n, 3),
            }
    return out


def synthetic_texts(passages: list[dict], n: int, seed: int = 13) -> list[str]:
    sentences = [
        s.strip()
        for p in passages
        for s in re.split(r"(?<=[.;:])\s+", p["text"])
        if len(s.split()) >= 5
    ]
    rng = random.Random(seed)
    return [" ".join(rng.sample(sentences, 3)) for _ in range(n)]


def bench_synthetic(
    settings: Any, passages: list[dict], n: int, question_triples: list[list[str]], repeats: int
) -> dict[str, Any]:
    import numpy as np

    texts = synthetic_texts(passages, n)
    dim = rag_utils.get_embedder(settings).dimension
    rng = np.random.default_rng(0)
    store = rag_utils.get_store(settings)
    t0 = time.perf_counter()
    step = 5000
    for i in range(0, n, step):
        vecs = rng.standard_normal((min(step, n - i), dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        ids = [f"syn_{j:06d}" for j in range(i, i + len(vecs))]
        metas = [
            {"source": "caselaw-synthetic" if j % 2 else "synthetic"}
            for j in range(i, i + len(vecs))
        ]
        store.upsert(ids, texts[i : i + len(vecs)], metas, vecs)
    t_insert = time.perf_counter() - t0
    t1 = time.perf_counter()
    rag_utils.get_bm25(settings, store)
    t_bm25_build = time.perf_counter() - t1
    rag_utils.reset_caches()  # a new process: the saved index is loaded, not rebuilt
    t2 = time.perf_counter()
    rag_utils.get_bm25(settings)
    t_bm25_load = time.perf_counter() - t2
    latency = bench_latency(settings, question_triples, ["none", "hybrid"], repeats)
    return {
        "passages": rag_utils.corpus_count(settings),
        "embeddings": "random unit vectors (texts are real sentence recombinations)",
        "chroma_insert_s": round(t_insert, 1),
        "bm25_build_s": round(t_bm25_build, 1),
        "bm25_reload_s": round(t_bm25_load, 2),
        "latency_3_queries_k5": latency,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--shared-data", default=str(REPO.parent / "shared" / "data"), help="../shared/data"
    )
    p.add_argument("--synthetic", type=int, default=100_000, help="synthetic corpus size")
    p.add_argument("--repeats", type=int, default=40, help="timed queries per configuration")
    p.add_argument("--skip-synthetic", action="store_true")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--json", action="store_true", help="print JSON only")
    args = p.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING)

    data = Path(args.shared_data)
    passages_path = data / "corpus" / "passages.jsonl"
    qa_path = data / "qa" / "barexam_dev.jsonl"
    if not passages_path.exists():
        print(f"error: {passages_path} not found (give --shared-data)", file=sys.stderr)
        return 2
    qa = load_corpus.read_qa(qa_path)
    results: dict[str, Any] = {"machine": {"cpus": __import__("os").cpu_count()}}

    def say(msg: str) -> None:
        if not args.json:
            print(msg, flush=True)

    with tempfile.TemporaryDirectory(prefix="bench_retrieval_") as tmp:
        shared = Settings.from_env(env={}, chroma_dir=str(Path(tmp) / "shared"))
        set_settings(shared)
        say(f"indexing {passages_path} with the default embedder ...")
        results["indexing"] = idx = bench_indexing(shared, passages_path)
        say(
            f"  {idx['passages']} passages: {idx['passages_per_s_end_to_end']} passages/s end to end "
            f"({idx['end_to_end_s']} s incl. {idx['model_load_s']} s model load), "
            f"{idx['passages_per_s_loader']} passages/s embed+upsert; peak RSS {idx['peak_rss_mb']} MB"
        )
        qt = triples(qa)
        results["latency_shared"] = lat = bench_latency(
            shared, qt, ["none", "hybrid"], args.repeats
        )
        say(f"latency, 3 queries, k=5, {idx['passages']} passages: " + json.dumps(lat))
        if not args.skip_quality:
            say(f"quality on {qa_path.name} ...")
            results["quality"] = q = bench_quality(shared, qa)
            say(f"  items with gold passage in corpus: {q['items']}")
            say(f"  {'query / method':<28} R@1    R@5    R@10   MRR@10")
            for key, m in q.items():
                if isinstance(m, dict):
                    say(
                        f"  {key:<28} {m['recall@1']:<6} {m['recall@5']:<6} {m['recall@10']:<6} {m['mrr@10']}"
                    )
        if not args.skip_synthetic:
            say(
                f"synthetic corpus of {args.synthetic} passages (random unit-vector embeddings) ..."
            )
            syn = Settings.from_env(env={}, chroma_dir=str(Path(tmp) / "synthetic"))
            set_settings(syn)
            passages = load_corpus.read_passages(passages_path)
            results["synthetic"] = s = bench_synthetic(
                syn, passages, args.synthetic, qt, args.repeats
            )
            say(
                f"  insert {s['chroma_insert_s']} s, BM25 build {s['bm25_build_s']} s, reload "
                f"{s['bm25_reload_s']} s; latency: "
                + json.dumps(s["latency_3_queries_k5"])
                + f"; peak RSS {s['peak_rss_mb']} MB"
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"written to {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
