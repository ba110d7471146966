"""Evidence-mode benchmarks.

    python benchmarks/bench_evidence.py floor     EVIDENCE_FLOOR for the default embedder
    python benchmarks/bench_evidence.py demo [--save PATH]   evidence answers with the real LLM

``demo`` indexes the starter corpus into a temporary Chroma folder, retrieves 5 passages per
question (the question itself is the query, so ``dense_score`` is its cosine to each passage) and
runs :func:`evidence.answer_from_evidence` with the configured LLM (the embedded model by default:
wrap it as ``flock /tmp/legalrag-llm.lock python benchmarks/bench_evidence.py demo`` on a shared
machine); it prints calls, seconds and the answers, and ``--save`` writes the first result.

Calibration method (``floor``): evidence mode drops every passage whose cosine to the question is
below ``EVIDENCE_FLOOR`` before quote extraction, so a question abstains at the floor when even its
nearest passage is below it.  With the configured embedder (all-MiniLM-L6-v2 by default, the same
:func:`rag_utils.get_embedder` the index uses, on passage text as indexed) we embed the corpus — the
starter passages alone (what a fresh clone has) and the starter plus ``../shared/data`` passages
when present — and, per question, take the nearest passage's cosine (top-1) and the gold passage's
cosine when the question names one.

Questions the corpus answers: the in-corpus, multi-hop and answerable edge questions of
``datasets/open_questions.jsonl``, the starter MC questions, the covered research questions of
``bench_agent.py`` and, with the shared data, the Bar Exam QA dev questions.  Questions it does not
answer: the out-of-corpus and non-legal questions of the open set, ``bench_agent.py``'s uncovered
questions and :data:`EXTRA_UNCOVERED` below.

Every question goes into a tune or a test half by a hash of its text.  On the tune half the floor
is the highest value (step 0.01) at which at most :data:`MAX_FALSE_ABSTENTION` of the answerable
questions lose their nearest passage (a false abstention costs a correct answer; the grounding gate
after the floor catches what the floor lets through); the report gives the test half's rates at
that floor: false abstention, share of gold passages kept, and out-of-corpus abstention.  The
floor is chosen on the larger corpus (a bigger corpus raises every question's top-1 cosine, so its
floor is the conservative one).  Results go to benchmarks/results/bench_evidence.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import eval_common as ec  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "bench_evidence.json"
SHARED = REPO.parent / "shared" / "data"
MAX_FALSE_ABSTENTION = 0.05
"""Share of answerable tune questions the floor may strip of every passage."""

EXTRA_UNCOVERED = [
    "What is the depreciation schedule for commercial real estate under the Internal Revenue Code?",
    "How do I file a provisional patent application with the USPTO?",
    "What is the difference between an inter partes review and an ex parte reexamination of a patent?",
    "How can a green card holder apply for naturalization and what is the residency requirement?",
    "What is the asylum one-year filing deadline and its exceptions for refugees?",
    "Under the Jones Act, what must a seaman prove to recover for injuries aboard a vessel?",
    "What is general average in marine insurance?",
    "What is the automatic stay in Chapter 11 bankruptcy reorganization?",
    "What disclosures does the Securities Act of 1933 require in a registration statement?",
    "How is alimony calculated after a divorce?",
    "What is the estate tax exemption amount for a decedent?",
    "What are the requirements for a valid holographic will?",
    "How does the Hague Convention on child abduction work?",
    "What are the EU rules on state aid to companies?",
    "What is a 1031 like-kind exchange?",
    "How do I replace a bicycle chain?",
    "What is the capital of Australia?",
    "Recommend a good science fiction novel.",
    "How many calories are in an avocado?",
    "What is the best time of year to plant tomatoes?",
]


def _read_jsonl(path: Path) -> list[dict]:
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def _half(text: str) -> str:
    return "tune" if int(hashlib.sha256(text.encode()).hexdigest(), 16) % 2 == 0 else "test"


def _questions(with_shared: bool) -> list[dict]:
    """{text, answerable, gold, origin} for every calibration question."""
    from bench_agent import COVERED_QUESTIONS, UNCOVERED_QUESTIONS

    out: list[dict] = []
    for q in _read_jsonl(REPO / "datasets" / "open_questions.jsonl"):
        out.append(
            {
                "text": q["question"],
                "answerable": not q["should_abstain"],
                "gold": q.get("gold_ids") or [],
                "origin": f"open:{q['category']}",
            }
        )
    for item in _read_jsonl(REPO / "datasets" / "starter" / "qa.jsonl"):
        out.append(
            {
                "text": ec.item_question(item),
                "answerable": True,
                "gold": ec.gold_ids(item),
                "origin": "starter_mc",
            }
        )
    out += [
        {"text": t, "answerable": True, "gold": [], "origin": "covered"} for t in COVERED_QUESTIONS
    ]
    out += [
        {"text": t, "answerable": False, "gold": [], "origin": "uncovered"}
        for t in [*UNCOVERED_QUESTIONS, *EXTRA_UNCOVERED]
    ]
    if with_shared:
        for item in _read_jsonl(SHARED / "qa" / "barexam_dev.jsonl"):
            out.append(
                {
                    "text": ec.item_question(item),
                    "answerable": True,
                    "gold": ec.gold_ids(item),
                    "origin": "barexam_dev",
                }
            )
    seen: set[str] = set()
    unique = []
    for q in out:
        if q["text"] not in seen:
            seen.add(q["text"])
            q["half"] = _half(q["text"])
            unique.append(q)
    return unique


def _embed_cached(embedder: Any, texts: list[str], tag: str) -> Any:
    """Embeddings of ``texts``, cached under .cache/ by model and content (the corpus takes
    ~90 s on 2 cores)."""
    import numpy as np

    digest = hashlib.sha256("\x00".join([embedder.name, *texts]).encode()).hexdigest()[:16]
    path = REPO / ".cache" / f"bench_evidence_{tag}_{digest}.npy"
    if path.exists():
        return np.load(path)
    vecs = embedder.embed_documents(texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vecs)
    return vecs


def _rates(rows: list[dict], floor: float) -> dict[str, Any]:
    ans = [r for r in rows if r["answerable"]]
    ooc = [r for r in rows if not r["answerable"]]
    gold = [g for r in ans for g in r["gold_cos"]]
    fa = sum(r["top1"] < floor for r in ans)
    ab = sum(r["top1"] < floor for r in ooc)
    kept = sum(g >= floor for g in gold)

    def rate(k: int, n: int) -> dict[str, Any]:
        lo, hi = ec.wilson_ci(k, n)
        return {
            "k": k,
            "n": n,
            "rate": round(k / n, 3) if n else None,
            "ci95": [round(lo, 3), round(hi, 3)],
        }

    return {
        "false_abstention": rate(fa, len(ans)),
        "gold_kept": rate(kept, len(gold)),
        "ooc_abstention": rate(ab, len(ooc)),
    }


def _by_origin(rows: list[dict], floor: float) -> dict[str, Any]:
    out = {}
    for origin in sorted({r["origin"] for r in rows}):
        rs = [r for r in rows if r["origin"] == origin]
        out[origin] = {
            "n": len(rs),
            "top1_p10": round(ec.percentile([r["top1"] for r in rs], 0.1), 3),
            "top1_p50": round(ec.percentile([r["top1"] for r in rs], 0.5), 3),
            "top1_p90": round(ec.percentile([r["top1"] for r in rs], 0.9), 3),
            "below_floor": sum(r["top1"] < floor for r in rs),
        }
    return out


def calibrate_floor(corpora: list[str] | None = None) -> dict[str, Any]:
    import numpy as np

    import rag_utils
    from settings import Settings

    settings = Settings.from_env()
    embedder = rag_utils.get_embedder(settings)
    have_shared = (SHARED / "corpus" / "passages.jsonl").exists()
    starter = _read_jsonl(REPO / "datasets" / "starter" / "passages.jsonl")
    shared = _read_jsonl(SHARED / "corpus" / "passages.jsonl") if have_shared else []
    corpora = corpora or (["starter", "starter+shared"] if have_shared else ["starter"])
    report: dict[str, Any] = {
        "embedder": embedder.name,
        "max_false_abstention": MAX_FALSE_ABSTENTION,
    }
    t0 = time.perf_counter()
    P_starter = _embed_cached(embedder, [p["text"] for p in starter], "starter")
    P_shared = _embed_cached(embedder, [p["text"] for p in shared], "shared") if shared else None
    report["embed_corpus_s"] = round(time.perf_counter() - t0, 1)
    questions = _questions(have_shared)
    t0 = time.perf_counter()
    Q = _embed_cached(embedder, [q["text"] for q in questions], "questions")
    report["embed_questions_s"] = round(time.perf_counter() - t0, 1)
    chosen = None
    for name in corpora:
        passages = starter + (shared if name == "starter+shared" else [])
        P = P_starter if name == "starter" else np.vstack([P_starter, P_shared])
        index = {str(p["idx"]): i for i, p in enumerate(passages)}
        sims = Q @ P.T
        rows = []
        for qi, q in enumerate(questions):
            gold = [index[g] for g in q["gold"] if g in index]
            if q["answerable"] and q["gold"] and not gold:
                continue  # its gold passage is not in this corpus: not answerable here
            rows.append(
                {
                    **q,
                    "top1": float(sims[qi].max()),
                    "gold_cos": [float(sims[qi, j]) for j in gold],
                }
            )
        tune = [r for r in rows if r["half"] == "tune"]
        test = [r for r in rows if r["half"] == "test"]
        grid = [round(x, 2) for x in np.arange(0.05, 0.80, 0.01)]
        ok = [
            f for f in grid if _rates(tune, f)["false_abstention"]["rate"] <= MAX_FALSE_ABSTENTION
        ]
        floor = max(ok) if ok else grid[0]
        report[name] = {
            "passages": len(passages),
            "questions": {"tune": len(tune), "test": len(test)},
            "floor": floor,
            "tune": _rates(tune, floor),
            "test": _rates(test, floor),
            "test_by_origin": _by_origin(test, floor),
            "test_by_floor": {
                f"{f:.2f}": _rates(test, f) for f in (0.20, 0.25, 0.30, 0.35, 0.40, 0.45, 0.50)
            },
        }
        report[name]["_test_rows"] = test
        chosen = floor
    report["suggested_floor"] = chosen
    for name in corpora:  # every corpus at the one suggested floor
        test = report[name].pop("_test_rows")
        report[name]["test_at_suggested_floor"] = _rates(test, chosen)
    return report


DEMO_QUESTIONS = [
    "What is the mailbox rule?",
    "What are the elements of a negligence claim?",
    "What are the requirements for an employer to sponsor an H-1B visa?",
]


def demo(questions: list[str], save: str | None = None) -> dict[str, Any]:
    import tempfile

    import evidence
    import load_corpus
    import rag_utils
    from llm_config import LLMClient
    from settings import Settings, set_settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env(chroma_dir=str(Path(tmp) / "chroma"))
        set_settings(settings)
        load_corpus.ensure_starter_index(settings)
        client = LLMClient(settings)
        runs = []
        for question in questions:
            t0 = time.perf_counter()
            docs = rag_utils.retrieve_documents(question, k=settings.retrieval_k, settings=settings)
            retrieve_s = time.perf_counter() - t0
            result = evidence.answer_from_evidence(client, question, docs, settings=settings)
            result["question"] = question
            result["retrieved"] = [
                {k: d.get(k) for k in ("id", "title", "dense_score", "rerank_score")} for d in docs
            ]
            trail = result["audit_trail"]
            runs.append(
                {
                    "question": question,
                    "retrieve_s": round(retrieve_s, 2),
                    "llm_calls": trail["llm_calls"],
                    "seconds": trail["seconds"],
                    "abstained": result["abstained"],
                    "answer": result["answer"],
                    "audit": evidence.format_audit_block(result),
                    "result": result,
                }
            )
        rag_utils.reset_caches()
        set_settings(None)
    if save and runs:
        path = Path(save)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(ec.to_jsonable(runs[0]["result"]), indent=2) + "\n")
    return {
        "llm_provider": settings.llm_provider,
        "evidence_floor": settings.evidence_floor,
        "runs": [{k: v for k, v in r.items() if k != "result"} for r in runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["floor", "demo"])
    parser.add_argument("questions", nargs="*", help="demo questions (default: three)")
    parser.add_argument(
        "--starter-only", action="store_true", help="calibrate on the starter corpus only"
    )
    parser.add_argument("--save", help="demo: write the first result (with its audit trail) here")
    args = parser.parse_args(argv)
    ec.configure_logging()
    if args.what == "demo":
        from settings import load_dotenv_file

        load_dotenv_file()
        result = demo(args.questions or DEMO_QUESTIONS, args.save)
    else:
        result = calibrate_floor(["starter"] if args.starter_only else None)
    result = ec.to_jsonable(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    existing[args.what] = result
    RESULTS.write_text(json.dumps(existing, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
