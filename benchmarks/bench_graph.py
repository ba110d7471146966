"""Knowledge-graph benchmarks (legal_graph.py).

    python benchmarks/bench_graph.py build [--passages FILE] [--engine ladybug]
        build a fresh embedded graph from a passages file (no vector store): seconds, size on
        disk, nodes/edges by type, Cypher p95 of the keyword and principles expansions
    python benchmarks/bench_graph.py engines [--passages FILE]
        the same for every installed Kùzu-lineage engine (ladybug, kuzu, ryugraph), one process each
    python benchmarks/bench_graph.py coverage [--passages FILE ...]
        share of passages that mention at least one doctrine / cite at least one authority
    python benchmarks/bench_graph.py latency [--qa FILE]
        p50/p95 of each graph mode's search with the query already embedded (CHROMA_DIR)
    python benchmarks/bench_graph.py retrieval [--qa FILE] [--modes ...]
        phase-1 Recall@1/5/10 and MRR of dense, BM25, hybrid and the graph modes on the QA set,
        against the passages already loaded (CHROMA_DIR), and each mode's query latency p50/p95

Default passages: ../shared/data/corpus/passages.jsonl when present, else the starter corpus.
Results are merged into benchmarks/results/bench_graph.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import ms, save, saved

import eval_common as ec
import legal_graph as lg
import load_corpus
from settings import Settings

SHARED = REPO.parent / "shared" / "data"
EMBEDDED_ENGINES = ("ladybug", "kuzu", "ryugraph")
"""Python packages of the Kùzu lineage with the same API (``Database``, ``Connection``), compared
by ``engines``; the product opens ``legal_graph.ENGINE`` only."""


def default_passages() -> Path:
    shared = SHARED / "corpus" / "passages.jsonl"
    return shared if shared.exists() else REPO / "datasets" / "starter" / "passages.jsonl"


def default_qa() -> Path:
    shared = SHARED / "qa" / "barexam_dev.jsonl"
    return shared if shared.exists() else REPO / "datasets" / "starter" / "qa.jsonl"


def dir_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cmd_build(args: argparse.Namespace) -> dict[str, Any]:
    passages = [rec for _, rec in load_corpus.iter_rows(args.passages)]
    questions = [ec.item_question(q) for q in ec.load_qa(default_qa())]
    with tempfile.TemporaryDirectory() as tmp:
        lg.ENGINE = args.engine  # this process measures one engine
        s = Settings.from_env(env={}, chroma_dir=tmp)
        start = time.perf_counter()
        g = lg.get_graph(s, write=True)
        opened = time.perf_counter() - start
        lg.add_passages(passages, s, backend=g)
        seconds = time.perf_counter() - start
        counts = lg.graph_counts(g)
        lat: dict[str, list[float]] = {"keyword": [], "principles": []}
        for q in questions:  # the Cypher side only (no embedding, no store)
            t = time.perf_counter()
            lg._keyword(g, q, [])
            lat["keyword"].append(time.perf_counter() - t)
            t = time.perf_counter()
            lg._keyword(g, q, [], hop=True)
            lat["principles"].append(time.perf_counter() - t)
        lg.close_graphs()
        path = lg.graph_path(s)
        size = sum(dir_size(p) for p in path.parent.glob(path.name + "*"))
    spec = importlib.util.find_spec(args.engine)
    pkg = Path(spec.origin).parent if spec and spec.origin else None
    from importlib.metadata import version

    return {
        "engine": args.engine,
        "version": version(args.engine),
        "install_mb": round(dir_size(pkg) / 2**20, 1) if pkg else None,
        "passages": len(passages),
        "build_s": round(seconds, 2),
        "schema_and_taxonomy_s": round(opened, 2),
        "db_mb": round(size / 2**20, 1),
        "keyword_p50_ms": ms(lat["keyword"], 0.5, 2),
        "keyword_p95_ms": ms(lat["keyword"], 0.95, 2),
        "principles_p95_ms": ms(lat["principles"], 0.95, 2),
        "queries": len(questions),
        **counts,
    }


def cmd_engines(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for engine in EMBEDDED_ENGINES:
        if importlib.util.find_spec(engine) is None:
            print(f"{engine}: not installed, skipped", file=sys.stderr)
            continue
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "build",
                "--engine",
                engine,
                "--passages",
                str(args.passages),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            rows.append({"engine": engine, "error": out.stderr.strip().splitlines()[-1:]})
            continue
        rows.append(json.loads(out.stdout))
    return rows


def cmd_coverage(args: argparse.Namespace) -> dict[str, Any]:
    tax = lg.load_taxonomy()
    out = {}
    for path in args.passages_list or [default_passages()]:
        facts = [lg.extract(p, tax) for _, p in load_corpus.iter_rows(path)]
        n = len(facts)
        out["shared" if Path(path).parent.name == "corpus" else Path(path).parent.name] = {
            "passages": n,
            "with_doctrine": sum(bool(f.doctrines) for f in facts),
            "with_doctrine_share": round(sum(bool(f.doctrines) for f in facts) / n, 3),
            "with_authority": sum(bool(f.authorities) for f in facts),
            "doctrines_used": len({d for f in facts for d in f.doctrines}),
            "doctrines": len(tax),
        }
    return out


def _ranked(mode: str, query: str, s: Settings, k: int) -> list[str]:
    import rag_utils

    if mode in ("dense", "bm25", "hybrid"):
        reranker = "none" if mode == "dense" else mode
        docs = rag_utils.retrieve_documents_multi_query([query], k=k, reranker=reranker, settings=s)
        return [d["id"] for d in docs]
    if mode == "combined":
        return [d["id"] for d in lg.graph_search(query, k, mode="combined", settings=s)]
    return [h.id for h in lg.search_graph(query, k, mode=mode, settings=s)]


def cmd_retrieval(args: argparse.Namespace) -> dict[str, Any]:
    s = Settings.from_env()
    items, _ = ec.split_by_gold_in_store(ec.load_qa(args.qa), s)
    for mode in args.modes:  # warm up models, indexes and caches outside the timings
        _ranked(mode, ec.item_question(items[0]), s, 10)
    out: dict[str, Any] = {"qa": str(args.qa), "items": len(items), "modes": {}}
    for mode in args.modes:
        ranks, seconds = [], []
        for q in items:
            t = time.perf_counter()
            ranked = _ranked(mode, ec.item_question(q), s, 10)
            seconds.append(time.perf_counter() - t)
            ranks.append(ec.retrieval_metrics(ranked, ec.gold_ids(q)))
        out["modes"][mode] = {
            **{m: round(statistics.mean(r[m] for r in ranks), 3) for m in ranks[0]},
            "p50_ms": ms(seconds, 0.5),
            "p95_ms": ms(seconds, 0.95, 2),
        }
        print(mode, out["modes"][mode], file=sys.stderr)
    return out


def cmd_latency(args: argparse.Namespace) -> dict[str, Any]:
    """Per graph mode, the search's own time: the query is embedded first (outside the timing),
    so this is Cypher + reading candidate embeddings (store or cache) + ordering."""
    s = Settings.from_env()
    questions = [ec.item_question(q) for q in ec.load_qa(args.qa)]
    lg.search_graph(questions[0], 10, mode="graph", settings=s)  # warm caches
    out: dict[str, Any] = {"queries": len(questions)}
    for mode in ("keyword", "principles", "semantic", "graph"):
        lg._passage_cache.clear()  # each mode starts cold; the cache warms over its queries
        seconds = []
        for q in questions:
            lg.embed_query(q, s)
            t = time.perf_counter()
            lg.search_graph(q, 10, mode=mode, settings=s)
            seconds.append(time.perf_counter() - t)
        out[mode] = {"p50_ms": ms(seconds, 0.5), "p95_ms": ms(seconds, 0.95, 2)}
        print(mode, out[mode], file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("command", choices=["build", "engines", "coverage", "retrieval", "latency"])
    p.add_argument("--passages", type=Path, default=default_passages())
    p.add_argument("--passages-list", type=Path, nargs="*", help="files for 'coverage'")
    p.add_argument("--engine", default="ladybug", choices=EMBEDDED_ENGINES)
    p.add_argument("--qa", type=Path, default=default_qa())
    p.add_argument(
        "--modes",
        nargs="*",
        default=[
            "dense",
            "bm25",
            "hybrid",
            "keyword",
            "principles",
            "semantic",
            "graph",
            "combined",
        ],
    )
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    fn = {
        "build": cmd_build,
        "engines": cmd_engines,
        "coverage": cmd_coverage,
        "retrieval": cmd_retrieval,
        "latency": cmd_latency,
    }
    result = fn[args.command](args)
    print(json.dumps(result, indent=2))
    if not args.no_save and args.command != "build":
        old = saved("bench_graph").get(args.command)
        if args.command == "retrieval" and isinstance(
            old, dict
        ):  # a run of some modes updates them
            result = {**result, "modes": {**old.get("modes", {}), **result["modes"]}}
        save("bench_graph", result, args.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
