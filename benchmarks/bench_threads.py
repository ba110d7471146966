"""Threads: what a follow-up, a resumed run and checkpointing cost, with the configured LLM (the
embedded model by default), on five fact patterns of datasets/fact_patterns.jsonl.

    python benchmarks/bench_threads.py            all three parts, every pattern
    python benchmarks/bench_threads.py --only followup --patterns 2

- ``followup``: the pattern asked on a new thread, then a "What if ...?" follow-up on that thread,
  against the combined question (the pattern's facts, the new fact, the same question) asked fresh
  on a new thread: LLM calls and seconds of each, and whether the follow-up read both turns' facts.
- ``resume``: ``main.py`` killed with SIGKILL as soon as its planner has finished, then
  ``main.py --resume ID``: the LLM calls the resumed run repeats of the nodes that had completed
  (classify, plan), and whether it ends with the uninterrupted run's answer.
- ``overhead``: the same question with CHECKPOINTS off and on, in alternating order: seconds and
  LLM calls of each.

The QA memory is neither read nor written in process, and cleared before each ``main.py`` run, so
no question is answered from it; the LLM response cache is off (LLM_CACHE=0), so every call is
the model's.  Numbers go to benchmarks/results/bench_threads.json.  Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common import save

import main
from context import AgentContext
from question import Question
from settings import Settings, load_dotenv_file

FOLLOW_UPS = {
    "fp_torts_slip_and_fall": "What if the store had put a warning sign next to the puddle?",
    "fp_crimpro_suspended_license_car_search": (
        "What if Ray had been standing unhandcuffed next to his open car door during the search?"
    ),
    "fp_contracts_oral_motorcycle_sale": (
        "What if Nell had sent Ivan a signed email stating the motorcycle and the price?"
    ),
    "fp_evidence_stair_repair": "What if the hotel denied that it controlled the stairs?",
    "fp_realprop_garden_strip": "What if Cara had used the strip only with Ada's permission?",
}
"""Each pattern's follow-up: a new fact, and the pattern's question asked again."""
COMPLETED_ROLES = ("injection", "classify", "plan")
"""The LLM calls of the nodes that complete before the planner's end (a resumed run repeats none)."""


def patterns(n: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (REPO / "datasets/fact_patterns.jsonl").open()]
    by_id = {r["id"]: r for r in rows}
    return [by_id[i] for i in list(FOLLOW_UPS)[:n]]


def _context(settings: Settings) -> AgentContext:
    """The real dependencies, without the QA memory (each question is researched)."""
    ctx = AgentContext.from_settings(settings)
    return dataclasses.replace(ctx, check_memory=lambda q: None, write_memory=lambda *a: None)


def _run(ctx: AgentContext, question: str, saver: Any = None, thread: str | None = None) -> dict:
    t0 = time.perf_counter()
    result = main.run_agent(question, context=ctx, checkpointer=saver, thread_id=thread)
    metrics = result.get("run_metrics") or {}
    return {
        "seconds": round(time.perf_counter() - t0, 2),
        "llm_calls": metrics.get("llm_calls"),
        "by_role": {r: v["llm_calls"] for r, v in (metrics.get("by_role") or {}).items()},
        "thread": result.get("thread_id"),
        "facts": (result.get("parsed") or {}).get("facts") or [],
        "reused": (result.get("answer") or {}).get("reused") or [],
        "text": (result.get("answer") or {}).get("text") or "",
        "error": result.get("error"),
    }


def follow_up(settings: Settings, rows: list[dict]) -> list[dict]:
    ctx = _context(settings)
    out = []
    with main.open_checkpointer(settings) as saver:
        for row in rows:
            what_if = FOLLOW_UPS[row["id"]]
            first = _run(ctx, row["question"], saver)
            follow = _run(ctx, what_if, saver, first["thread"])
            q = Question.read(row["question"])
            combined = " ".join([*q.facts, follow["facts"][-1], q.asked])
            fresh = _run(ctx, combined, saver)
            both = set(first["facts"]) | {follow["facts"][-1]} <= set(follow["facts"])
            out.append(
                {
                    "id": row["id"],
                    "first": first,
                    "follow_up": follow,
                    "combined_fresh": fresh,
                    "reads_both_turns": both,
                    "call_ratio": round(follow["llm_calls"] / max(fresh["llm_calls"], 1), 3),
                }
            )
            print(
                f"followup {row['id']}: follow-up {follow['llm_calls']} calls "
                f"{follow['seconds']} s (reused {len(follow['reused'])}), combined fresh "
                f"{fresh['llm_calls']} calls {fresh['seconds']} s, both turns' facts: {both}",
                flush=True,
            )
    return out


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / "main.py"), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _clear_memory(env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, str(REPO / "main.py"), "--clear-memory"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )


def resume(settings: Settings, rows: list[dict], env: dict[str, str]) -> list[dict]:
    """Each pattern killed after its planner and resumed, against an uninterrupted run."""
    ctx = _context(settings)
    out = []
    for row in rows:
        whole = _run(ctx, row["question"])
        _clear_memory(env)
        proc = _cli(["--json", row["question"]], env)
        thread = ""
        for line in proc.stderr:  # the progress lines: kill when the planner has finished
            thread = line.split()[1] if line.startswith("thread:") else thread
            if " planner " in line:
                os.killpg(proc.pid, signal.SIGKILL)
                break
        proc.wait()
        resumed = _cli(["--json", "--resume", thread], env)
        stdout, _ = resumed.communicate()
        result = json.loads(stdout)
        by_role = {
            r: v["llm_calls"] for r, v in (result["run_metrics"].get("by_role") or {}).items()
        }
        repeated = sum(by_role.get(r, 0) for r in COMPLETED_ROLES)
        same = result["answer"]["text"] == whole["text"]
        out.append(
            {"id": row["id"], "repeated_calls": repeated, "resumed_by_role": by_role,
             "uninterrupted_by_role": whole["by_role"], "same_answer": same}
        )  # fmt: skip
        print(f"resume {row['id']}: repeated {repeated} calls; same answer: {same}", flush=True)
    return out


def overhead(settings: Settings, rows: list[dict]) -> list[dict]:
    """Each pattern with CHECKPOINTS off and on, the order alternating from one to the next."""
    ctx = _context(settings)
    out = []
    with main.open_checkpointer(settings) as saver:
        for n, row in enumerate(rows):
            order = [None, saver] if n % 2 == 0 else [saver, None]
            runs = {("on" if s else "off"): _run(ctx, row["question"], s) for s in order}
            out.append(
                {
                    "id": row["id"],
                    **{f"{k}_seconds": r["seconds"] for k, r in runs.items()},
                    **{f"{k}_calls": r["llm_calls"] for k, r in runs.items()},
                }
            )
            print(
                f"overhead {row['id']}: off {runs['off']['seconds']} s, on "
                f"{runs['on']['seconds']} s",
                flush=True,
            )
    return out


def _summary(results: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    if rows := results.get("followup"):
        follow = sum(r["follow_up"]["llm_calls"] for r in rows)
        fresh = sum(r["combined_fresh"]["llm_calls"] for r in rows)
        summary["followup_calls_vs_fresh"] = f"{follow}/{fresh} = {follow / max(fresh, 1):.2f}"
        summary["followup_seconds_median"] = statistics.median(
            r["follow_up"]["seconds"] for r in rows
        )
        summary["fresh_seconds_median"] = statistics.median(
            r["combined_fresh"]["seconds"] for r in rows
        )
        summary["followups_reading_both_turns"] = sum(r["reads_both_turns"] for r in rows)
    if rows := results.get("resume"):
        summary["resume_repeated_calls"] = sum(r["repeated_calls"] for r in rows)
        summary["resume_same_answer"] = f"{sum(r['same_answer'] for r in rows)}/{len(rows)}"
    if rows := results.get("overhead"):
        ratios = [r["on_seconds"] / r["off_seconds"] for r in rows]
        summary["checkpoint_seconds_ratio_median"] = round(statistics.median(ratios), 3)
        summary["checkpoint_extra_calls"] = sum(r["on_calls"] - r["off_calls"] for r in rows)
    return summary


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["followup", "resume", "overhead"], action="append")
    parser.add_argument("--patterns", type=int, default=len(FOLLOW_UPS), help="how many (max 5)")
    args = parser.parse_args(argv)
    load_dotenv_file()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "LLM_CACHE": "0", "CHECKPOINTS": str(Path(tmp) / "threads.sqlite")}
        settings = Settings.from_env(env=env)
        rows = patterns(args.patterns)
        results: dict[str, Any] = {}
        parts = args.only or ["followup", "resume", "overhead"]
        if "followup" in parts:
            results["followup"] = follow_up(settings, rows)
        if "resume" in parts:
            results["resume"] = resume(settings, rows, env)
        if "overhead" in parts:
            results["overhead"] = overhead(settings, rows)
    results["summary"] = _summary(results)
    print(json.dumps(results["summary"], indent=2))
    save("bench_threads", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main_())
