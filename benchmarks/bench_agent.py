"""Agent benchmarks.

    python benchmarks/bench_agent.py overhead            graph overhead per question, zero-latency fake LLM
    python benchmarks/bench_agent.py demos [names...]    wall time + LLM calls of each demo (real LLM)
    python benchmarks/bench_agent.py calibrate           covered vs uncovered cosine distributions (default embedder)
    python benchmarks/bench_agent.py gate --qa F --start 40 --n 40
                                                         LEAN_GATE: both answers per item, then the fit

``demos`` starts the configured LLM (the embedded local model by default): wrap it as
``flock /tmp/legalrag-llm.lock python benchmarks/bench_agent.py demos`` on a shared machine.

Calibration method (``calibrate``): a step's confidence is the mean cosine between its question and
the passages retrieved for it (AgentContext.gate_scores).  With all-MiniLM-L6-v2 we embed the
corpus (the starter passages plus ../shared/data when present) and measure, for questions the corpus
answers (bar exam questions with a gold passage, starter questions, short research questions on
covered doctrines) and questions it does not (non-legal and uncovered legal topics):
the mean top-5 cosine (what the agent's confidence is), the cosine to the gold passage and to random
passages.  The threshold is set between the covered and uncovered top-5 distributions (the midpoint
of the uncovered 90th percentile and the covered 10th percentile), so that a step fails when
retrieval found nothing about its question.  Results go to benchmarks/results/bench_agent.json.

Gate calibration (``gate``): for each item of a slice of a labelled MC set (``--start``/``--n``,
chosen so that it does not overlap the items phase 2 reports on), lean mode's evidence is gathered
once and the model answers twice, closed-book and with that evidence; the rows (evidence score,
both correctness bits) go to ``benchmarks/results/lean_gate_rows.jsonl`` as they are made, so an
interrupted run resumes.  ``calibrate_gate`` then picks the gate that maximizes the gated
accuracy on those rows.  LLM replies go through the response cache.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import quantile, save

import eval_common as ec
import main
from context import AgentContext, gated_out
from llm_config import LLMClient
from settings import Settings, load_dotenv_file

COVERED_QUESTIONS = [
    "What are the elements of a negligence claim?",
    "What must a party show to obtain a preliminary injunction?",
    "When does the First Amendment protect student speech at a public university?",
    "What procedural due process is required before a public school suspends a student?",
    "When is a hearsay statement admissible as an excited utterance?",
    "What are the elements of common law burglary?",
    "When may police search a car without a warrant?",
    "What are the requirements for adverse possession?",
    "When does a federal court have diversity jurisdiction?",
    "What is the difference between murder and voluntary manslaughter?",
    "When is a defendant entitled to Miranda warnings?",
    "What makes a covenant run with the land?",
]
UNCOVERED_QUESTIONS = [
    "How do I bake a sourdough bread with a crispy crust?",
    "Which graphics card is best for playing video games in 4K?",
    "What is the boiling point of water at high altitude?",
    "How do I train a puppy to stop biting?",
    "What are the tax brackets for capital gains in Portugal?",
    "How is a maritime salvage award calculated under admiralty practice in Singapore?",
    "What is the best strategy to win at chess openings?",
    "How do vaccines train the immune system?",
    "What are the rules of cricket's leg before wicket?",
    "How do I configure a Kubernetes ingress controller?",
    "What is the recommended daily intake of vitamin D?",
    "Under Islamic inheritance law, what share does a daughter receive?",
]


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 4) if values else None,
        "p10": round(quantile(values, 0.10), 4),
        "p50": round(quantile(values, 0.50), 4),
        "p90": round(quantile(values, 0.90), 4),
    }


def _read_jsonl(path: Path) -> list[dict]:
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def calibrate(k: int = 5, starter_only: bool = False) -> dict[str, Any]:
    import numpy as np

    import rag_utils

    starter = REPO / "datasets" / "starter"
    passages = _read_jsonl(starter / "passages.jsonl")
    qa = _read_jsonl(starter / "qa.jsonl")
    shared = REPO.parent / "shared" / "data"
    if not starter_only and (shared / "corpus" / "passages.jsonl").exists():
        passages.extend(_read_jsonl(shared / "corpus" / "passages.jsonl"))
        qa.extend(_read_jsonl(shared / "qa" / "barexam_dev.jsonl"))
    by_id: dict[str, int] = {}
    for i, p in enumerate(passages):
        by_id.setdefault(str(p["idx"]), i)
    # The product's embedder and passage text (what the index and the step confidence use).
    settings = Settings.from_env(llm_cache=False)  # timings of the model, not of the cache
    embedder = rag_utils.get_embedder(settings)

    def emb(texts: list[str]) -> np.ndarray:
        return np.asarray(embedder.embed_documents(texts), dtype=np.float32)

    t = time.perf_counter()
    P = np.asarray(rag_utils.embed_passages([p["text"] for p in passages], settings))
    embed_s = time.perf_counter() - t

    def topk_mean(Q: np.ndarray) -> list[float]:
        sims = Q @ P.T
        top = np.sort(sims, axis=1)[:, -k:]
        return [float(x) for x in top.mean(axis=1)]

    gold_q, gold_ix = [], []
    for item in qa:
        g = str(item.get("gold_idx", ""))
        if g in by_id:
            gold_q.append(" ".join(f"{item.get('prompt') or ''} {item['question']}".split()))
            gold_ix.append(by_id[g])
    Qg = emb(gold_q)
    rng = random.Random(0)
    gold_cos = [float(Qg[i] @ P[j]) for i, j in enumerate(gold_ix)]
    random_cos = [float(Qg[i] @ P[rng.randrange(len(P))]) for i in range(len(gold_q))]
    covered = topk_mean(emb(COVERED_QUESTIONS))
    uncovered = topk_mean(emb(UNCOVERED_QUESTIONS))
    bar_topk = topk_mean(Qg)
    suggested = round((quantile(uncovered, 0.9) + quantile(covered + bar_topk, 0.1)) / 2, 2)
    return {
        "embedder": rag_utils.embedder_name(settings),
        "backend": rag_utils.resolve_embedding_backend(settings),
        "passages": len(passages),
        "embed_s": round(embed_s, 1),
        "k": k,
        "topk_mean_cosine": {
            "covered_research_questions": _stats(covered),
            "qa_questions_with_gold": _stats(bar_topk),
            "uncovered_questions": _stats(uncovered),
        },
        "pair_cosine": {"question_gold": _stats(gold_cos), "question_random": _stats(random_cos)},
        "suggested_threshold": suggested,
        "by_threshold": {
            f"{th:.2f}": {
                "covered_research_below": sum(c < th for c in covered),
                "qa_below": sum(c < th for c in bar_topk),
                "uncovered_above": sum(u >= th for u in uncovered),
            }
            for th in (0.30, 0.33, 0.35, 0.38, 0.40, 0.45)
        },
        "uncovered_above_threshold": sum(u >= suggested for u in uncovered),
        "covered_below_threshold": sum(c < suggested for c in covered + bar_topk),
    }


def _fake_context(settings: Any) -> Any:
    """A context whose LLM answers instantly with canned replies (per role) and whose retrieval,
    confidence, embedder and memory are in-memory: what remains is the graph's own overhead."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    def reply(role: str) -> str:
        if role == "classify":
            return json.dumps(
                {"topic": "t", "area": "torts", "legal": True, "query_type": "simple"}
            )
        if role == "plan":
            return json.dumps({"issues": ["first issue", "second issue"]})
        if role == "apply":
            check = {"requirement": "the rule", "fact": "a fact", "met": "yes"}
            return json.dumps({"checks": [check]})
        if role == "bottom_line":
            return json.dumps({"answer": "yes", "reason": "the rule applies"})
        if role == "injection":
            return json.dumps({"verdict": "safe", "reason": "legal"})
        return "**Answer: (B)**"

    class Instant(BaseChatModel):
        role: str

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            return ChatResult(
                generations=[ChatGeneration(message=AIMessage(content=reply(self.role)))]
            )

        @property
        def _llm_type(self) -> str:
            return "instant"

    docs = [{"id": f"d{i}", "title": f"T{i}", "text": f"text {i}", "source": "x", "rerank_score": 1.0} for i in range(100)]  # fmt: skip

    def retrieve(queries, k, exclude):
        ex = set(exclude)
        return [dict(d) for d in docs if d["id"] not in ex][:k]

    dims: dict[str, int] = {}

    def embed(texts):
        """One dimension per distinct text: equal texts have cosine 1, different ones 0
        (deterministic, unlike hash(), so every run takes the same path)."""
        import numpy as np

        rows = np.zeros((len(texts), 256), dtype="float32")
        for i, t in enumerate(texts):
            rows[i, dims.setdefault(t, len(dims) % 256)] = 1.0
        return rows

    return AgentContext(
        settings=settings,
        client=LLMClient(settings, llm_factory=lambda role: Instant(role=role)),
        retrieve=retrieve,
        cosines=lambda q, docs: [0.6] * len(docs),
        embed=embed,
        check_memory=lambda q: None,
        write_memory=lambda q, a, c, sources: None,
    )


def overhead(repeats: int = 20) -> dict[str, Any]:
    settings = Settings.from_env(skip_injection_check=False, llm_cache=False)
    choices = {"A": "yes", "B": "no", "C": "maybe", "D": "never"}
    main.run_agent("warm up question about torts", choices, context=_fake_context(settings))
    times, calls = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        r = main.run_agent(
            "A multi-hop question about several doctrines?",
            choices,
            context=_fake_context(settings),
        )
        times.append(time.perf_counter() - t)
        calls.append(r["run_metrics"]["llm_calls"])
    return {
        "repeats": repeats,
        "llm_calls_per_question": calls[0],
        "overhead_s_mean": round(statistics.fmean(times), 4),
        "overhead_s_max": round(max(times), 4),
    }


def demos(names: list[str]) -> dict[str, Any]:
    settings = Settings.from_env(llm_cache=False)  # timings of the model, not of the cache
    main._ensure_index(settings)
    out = {}
    for name in names:
        t = time.perf_counter()
        r = main.run_agent(
            main.DEMOS[name],
            context=AgentContext.from_settings(settings),
            on_event=lambda e: print(
                f"  [{e['t_s']:6.1f}s] {e['node']}: {e['decision']}", file=sys.stderr
            ),
        )
        m = r["run_metrics"]
        out[name] = {
            "wall_s": round(time.perf_counter() - t, 1),
            "llm_calls": m["llm_calls"],
            "steps_completed": m["steps_completed"],
            "steps_failed": m["steps_failed"],
            "output_tokens": m["output_tokens"],
            "input_tokens": m["input_tokens"],
            "stop_reason": m["stop_reason"],
            "uncited_sentences": m["uncited_sentences"],
            "error": r.get("error"),
            "node_latency_s": m["node_latency_s"],
        }
        print(f"{name}: {json.dumps(out[name])}", file=sys.stderr)
    return {"provider": settings.llm.provider, "demos": out}


def gated_accuracy(rows: Sequence[Mapping[str, Any]], gate: float) -> float:
    """Accuracy of the lean route choice at ``gate`` over rows holding ``evidence_score``,
    ``rag_correct`` and ``closed_correct`` (both arms answered for every row); below the gate
    (or with no score) the closed-book answer counts."""
    if not rows:
        return float("nan")
    hits = [
        r["closed_correct"] if gated_out(r["evidence_score"], gate) else r["rag_correct"]
        for r in rows
    ]
    return sum(bool(h) for h in hits) / len(hits)


def calibrate_gate(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The gate that maximizes :func:`gated_accuracy` on ``rows``.

    Candidates are 0 (always use the evidence), every observed score, and just above the highest
    (never use it).  Several gates often tie on a small set: the middle of the longest run of
    tied candidates is taken, so the choice does not sit on the edge of a plateau."""
    if not rows:
        raise ValueError("no calibration rows")
    scores = sorted({round(float(r["evidence_score"]), 4) for r in rows})
    candidates = [0.0, *scores, round(scores[-1] + 1e-4, 4)]
    accs = [gated_accuracy(rows, g) for g in candidates]
    best = max(accs)
    runs: list[list[int]] = []
    for i, a in enumerate(accs):
        if a == best:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
    longest = max(runs, key=len)
    gate = candidates[longest[len(longest) // 2]]
    return {
        "gate": gate,
        "accuracy": best,
        "n": len(rows),
        "rag_accuracy": sum(bool(r["rag_correct"]) for r in rows) / len(rows),
        "closed_accuracy": sum(bool(r["closed_correct"]) for r in rows) / len(rows),
        "rag_share": sum(not gated_out(r["evidence_score"], gate) for r in rows) / len(rows),
        "curve": [{"gate": g, "accuracy": a} for g, a in zip(candidates, accs, strict=True)],
    }


GATE_ROWS = REPO / "benchmarks" / "results" / "lean_gate_rows.jsonl"


def gate(qa: str, start: int, n: int | None, rows_path: Path, fit_only: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    import mc
    import prompts

    load_dotenv_file()
    settings = ec.eval_settings()
    items = ec.load_qa(qa)[start : (start + n) if n else None]
    done = {r["item"]: r for r in _read_jsonl(rows_path)} if rows_path.exists() else {}
    if not fit_only:
        ec.require_llm(settings)
        context = AgentContext.from_settings(settings)
        rows_path.parent.mkdir(parents=True, exist_ok=True)
        with rows_path.open("a", encoding="utf-8") as out:
            for item in tqdm([it for it in items if ec.item_id(it) not in done], desc="gate"):
                question, choices = ec.item_question(item), ec.item_choices(item)
                docs, _, best = context.lean_evidence(question, choices)
                closed = mc.select_answer(context.client, question, choices, None)
                evidence = prompts.format_evidence(docs)
                rag = mc.select_answer(context.client, question, choices, evidence)
                answer = ec.item_answer(item)
                row = {
                    "item": ec.item_id(item),
                    "evidence_score": round(best, 4),
                    "gold_in_evidence": any(d["id"] in ec.gold_ids(item) for d in docs),
                    "closed_letter": closed.letter,
                    "rag_letter": rag.letter,
                    "answer": answer,
                    "closed_correct": closed.letter == answer,
                    "rag_correct": rag.letter == answer,
                }
                out.write(json.dumps(row) + "\n")
                out.flush()
                done[row["item"]] = row
    rows = [done[ec.item_id(it)] for it in items if ec.item_id(it) in done]
    fit = calibrate_gate(rows)
    fit["curve"] = fit["curve"][:: max(1, len(fit["curve"]) // 20)]  # a readable sample
    return {
        "qa": Path(qa).name,
        "items": f"{start}..{start + len(items) - 1}",
        "embedding_model": settings.retrieval.embedding_model,
        "llm": settings.llm.model or settings.llm.provider,
        **fit,
    }


def main_cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("what", choices=["overhead", "demos", "calibrate", "gate"])
    parser.add_argument("names", nargs="*", help="demo names (default: all)")
    parser.add_argument(
        "--starter-only", action="store_true", help="calibrate on the starter corpus only"
    )
    parser.add_argument(
        "--k",
        type=int,
        default=2,
        help="calibrate: passages a step's confidence averages over. A step's confidence is the "
        "mean cosine of the passages its answer cites, usually the top 1-3 (default 2); 5 "
        "reproduces the old grade over every retrieved passage",
    )
    parser.add_argument(
        "--qa", help="gate: labelled MC set (e.g. ../shared/data/qa/barexam_dev.jsonl)"
    )
    parser.add_argument("--start", type=int, default=40, help="gate: first item (default 40)")
    parser.add_argument("--n", type=int, help="gate: number of items (default: to the end)")
    parser.add_argument("--rows", type=Path, default=GATE_ROWS, help="gate: rows file (resumed)")
    parser.add_argument("--fit-only", action="store_true", help="gate: fit the rows already made")
    args = parser.parse_args(argv)
    if args.what == "gate" and not args.qa:
        parser.error("gate needs --qa (a labelled multiple-choice set)")
    if args.what == "overhead":
        result = overhead()
    elif args.what == "calibrate":
        result = calibrate(k=args.k, starter_only=args.starter_only)
    elif args.what == "gate":
        result = gate(args.qa, args.start, args.n, args.rows, args.fit_only)
    else:
        result = demos(args.names or ["simple", "medium", "multi_hop"])
    print(json.dumps(result, indent=2))
    key = args.what + ("_starter_only" if args.starter_only else "")
    save("bench_agent", result, key + (f"_k{args.k}" if args.what == "calibrate" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main_cli())
