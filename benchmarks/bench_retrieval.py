"""Retrieval benchmarks: indexing throughput and memory, query latency, retrieval quality.

    python benchmarks/bench_retrieval.py                  # everything (about 10 minutes on 2 cores)
    python benchmarks/bench_retrieval.py --skip-synthetic # no 100K-passage corpus
    python benchmarks/bench_retrieval.py --json           # machine-readable

1. Indexing, per embedding backend (int8 ONNX and torch), each in its own process:
   ``load_corpus.load_passages`` of ../shared/data's 2,476 passages into a fresh temporary store with
   the default embedder (all-MiniLM-L6-v2, CPU); passages/s end to end (read file, load model,
   embed, upsert) and of the loader alone; peak resident memory (ru_maxrss) of that process. Then
   the cosine between the two backends' vectors of every passage, and Recall@10 of each backend's
   index, and of the torch index searched with ONNX query vectors (a mixed index).
2. Query latency p50/p95 of ``retrieve_documents_multi_query`` with 3 queries (k=5) at the shared
   corpus, and at a 100K-passage synthetic corpus, for two kinds of query: bar-length (the
   question, with its choices, the stem: the worst case, embedding-bound) and the agent's own
   rewrites (``benchmarks/agent_queries.jsonl``: what a research step sends). The synthetic texts recombine sentences of the
   shared corpus; their embeddings are random unit vectors (embedding 100K texts takes ~45 min
   here), so dense *quality* there is meaningless but the search cost is real. The BM25 index over
   the 100K synthetic texts is real (its build and reload times are reported).
3. Quality on ../shared/data/qa/barexam_dev.jsonl (gold_idx) against the full shared corpus:
   Recall@1/5/10 and MRR@10 for dense only, BM25 only and hybrid (RRF), with query = question
   (fact pattern + stem) and question + the four choices.
4. Fusion tuned honestly: FUSION_DENSE_WEIGHT from 0 to 1, Recall@10 with the question alone on
   the tuning half of barexam_dev (even positions in the file) and the report half (odd positions);
   the weight is chosen on the tuning half only.
5. Passage windows: dense Recall@10 with passages embedded whole (truncated) or as overlapping
   windows of 128 and 254 tokens, scored per passage by the max or the mean of its windows, each
   with the plain cosine and with the query centred on the passage vectors' mean (DENSE_CENTERING).

Results are also written to benchmarks/results/bench_retrieval.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np
from common import ms, peak_rss_mb, printer, save, shared_paths

import eval_common as ec
import load_corpus
import rag_utils
from settings import Settings

METHODS = {"dense": "none", "bm25": "bm25", "hybrid": "hybrid"}


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
        out[reranker] = {"p50_ms": ms(times, 0.5), "p95_ms": ms(times, 0.95), "n": len(times)}
    return out


def triples(items: list[dict]) -> list[list[str]]:
    """Three bar-length queries per item (the worst case: two are near the embedder's 256-token
    limit): the question, with choices, the stem."""
    return [
        [ec.item_question(it), ec.question_with_choices(it), str(it.get("question") or "")[:200]]
        for it in items
    ]


AGENT_QUERIES = Path(__file__).with_name("agent_queries.jsonl")
"""Query triples the agent really sent: the embedded model's rewrites (primary + alternatives) of
research steps on the open questions and Bar Exam QA dev questions."""


def agent_triples(path: Path = AGENT_QUERIES) -> list[list[str]]:
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [list(r["queries"]) for r in rows]


def latency_sets(settings: Any, bar: list[list[str]], repeats: int) -> dict[str, Any]:
    """3-query latency for bar-length queries and for the agent's own (short) rewrites."""
    return {
        "bar_questions": bench_latency(settings, bar, ["none", "hybrid"], repeats),
        "agent_rewrites": bench_latency(settings, agent_triples(), ["none", "hybrid"], repeats),
    }


def bench_quality(settings: Any, qa: list[dict]) -> dict[str, Any]:
    items = gold_items(settings, qa)
    out: dict[str, Any] = {
        "items": len(items),
        "items_without_gold_in_corpus": len(qa) - len(items),
    }
    for variant, make in (
        ("question", ec.item_question),
        ("question+choices", ec.question_with_choices),
    ):
        for label, reranker in METHODS.items():
            scores = [
                ec.retrieval_metrics(ranked(settings, make(it), reranker), [str(it["gold_idx"])])
                for it in items
            ]
            n = max(1, len(items))
            out[f"{variant}/{label}"] = {
                **{m: round(sum(s[m] for s in scores) / n, 3) for m in RECALLS},
                "mrr@10": round(sum(s["rr"] for s in scores) / n, 3),
            }
    return out


RECALLS = ("recall@1", "recall@5", "recall@10")


def ranked(settings: Any, query: str, reranker: str) -> list[str]:
    docs = rag_utils.retrieve_documents(query, k=10, reranker=reranker, settings=settings)
    return [d["id"] for d in docs]


def recall_at_10(settings: Any, items: list[dict], make: Any, reranker: str) -> float:
    hits = sum(str(it["gold_idx"]) in ranked(settings, make(it), reranker) for it in items)
    return round(hits / max(1, len(items)), 3)


def gold_items(settings: Any, qa: list[dict]) -> list[dict]:
    golds = sorted({str(it["gold_idx"]) for it in qa if it.get("gold_idx")})
    present = {p["id"] for p in rag_utils.get_store(settings).get(golds)}
    return [it for it in qa if str(it.get("gold_idx")) in present]


def bench_fusion(settings: Any, qa: list[dict]) -> dict[str, Any]:
    """Weighted RRF: the dense weight chosen on the even half of barexam_dev, reported on the odd."""
    present = {id(it) for it in gold_items(settings, qa)}
    halves = {
        "tune": [it for i, it in enumerate(qa) if i % 2 == 0 and id(it) in present],
        "report": [it for i, it in enumerate(qa) if i % 2 == 1 and id(it) in present],
    }
    grid: dict[str, dict[str, float]] = {}
    for w in [round(0.1 * i, 1) for i in range(11)]:
        s = settings.replace(fusion_dense_weight=w)
        grid[str(w)] = {
            h: recall_at_10(s, items, ec.item_question, "hybrid") for h, items in halves.items()
        }
    best = max(grid, key=lambda w: (grid[w]["tune"], -abs(float(w) - 0.5)))
    report = halves["report"]
    return {
        "items": {h: len(v) for h, v in halves.items()},
        "recall@10_by_weight": grid,
        "chosen_weight": float(best),
        "report_half": {
            "hybrid_chosen": grid[best]["report"],
            "hybrid_0.5": grid["0.5"]["report"],
            "dense": recall_at_10(settings, report, ec.item_question, "none"),
            "bm25": recall_at_10(settings, report, ec.item_question, "bm25"),
        },
    }


WINDOW_OVERLAP = 0.25
"""Share of each passage window repeated in the next one."""


def passage_windows(text: str, spans: list[tuple[int, int]], window: int, limit: int) -> list[str]:
    """``text`` as overlapping windows of ``window`` tokens (``spans``: each token's character
    span), or ``[text]`` when its tokens fit in ``limit``. The product embeds passages whole (the
    mean of windows did not help here, so the PASSAGE_WINDOW_TOKENS knob was removed) and chunks
    long documents to fit the model instead (documents.py)."""
    if len(spans) <= limit or window <= 0:
        return [text]
    stride = max(1, int(window * (1 - WINDOW_OVERLAP)))
    out = []
    for start in range(0, len(spans), stride):
        chunk = spans[start : start + window]
        out.append(text[chunk[0][0] : chunk[-1][1]])
        if start + window >= len(spans):
            break
    return out


def bench_windows(
    settings: Any, passages: list[dict], qa: list[dict], sizes: tuple[int, ...] = (128, 254)
) -> dict[str, Any]:
    """Dense Recall@10 (question alone) with long passages as windows, scored by max or mean."""
    emb = rag_utils.get_embedder(settings)
    ids = [str(p["idx"]) for p in passages]
    texts = [p["text"] for p in passages]
    row = {pid: i for i, pid in enumerate(ids)}
    items = [it for it in qa if str(it.get("gold_idx")) in row]
    gold = np.asarray([row[str(it["gold_idx"])] for it in items])
    queries = emb.embed_documents([ec.item_question(it) for it in items])
    limit = emb.max_tokens - 2
    spans = [emb.token_spans(t) for t in texts]

    def recall(scores: Any) -> float:
        top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
        return round(float(np.mean([g in t for g, t in zip(gold, top, strict=True)])), 3)

    def centred(passage_vecs: Any) -> Any:
        """The queries centred on these passage vectors' mean, as DENSE_CENTERING ranks."""
        return rag_utils.centered_queries(queries, passage_vecs.mean(axis=0))

    whole = emb.embed_documents(texts)
    out: dict[str, Any] = {
        "items": len(items),
        "passages_longer_than_the_model_window": sum(len(s) > limit for s in spans),
        "whole (truncated)": recall(queries @ whole.T),
        "whole (truncated), centred": recall(centred(whole) @ whole.T),
    }
    for size in sizes:
        pieces, owner = [], []
        for i, (t, sp) in enumerate(zip(texts, spans, strict=True)):
            for piece in passage_windows(t, sp, size, limit):
                pieces.append(piece)
                owner.append(i)
        owner_arr = np.asarray(owner)
        vecs = emb.embed_documents(pieces)
        sims = queries @ vecs.T
        best = np.full((len(items), len(texts)), -np.inf, dtype=np.float32)
        np.maximum.at(best.T, owner_arr, sims.T)
        mean_vec = np.zeros_like(whole)
        np.add.at(mean_vec, owner_arr, vecs)
        mean_vec /= np.linalg.norm(mean_vec, axis=1, keepdims=True)
        c_sims = centred(vecs) @ vecs.T
        c_best = np.full((len(items), len(texts)), -np.inf, dtype=np.float32)
        np.maximum.at(c_best.T, owner_arr, c_sims.T)
        out[f"{size}-token windows"] = {
            "windows": len(pieces),
            "max": recall(best),
            "mean vector": recall(queries @ mean_vec.T),
            "max, centred": recall(c_best),
            "mean vector, centred": recall(centred(mean_vec) @ mean_vec.T),
        }
    return out


def index_in_subprocess(backend: str, chroma_dir: str, passages_path: Path) -> dict[str, Any]:
    """Index the shared corpus with one backend in a fresh process, so its peak RSS is its own."""
    cmd = [sys.executable, __file__, "--index-only", backend, "--chroma-dir", chroma_dir]
    cmd += ["--shared-data", str(passages_path.parent.parent)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_backends(settings: Any, tmp: Path, passages_path: Path, qa: list[dict]) -> dict[str, Any]:
    """Indexing speed and memory per backend, their cosine, and Recall@10 of each index."""
    out: dict[str, Any] = {}
    dirs = {}
    for backend in ("onnx", "torch"):
        dirs[backend] = str(tmp / f"index-{backend}")
        out[backend] = {"indexing": index_in_subprocess(backend, dirs[backend], passages_path)}
    by = {b: settings.replace(chroma_dir=dirs[b], embedding_backend=b) for b in dirs}
    ids = [str(p["idx"]) for p in load_corpus.read_passages(passages_path)]
    vecs = {}
    for b, s in by.items():
        stored = rag_utils.get_store(s).get(ids, with_embeddings=True)
        vecs[b] = {p["id"]: p["embedding"] for p in stored}
        items = gold_items(s, qa)
        out[b]["recall@10"] = {
            "dense, question": recall_at_10(s, items, ec.item_question, "none"),
            "hybrid, question": recall_at_10(s, items, ec.item_question, "hybrid"),
        }
    common = sorted(set(vecs["onnx"]) & set(vecs["torch"]))
    a = np.asarray([vecs["onnx"][i] for i in common], dtype=np.float32)
    t = np.asarray([vecs["torch"][i] for i in common], dtype=np.float32)
    cos = (a * t).sum(axis=1)
    out["cosine_onnx_vs_torch"] = {
        "min": round(float(cos.min()), 4),
        "p5": round(float(np.percentile(cos, 5)), 4),
        "mean": round(float(cos.mean()), 4),
    }
    mixed = by["torch"].replace(embedding_backend="onnx")  # torch index, ONNX queries
    items = gold_items(mixed, qa)
    out["mixed: torch index, onnx queries"] = {
        "dense, question": recall_at_10(mixed, items, ec.item_question, "none")
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
    latency = latency_sets(settings, question_triples, repeats)
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
    p.add_argument("--skip-backends", action="store_true", help="index with the default only")
    p.add_argument("--skip-fusion", action="store_true")
    p.add_argument("--skip-windows", action="store_true")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--index-only", metavar="BACKEND", help=argparse.SUPPRESS)
    p.add_argument("--chroma-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING)

    if (paths := shared_paths(args.shared_data)) is None:
        return 2
    passages_path, qa_path = paths
    if args.index_only:  # the child process of bench_backends: index, print one JSON line
        s = Settings.from_env(env={}, chroma_dir=args.chroma_dir, embedding_backend=args.index_only)
        print(json.dumps(bench_indexing(s, passages_path)))
        return 0
    qa = load_corpus.read_qa(qa_path)
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}}
    say = printer(args.json)
    with tempfile.TemporaryDirectory(prefix="bench_retrieval_") as tmp:
        default = Settings.from_env(env={})
        t0 = time.perf_counter()
        rag_utils.get_embedder(default)  # the one-time ONNX export, not counted as indexing
        say(
            f"default embedder ready ({rag_utils.resolve_embedding_backend(default)}) in "
            f"{time.perf_counter() - t0:.1f} s (includes the ONNX export on a first run)"
        )
        if args.skip_backends:
            shared = default.replace(chroma_dir=str(Path(tmp) / "shared"))
            results["indexing"] = {"default": bench_indexing(shared, passages_path)}
        else:
            say(f"indexing {passages_path} with each backend, each in its own process ...")
            results["backends"] = bk = bench_backends(default, Path(tmp), passages_path, qa)
            results["indexing"] = {b: bk[b]["indexing"] for b in ("onnx", "torch")}
            say(f"  cosine of ONNX to torch passage vectors: {bk['cosine_onnx_vs_torch']}")
            for b in ("onnx", "torch"):
                say(f"  {b} Recall@10: {bk[b]['recall@10']}")
            say(
                f"  torch index searched with ONNX queries: {bk['mixed: torch index, onnx queries']}"
            )
            shared = default.replace(
                chroma_dir=str(Path(tmp) / f"index-{rag_utils.resolve_embedding_backend(default)}")
            )
        for b, idx in results["indexing"].items():
            say(
                f"  {b}: {idx['passages']} passages, {idx['passages_per_s_end_to_end']} passages/s "
                f"end to end ({idx['end_to_end_s']} s incl. {idx['model_load_s']} s model load), "
                f"{idx['passages_per_s_loader']} passages/s embed+upsert; peak RSS "
                f"{idx['peak_rss_mb']} MB"
            )
        idx = next(iter(results["indexing"].values()))
        qt = triples(qa)
        results["latency_shared"] = lat = latency_sets(shared, qt, args.repeats)
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
        if not args.skip_fusion:
            say("fusion weight, chosen on the even half of barexam_dev, reported on the odd half")
            results["fusion"] = fu = bench_fusion(shared, qa)
            for w, r in fu["recall@10_by_weight"].items():
                say(f"  FUSION_DENSE_WEIGHT={w:<4} R@10 tune {r['tune']:<6} report {r['report']}")
            say(f"  chosen {fu['chosen_weight']}; report half: {json.dumps(fu['report_half'])}")
        if not args.skip_windows:
            say("passage windows (dense, question alone) ...")
            passages = load_corpus.read_passages(passages_path)
            results["windows"] = wi = bench_windows(shared, passages, qa)
            say("  " + json.dumps(wi))
        if not args.skip_synthetic:
            say(
                f"synthetic corpus of {args.synthetic} passages (random unit-vector embeddings) ..."
            )
            syn = Settings.from_env(env={}, chroma_dir=str(Path(tmp) / "synthetic"))
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
    path = save("bench_retrieval", results)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"written to {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
