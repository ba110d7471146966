"""Lean mode's evidence: one retrieval for a multiple-choice question and its evidence gate.

Lean mode is the graph's route with zero research steps (``nodes.route_after_injection`` sends it
to the answer); ``nodes.mc_select`` reads lean's evidence (``AgentContext.lean_evidence``) in
every mode, so the research route never reads less than lean does:

1. **retrieve once** with the question and its choices as the query (the best expansion that costs
   no LLM call: phase 1 on barexam_dev, hybrid R@10 0.279 against 0.216 for the question alone,
   with centring); passages that carry instructions (the injection screen) are dropped and
   replaced by the next ones;
2. **gate**: the evidence score is the highest cosine between the question as asked and a
   retrieved passage (``AgentContext.score_evidence``); at or above ``LEAN_GATE`` the passages go
   to the letter's prompt, below it the model answers closed-book, so weak evidence never steers
   the letter.

``LEAN_GATE`` is calibrated by ``python benchmarks/bench_agent.py gate`` on a part of barexam_dev
that the reported phase-2 items are not in (:func:`calibrate_gate`).  The research agent's executor
applies the same gate to each step (:func:`below_gate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import mc


def lean_query(question: str, choices: Mapping[str, str]) -> str:
    """The retrieval query: the question, then its choices as ``(A) text`` lines."""
    return f"{' '.join(question.split())}\n{mc.format_choices(choices)}"


def below_gate(score: float | None, gate: float) -> bool:
    """True when evidence scoring ``score`` should not be used (a gate of 0 never blocks)."""
    return gate > 0 and (score is None or score < gate)


# ------------------------------------------------------------------------------------------------
# Calibration
# ------------------------------------------------------------------------------------------------


def gated_accuracy(rows: Sequence[Mapping[str, Any]], gate: float) -> float:
    """Accuracy of the lean route choice at ``gate`` over rows holding ``evidence_score``,
    ``rag_correct`` and ``closed_correct`` (both arms answered for every row)."""
    if not rows:
        return float("nan")
    hits = [
        r["closed_correct"] if below_gate(r["evidence_score"], gate) else r["rag_correct"]
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
        "rag_share": sum(not below_gate(r["evidence_score"], gate) for r in rows) / len(rows),
        "curve": [{"gate": g, "accuracy": a} for g, a in zip(candidates, accs, strict=True)],
    }
