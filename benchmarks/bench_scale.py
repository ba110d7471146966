"""Scale benchmark: a store the size of the full Bar Exam QA corpus (686,000 passages), built,
killed and resumed, indexed for BM25 and searched.

    python benchmarks/bench_scale.py --n 20000     # a quick check (a few minutes on 2 cores)
    python benchmarks/bench_scale.py               # 686,000 passages
    python benchmarks/bench_scale.py --keep --dir /tmp/scale   # keep the store to search it later
    python benchmarks/bench_scale.py --dir /tmp/scale --again query    # search a kept store again

The store holds the shared corpus (../shared/data/corpus/passages.jsonl, 2,476 passages)
replicated to N passages: copy 0 is the corpus itself, copy r of passage ``idx`` is ``idx~r``
with `` (copy r)`` after its text. Vectors are precomputed, the point being the store rather than
the embedder: the 2,476 passages are embedded once with the real default embedder, and each
replica gets its passage's vector plus a small deterministic perturbation (cosine about 0.99 to
it), so HNSW sees distinct points. Everything else is the product's own code path:
``load_corpus.load_passages`` writes the store (batches, injection screening, metadata, Chroma
upserts, resume by id) with an embedder registered under the default model's name that looks the
vectors up (``rag_utils.register_embeddings``); the searches run
``rag_utils.retrieve_documents_multi_query`` and ``rag_utils.check_memory`` with the real int8
ONNX embedder.

Each step runs in its own process, so each peak RSS is its own:
1. embed the 2,476 base passages (real embedder);
2. load: a loader process is SIGKILLed once about half of the passages are embedded, and run
   again to completion (``load_corpus.py``-style resume); store build time is the two runs'
   total; the store is then checked: every passage present once (ids counted), and a sample of
   passages' own vectors find a copy of their passage first in the HNSW index;
3. BM25: ``rag_utils.get_bm25`` builds the index over the store (time, and that process's peak
   RSS);
4. queries: the first query of a fresh process (cold: it loads the BM25 index and, after a load,
   computes the mean passage vector) and the first with the filter (it scans every passage's
   metadata, once per passage count: a later process reads the result back), hybrid 3-query
   latency p50/p95 (k=5)
   with no filter and with ``--jurisdiction US`` (FILTER_JURISDICTION), for bar-length queries
   and for the agent's own rewrites, dense only for comparison, and the QA memory lookup; the
   load average is recorded beside each, and the step is run again at the end when the machine
   was busy with something else.
Disk is the store folder's size (Chroma and the BM25 index). The CPU model and its flags are
printed first. Results go to benchmarks/results/bench_scale.json under ``n=<N>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import ms, peak_rss_mb, printer, save, saved, shared_paths

DEFAULT_N = 686_000
SUFFIX = re.compile(r" \(copy (\d+)\)$")
PERTURBATION = 0.0072
"""Standard deviation of each coordinate of a replica's noise: norm ~0.14 over 384 dimensions,
so a replica's cosine to its base vector is about 0.99."""
BUSY_LOAD = 1.0
"""A 1-minute load average still above this after 90 s of waiting before the latency step means
another job is running (this benchmark is idle then): the step is run again at the end."""
SELF_CHECK = 200
"""Passages whose own vectors are searched after the resume: each should find a copy of its
passage first. Itself it finds less often at 686K: its ~276 copies are all about equally near
(isotropic noise), which leaves HNSW nothing to steer by inside the cluster."""


# --- the machine ----------------------------------------------------------------------------------
def cpu_info() -> dict[str, Any]:
    """The CPU model, core count and the flags int8 and float embedding speed depend on."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return {
        "model": model,
        "cpus": os.cpu_count(),
        "flags": {f: f in flags for f in wanted},
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def settled_load(wait_s: float = 90.0) -> list[float]:
    """The load average once the 1-minute figure is below BUSY_LOAD (the steps before this one
    raise it), or after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while (load := load_average())[0] > BUSY_LOAD and time.monotonic() < deadline:
        time.sleep(5)
    return load


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# --- the replicated corpus ----------------------------------------------------------------------
def replicated(base: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` passages: the base corpus, then copy 1, 2, ... (distinct id and text suffix)."""
    out: list[dict[str, Any]] = []
    copy = 0
    while len(out) < n:
        for p in base[: n - len(out)]:
            if copy == 0:
                out.append(p)
            else:
                out.append({**p, "idx": f"{p['idx']}~{copy}", "text": f"{p['text']} (copy {copy})"})
        copy += 1
    return out


class ReplicaVectors:
    """A LangChain-style ``Embeddings`` that looks replica vectors up: a base passage's text gets
    its precomputed vector, copy r of it that vector plus a deterministic perturbation; any other
    text (a query) is embedded by ``real``. Writes how many texts it has embedded to
    ``progress`` (the parent kills the loader by it)."""

    def __init__(self, texts: list[str], vectors: Any, real: Any, progress: Path) -> None:
        self.row = {t: i for i, t in enumerate(texts)}
        self.vectors = vectors
        self.real = real
        self.progress = progress
        self.done = 0

    def vector(self, text: str) -> Any:
        import numpy as np

        if (i := self.row.get(text)) is not None:
            return self.vectors[i]
        m = SUFFIX.search(text)
        if m is None or (i := self.row.get(text[: m.start()])) is None:
            return self.real.embed_documents([text])[0]
        noise = np.random.default_rng([int(m.group(1)), i]).standard_normal(len(self.vectors[i]))
        return self.vectors[i] + PERTURBATION * noise.astype(np.float32)

    def embed_documents(self, texts: list[str]) -> Any:
        import numpy as np

        out = np.asarray([self.vector(t) for t in texts], dtype=np.float32)
        self.done += len(texts)
        self.progress.write_text(str(self.done))
        return out

    def embed_query(self, text: str) -> Any:
        return self.embed_documents([text])[0]


# --- child steps (each in its own process; each prints one JSON line) ---------------------------
def _settings(folder: Path, **changes: Any) -> Any:
    from settings import Settings

    return Settings.from_env(env={}, chroma_dir=str(folder / "chroma"), reranker="hybrid").replace(
        **changes
    )


def step_embed(folder: Path, passages_path: Path) -> dict[str, Any]:
    import numpy as np

    import load_corpus
    import rag_utils

    settings = _settings(folder)
    base = load_corpus.read_passages(passages_path)
    t0 = time.perf_counter()
    emb = rag_utils.get_embedder(settings)
    t1 = time.perf_counter()
    vecs = emb.embed_documents([p["text"] for p in base])
    t2 = time.perf_counter()
    np.save(folder / "base_vectors.npy", vecs)
    return {
        "passages": len(base),
        "backend": emb.backend,
        "device": emb.device,
        "model_load_s": round(t1 - t0, 2),
        "embed_s": round(t2 - t1, 2),
        "passages_per_s": round(len(base) / (t2 - t1), 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def step_load(folder: Path, passages_path: Path, n: int) -> dict[str, Any]:
    import numpy as np

    import load_corpus
    import rag_utils

    settings = _settings(folder)
    base = load_corpus.read_passages(passages_path)
    real = rag_utils.get_embedder(settings)  # for any text that is not a replica
    vectors = np.load(folder / "base_vectors.npy")
    lookup = ReplicaVectors([p["text"] for p in base], vectors, real, folder / "progress")
    rag_utils.register_embeddings(rag_utils.DEFAULT_MODEL_NAME, lookup)
    passages = replicated(base, n)
    t0 = time.perf_counter()
    added = load_corpus.load_passages(passages, settings, progress=False)
    return {
        "added": added,
        "already_stored": n - added,
        "seconds": round(time.perf_counter() - t0, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def step_check(folder: Path, passages_path: Path, n: int) -> dict[str, Any]:
    """Every passage present once, and the HNSW index finds a sample by their own vectors."""
    import numpy as np

    import load_corpus
    import rag_utils

    settings = _settings(folder)
    expected = [p["idx"] for p in replicated(load_corpus.read_passages(passages_path), n)]
    store = rag_utils.get_store(settings)
    t0 = time.perf_counter()
    listed = [rec["id"] for rec in store.iter_all(include_text=False)]
    present = store.existing_ids(expected)
    rng = np.random.default_rng(0)
    sample = [expected[i] for i in rng.choice(n, size=min(SELF_CHECK, n), replace=False)]
    got = store.collection.get(ids=sample, include=["embeddings"])
    hits = store.collection.query(query_embeddings=got["embeddings"], n_results=10, include=[])
    pairs = list(zip(got["ids"], hits["ids"], strict=True))
    own = sum(ids[0].split("~")[0] == pid.split("~")[0] for pid, ids in pairs)
    return {
        "count": store.count(),
        "ids_listed": len(listed),
        "distinct_ids_listed": len(set(listed)),
        "expected_ids_present": len(present),
        "unexpected_ids": len(set(listed) - set(expected)),
        "sampled": len(sample),
        "own_passage_first": own,
        "itself_in_top_10": sum(pid in ids for pid, ids in pairs),
        "check_s": round(time.perf_counter() - t0, 1),
        "indexed_by": store.indexed_by(),
    }


def step_bm25(folder: Path) -> dict[str, Any]:
    import rag_utils

    settings = _settings(folder)
    store = rag_utils.get_store(settings)
    before = peak_rss_mb()
    t0 = time.perf_counter()
    index = rag_utils.get_bm25(settings, store)
    seconds = time.perf_counter() - t0
    return {
        "passages": index.count,
        "build_s": round(seconds, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "peak_rss_before_mb": round(before, 1),
        "disk_mb": round(disk_bytes(store.bm25_dir / store.name) / 1e6, 1),
    }


def _timed(fns: dict[str, Any], inputs: list[Any], repeats: int) -> dict[str, Any]:
    """p50/p95 of each of ``fns`` over ``repeats`` of ``inputs``, the functions taking turns on
    each input, so a machine that drifts slower during the run slows each of them alike."""
    for fn in fns.values():
        fn(inputs[0])  # warm: any index a first call builds is not counted
    times: dict[str, list[float]] = {name: [] for name in fns}
    load = load_average()
    for i in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn(inputs[i % len(inputs)])
            times[name].append(time.perf_counter() - t)
    after = load_average()
    return {
        name: {
            "p50_ms": ms(ts, 0.5),
            "p95_ms": ms(ts, 0.95),
            "n": len(ts),
            "load_average_before": load,
            "load_average_after": after,
        }
        for name, ts in times.items()
    }


def step_query(folder: Path, qa_path: Path, repeats: int) -> dict[str, Any]:
    import bench_retrieval

    import filters
    import load_corpus
    import rag_utils

    settings = _settings(folder)
    qa = load_corpus.read_qa(qa_path)
    bar = bench_retrieval.triples(qa)
    agent = bench_retrieval.agent_triples()
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    rag_utils.retrieve_documents_multi_query(bar[0], k=5, settings=settings)
    out["cold_first_query_s"] = round(time.perf_counter() - t0, 2)
    filtered = settings.replace(filter_jurisdiction="US")
    t0 = time.perf_counter()
    rag_utils.retrieve_documents_multi_query(bar[0], k=5, settings=filtered)
    out["first_filtered_query_s"] = round(time.perf_counter() - t0, 2)
    admitted = rag_utils.get_store(filtered).allowed_ids(filters.passage_filter(filtered))
    out["admitted_by_filter"] = len(admitted)
    rag_utils.reset_caches()  # as a later process: what the filter admits is read back
    t0 = time.perf_counter()
    rag_utils.get_store(filtered).allowed_ids(filters.passage_filter(filtered))
    out["filter_read_back_s"] = round(time.perf_counter() - t0, 2)

    def search(s: Any, reranker: str) -> Any:
        return lambda qs: rag_utils.retrieve_documents_multi_query(
            qs, k=5, reranker=reranker, settings=s
        )

    for label, queries in (("bar_questions", bar), ("agent_rewrites", agent)):
        configurations = {
            "hybrid": search(settings, "hybrid"),
            "hybrid, jurisdiction US": search(filtered, "hybrid"),
            "dense": search(settings, "none"),
        }
        out[label] = _timed(configurations, queries, repeats)
    questions = [str(it.get("question") or "") for it in qa]
    for i, it in enumerate(qa[:100]):
        rag_utils.write_to_memory(
            questions[i], f"answer {i}", 0.8, settings, sources=[{"id": str(it["gold_idx"])}]
        )
    lookup = _timed(
        {"m": lambda q: rag_utils.check_memory(q, settings=settings)}, questions, repeats
    )
    out["qa_memory"] = {"entries": rag_utils.memory_count(settings), **lookup["m"]}
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return out


# --- the parent ---------------------------------------------------------------------------------
def child(step: str, folder: Path, args: argparse.Namespace, **popen: Any) -> Any:
    cmd = [sys.executable, __file__, "--step", step, "--dir", str(folder), "--n", str(args.n)]
    cmd += ["--shared-data", args.shared_data, "--repeats", str(args.repeats)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **popen)


def run_child(step: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    proc = child(step, folder, args)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"step {step} exited {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def load_killed_and_resumed(folder: Path, args: argparse.Namespace, say: Any) -> dict[str, Any]:
    """The loader SIGKILLed once about half of the passages are embedded, then run again."""
    progress = folder / "progress"
    progress.unlink(missing_ok=True)
    kill_at = args.n // 2
    t0 = time.perf_counter()
    proc = child("load", folder, args)
    done = 0
    while proc.poll() is None:
        time.sleep(0.5)
        try:
            done = int(progress.read_text() or 0)
        except (OSError, ValueError):
            continue
        if done >= kill_at:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            break
    first_s = time.perf_counter() - t0
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the loader finished (exit {proc.returncode}) before it was killed")
    say(f"  loader SIGKILLed after {done} passages embedded ({first_s:.0f} s); resuming ...")
    t1 = time.perf_counter()
    resumed = run_child("load", folder, args)
    second_s = time.perf_counter() - t1
    return {
        "killed_after_embedded": done,
        "first_run_s": round(first_s, 1),
        "resume_run_s": round(second_s, 1),
        "build_s": round(first_s + second_s, 1),
        "passages_per_s": round(args.n / (first_s + second_s), 1),
        "resume": resumed,
    }


def latency_report(q: dict[str, Any], say: Any) -> None:
    say(
        f"  cold first query {q['cold_first_query_s']} s; first filtered query "
        f"{q['first_filtered_query_s']} s ({q['admitted_by_filter']} passages admitted; read "
        f"back by a later process in {q.get('filter_read_back_s')} s)"
    )
    for label in ("bar_questions", "agent_rewrites"):
        for method, r in q[label].items():
            say(
                f"  {label:<15} {method:<24} p50 {r['p50_ms']:>7} ms  p95 {r['p95_ms']:>7} ms"
                f"  (load {r['load_average_before'][0]} -> {r['load_average_after'][0]})"
            )
    m = q["qa_memory"]
    say(
        f"  QA memory lookup ({m['entries']} entries) p50 {m['p50_ms']} ms p95 {m['p95_ms']} ms"
        f"  (load {m['load_average_before'][0]} -> {m['load_average_after'][0]})"
    )
    say(f"  peak RSS of the query process {q['peak_rss_mb']} MB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=DEFAULT_N, help="passages in the store (686000)")
    p.add_argument(
        "--shared-data", default=str(REPO.parent / "shared" / "data"), help="../shared/data"
    )
    p.add_argument("--dir", help="work folder (default: a new one under the temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the store at the end")
    p.add_argument(
        "--again", metavar="STEPS", help="check, bm25, query (comma-separated): rerun on --dir"
    )
    p.add_argument("--repeats", type=int, default=40, help="timed searches per configuration")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--step", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING)
    if (paths := shared_paths(args.shared_data)) is None:
        return 2
    passages_path, qa_path = paths
    if args.step:  # a child process: one step, one JSON line
        folder = Path(args.dir)
        steps = {
            "embed": lambda: step_embed(folder, passages_path),
            "load": lambda: step_load(folder, passages_path, args.n),
            "check": lambda: step_check(folder, passages_path, args.n),
            "bm25": lambda: step_bm25(folder),
            "query": lambda: step_query(folder, qa_path, args.repeats),
        }
        print(json.dumps(steps[args.step]()), flush=True)
        return 0

    say = printer(args.json)
    machine = cpu_info()
    say(f"CPU: {machine['model']}, {machine['cpus']} cores, {machine['memory_gb']} GiB; flags:")
    say("  " + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in machine["flags"].items()))
    again = [x for x in (args.again or "").split(",") if x]
    if again and (not args.dir or set(again) - {"check", "bm25", "query"}):
        p.error("--again takes check, bm25 and query, and --dir of a kept store")
    folder = Path(args.dir or tempfile.mkdtemp(prefix="bench_scale_"))
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    say(f"store in {folder} ({free / 2**30:.0f} GiB free); {args.n} passages")
    results: dict[str, Any] = {"machine": machine, "n": args.n}
    if again:  # beside the numbers of the run that built this store
        before = saved("bench_scale").get(f"n={args.n}", {})
        stale = {"query_again"} if "query" in again else set()
        results = {**{k: v for k, v in before.items() if k not in stale}, **results}
    steps = again or ["embed", "build", "check", "bm25", "query"]
    t_start = time.perf_counter()
    try:
        if free < args.n * 12_000 and "build" in steps:  # ~10 KB a passage measured
            say(f"warning: {args.n} passages may need {args.n * 10_000 / 2**30:.1f} GiB")
        if "embed" in steps:
            say("embedding the base corpus with the real embedder ...")
            results["embed"] = e = run_child("embed", folder, args)
            say(
                f"  {e['passages']} passages, {e['backend']} on {e['device']}: "
                f"{e['passages_per_s']} passages/s (model load {e['model_load_s']} s)"
            )
        if "build" in steps:
            say("building the store (the loader is killed half-way and resumed) ...")
            results["build"] = b = load_killed_and_resumed(folder, args, say)
            say(
                f"  build {b['build_s']} s in all ({b['passages_per_s']} passages/s); resume run "
                f"added {b['resume']['added']}, skipped {b['resume']['already_stored']} stored, "
                f"{b['resume_run_s']} s; loader peak RSS {b['resume']['peak_rss_mb']} MB"
            )
        if "check" in steps:
            results["check"] = c = run_child("check", folder, args)
            lost = args.n - c["expected_ids_present"]
            dup = c["ids_listed"] - c["distinct_ids_listed"]
            results["check"].update(lost=lost, duplicated=dup)
            say(
                f"  after the resume: count {c['count']}, lost {lost}, duplicated {dup}, "
                f"unexpected {c['unexpected_ids']}; of {c['sampled']} sampled passages' own "
                f"vectors, {c['own_passage_first']} find a copy of their passage first, "
                f"{c['itself_in_top_10']} find themselves in the top 10"
            )
        if "bm25" in steps:
            say("building the BM25 index ...")
            results["bm25"] = bm = run_child("bm25", folder, args)
            say(
                f"  {bm['build_s']} s, peak RSS {bm['peak_rss_mb']} MB (before the build "
                f"{bm['peak_rss_before_mb']} MB), {bm['disk_mb']} MB on disk"
            )
            chroma = disk_bytes(folder / "chroma") / 1e6
            results["disk_mb"] = {"store": round(chroma, 1), "of_which_bm25": bm["disk_mb"]}
            say(f"  store on disk {chroma:.0f} MB ({chroma * 1e6 / args.n:.0f} bytes a passage)")
        if "query" in steps:
            say("searching ...")
            load = settled_load()
            results["query"] = q = run_child("query", folder, args)
            q["load_average_at_start"] = load
            latency_report(q, say)
            if load[0] > BUSY_LOAD:
                say(f"  the load average was {load[0]} before the searches: again at the end ...")
                load = settled_load(wait_s=300)
                results["query_again"] = q2 = run_child("query", folder, args)
                q2["load_average_at_start"] = load
                latency_report(q2, say)
        peaks = [results.get(k, {}).get("peak_rss_mb", 0) for k in ("embed", "bm25", "query")]
        peaks.append(results.get("build", {}).get("resume", {}).get("peak_rss_mb", 0))
        results["peak_rss_mb"] = max(peaks)
        results["wall_s"] = round(time.perf_counter() - t_start, 1)
        say(f"highest peak RSS of any step {results['peak_rss_mb']} MB; {results['wall_s']} s")
    finally:
        if not args.keep and not again:
            shutil.rmtree(folder, ignore_errors=True)
    path = save("bench_scale", results, key=f"n={args.n}")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"written to {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
