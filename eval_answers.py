"""Phase 3: how good are the answers to open questions, per answer mode (research vs evidence).

Pure metrics over answer dicts and the A–F grader.  An answer dict (one mode's answer to one
question) has ``answer`` (text), ``abstained``, ``sentences`` (``{"text", "passage_ids"}`` per
legal sentence), ``passages`` ({id: text} the run saw), and optionally ``quotes``, ``verdict``,
``llm_calls``.  Shares get Wilson 95% intervals, means bootstrap ones.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import zip_longest
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

import eval_common as ec
import load_corpus
import mc
import prompts

OPEN_QUESTIONS = Path(__file__).resolve().parent / "datasets" / "open_questions.jsonl"
CATEGORIES = ("in_corpus", "multi_hop", "out_of_corpus", "edge")
KEY_POINT_COVERAGE = 0.6
"""A key point is covered when this share of its content words occurs in the answer."""
_REFS = re.compile(r"\[\d+\]")
"""A citation number of the answer's text ("[2]")."""


class AnswerGrade(BaseModel):
    grade: Literal["A", "B", "C", "D", "F"]
    reason: str = Field(default="", max_length=300)


# --- Data ---------------------------------------------------------------------------------------


def _read_items(path: str | Path, fields: set[str]) -> list[dict]:
    """The items of a JSONL file; a ValueError names one without one of ``fields``."""
    items = [item for _, item in load_corpus.iter_rows(path)]
    for item in items:
        if missing := fields - set(item):
            raise ValueError(f"{path}: item {item.get('id')!r} lacks {sorted(missing)}")
    return items


def load_open_questions(path: str | Path | None = None) -> list[dict]:
    """The open question set: ``id, question, category, key_points, should_abstain`` (+ gold_ids)."""
    path = Path(path) if path else OPEN_QUESTIONS
    items = _read_items(path, {"id", "question", "category", "key_points", "should_abstain"})
    for item in items:
        if item["category"] not in CATEGORIES:
            raise ValueError(f"{path}: item {item['id']!r} has a bad category")
    return items


def interleave_categories(items: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Round-robin over the categories (file order within each), so the first ``n`` questions, or
    a run cut short, cover every category instead of the file's first one."""
    turns = zip_longest(*ec.group_by(items, "category").values())
    return [dict(it) for turn in turns for it in turn if it is not None]


# --- Pure metrics of one answer -----------------------------------------------------------------


def citation_counts(
    sentences: Sequence[Mapping[str, Any]], passages: Mapping[str, Any]
) -> dict[str, int]:
    """Legal sentences, those citing a passage, and those citing only ``passages`` the run saw."""
    cited = [s for s in sentences if s.get("passage_ids")]
    valid = [s for s in cited if all(p in passages for p in s["passage_ids"])]
    return {"sentences": len(sentences), "cited": len(cited), "valid": len(valid)}


STOPWORDS = (mc.STOPWORDS - {"no", "not"}) | frozenset(
    """being these those there them him we our you your if then than so such what when where why
    how each every some may must can could would should shall will do does did has have had also
    only even more most other into onto upon about over under after before between through during
    while because whether same very just own both either neither per one two three""".split()  # noqa: SIM905 - a word list reads better as text
)
"""Function words left out of key-point stems: the multiple-choice parser's stop words, plus more,
minus its negations ("is not effective" must not count as "is effective")."""


def _stems(text: str) -> set[str]:
    """Content-word stems (the first 6 letters: "negligence" and "negligent" match)."""
    return {w[:6] for w in mc.WORD.findall(text.lower()) if w not in STOPWORDS and len(w) > 2}


def key_point_hits(answer: str, key_points: Sequence[str]) -> list[bool]:
    """Per key point: at least ``KEY_POINT_COVERAGE`` of its content words occur in the answer."""
    words = _stems(_REFS.sub(" ", answer or ""))
    needs = map(_stems, key_points)
    return [bool(need) and len(need & words) / len(need) >= KEY_POINT_COVERAGE for need in needs]


def quote_validity(
    quotes: Sequence[Mapping[str, Any]], passages: Mapping[str, str]
) -> tuple[int, int]:
    """(verified quotes whose text occurs verbatim in their passage, verified quotes)."""
    verified = [q for q in quotes if q.get("verdict") == "ok"]
    ok = sum(
        bool(q.get("text")) and str(q["text"]) in str(passages.get(q.get("passage_id"), ""))
        for q in verified
    )
    return ok, len(verified)


def score_answer(
    item: Mapping[str, Any],
    mode: str,
    result: Mapping[str, Any],
    seconds: float,
    same_doctrine: Callable[[str, Sequence[str]], bool] | None = None,
) -> dict:
    """One result row: what the metrics need, per item and mode; with ``same_doctrine`` and an
    answerable item's ``gold_ids``, its :func:`_misgrounded` sentences (as for the fact patterns)."""
    abstained = bool(result.get("abstained"))
    sentences = [] if abstained else list(result.get("sentences") or [])
    counts = citation_counts(sentences, result.get("passages") or {})
    misgrounded = None
    if same_doctrine is not None and (gold := item.get("gold_ids")) and not item["should_abstain"]:
        misgrounded = len(_misgrounded(sentences, gold, same_doctrine))
    # what the answer states: its sentences, not the lists of issues it set aside or left
    # unresearched ("Not answered: Dying declarations" had covered "dying declaration")
    stated = " ".join(str(s.get("text") or "") for s in sentences)
    points = item.get("key_points") or []
    hits = [False] * len(points) if abstained else key_point_hits(stated, points)
    q_ok, q_n = quote_validity(result.get("quotes") or [], result.get("passages") or {})
    return {
        "id": item["id"],
        "mode": mode,
        "category": item["category"],
        "should_abstain": bool(item["should_abstain"]),
        "abstained": abstained,
        "answer": str(result.get("answer") or ""),
        "sentences": counts["sentences"],
        "cited_sentences": counts["cited"],
        "valid_cited_sentences": counts["valid"],
        "key_points": len(hits),
        "key_points_covered": sum(hits),
        "misgrounded_sentences": misgrounded,
        "quotes_valid": q_ok,
        "quotes_verified": q_n,
        # the doctrines the answer names as not researched (the user's next step: --issues)
        "others": list(result.get("others") or []),
        "llm_calls": result.get("llm_calls"),
        "seconds": round(float(seconds), 3),
    }


# --- The grader ---------------------------------------------------------------------------------


def expectation(item: Mapping[str, Any]) -> str:
    if item.get("conclusion"):  # a fact pattern
        return f"Expected conclusion: {item['conclusion']}"
    points = "\n".join(f"- {p}" for p in item.get("key_points") or [])
    return f"Expected key points:\n{points}"


def grade_answer(client: Any, item: Mapping[str, Any], answer: str) -> dict:
    """A–F grade of one answer; ``grade`` None when unparseable.  An answerable question is graded
    against its key points (``skills/grade_answer.md``); one whose right answer declines, on
    whether the answer declines (``skills/grade_abstention.md``)."""
    fields = {
        "question": prompts.quote("question", str(item["question"])),
        "answer": prompts.quote("answer", answer or "(empty)"),
    }
    if item["should_abstain"]:
        messages = prompts.render("grade_abstention", **fields)
    else:
        messages = prompts.render(
            "grade_answer", expectation=prompts.quote("expectation", expectation(item)), **fields
        )
    result = client.invoke(messages, role="judge", schema=AnswerGrade, max_tokens=80)
    if result.parsed is None:
        return {"grade": None, "reason": result.parse_error or "unparseable"}
    return {"grade": result.parsed.grade, "reason": result.parsed.reason}


# --- Summary ------------------------------------------------------------------------------------


def _share(k: int, n: int) -> dict[str, Any]:
    lo, hi = ec.wilson_ci(k, n)
    return {
        "k": k,
        "n": n,
        "rate": round(k / n, 4) if n else None,
        "ci95": [round(lo, 4), round(hi, 4)] if n else None,
    }


def _others_gold(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Of the passed-over doctrines the answers name, those whose search finds a gold passage the
    answer does not cite (``steer``)."""
    return _share(
        sum(len(r.get("steer") or []) for r in rows), sum(len(r.get("others") or []) for r in rows)
    )


def _rate(rows: Sequence[Mapping[str, Any]], key: str, of: str | None = None) -> dict[str, Any]:
    """:func:`_share` of the rows' ``key`` summed, over the rows (``of``: their ``of`` summed)."""
    return _share(sum(r[key] for r in rows), sum(r[of] for r in rows) if of else len(rows))


def _mean(values: Sequence[float]) -> dict[str, Any]:
    lo, hi = ec.bootstrap_ci(values)
    return {
        "n": len(values),
        "mean": round(ec.mean(values), 4) if values else None,
        "ci95": [round(lo, 4), round(hi, 4)] if values else None,
    }


def _graded(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The judge's A or B share of the graded rows."""
    graded = [r for r in rows if r.get("grade")]
    return _share(sum(r["grade"] in ("A", "B") for r in graded), len(graded))


def _misgrounded(
    sentences: Sequence[Mapping[str, Any]],
    gold: Sequence[str],
    same_doctrine: Callable[[str, Sequence[str]], bool],
) -> list[Mapping[str, Any]]:
    """The sentences citing only passages that are neither gold nor on a gold passage's doctrine."""
    return [
        s
        for s in sentences
        if s.get("passage_ids")
        and not any(p in gold or same_doctrine(p, gold) for p in s["passage_ids"])
    ]


def _cost(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    calls = [float(r["llm_calls"]) for r in rows if r.get("llm_calls") is not None]
    return {
        "llm_calls_per_question": _mean(calls),
        "seconds_per_question": _mean([float(r["seconds"]) for r in rows]),
    }


def summarize_mode(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Abstention recall (questions to decline), false abstention (answerable ones), key-point
    coverage, sentences citing a passage the run saw, misgrounded sentences (where gold passages
    are known), quote validity (verified quotes verbatim in their passage), the judge's A+B rate."""
    decline = [r for r in rows if r["should_abstain"]]
    answerable = [r for r in rows if not r["should_abstain"]]
    answered = [r for r in rows if not r["abstained"]]
    coverage = [r["key_points_covered"] / r["key_points"] for r in answerable if r["key_points"]]
    per_answer_cited = [
        r["valid_cited_sentences"] / r["sentences"] for r in answered if r["sentences"]
    ]
    grounded = [r for r in answered if r.get("misgrounded_sentences") is not None]
    return {
        "items": len(rows),
        "abstention_recall": _rate(decline, "abstained"),
        "false_abstention": _rate(answerable, "abstained"),
        "false_abstention_in_corpus": _rate(
            [r for r in answerable if r["category"] == "in_corpus"], "abstained"
        ),
        "key_point_coverage": _mean(coverage),
        "cited_sentences": _rate(answered, "valid_cited_sentences", "sentences"),
        "cited_share_per_answer": _mean(per_answer_cited),
        "uncited_sentences": sum(r["sentences"] - r["cited_sentences"] for r in answered),
        "misgrounded_sentences": _rate(grounded, "misgrounded_sentences", "sentences"),
        "quote_validity": _rate(rows, "quotes_valid", "quotes_verified"),
        "others_gold": _others_gold(rows),
        "a_or_b": _graded(rows),
        "grades": dict(sorted(Counter(r["grade"] for r in rows if r.get("grade")).items())),
        "ungraded": sum(1 for r in rows if "grade" in r and not r["grade"]),
        **_cost(rows),
    }


def summarize_answers(
    rows: Sequence[Mapping[str, Any]], facts: bool = False
) -> dict[str, dict[str, Any]]:
    """Each mode's :func:`summarize_mode` (``facts``: :func:`summarize_fact_mode`)."""
    summarize = summarize_fact_mode if facts else summarize_mode
    return {mode: summarize(rs) for mode, rs in ec.group_by(rows, "mode").items()}


# --- Fact patterns: issues found, conclusions reached, misgrounded sentences --------------------

FACT_PATTERNS = Path(__file__).resolve().parent / "datasets" / "fact_patterns.jsonl"
SAME_DOCTRINE_COSINE = 0.5
"""Cosine to a gold passage from which a cited passage counts as the same doctrine."""
_BOTTOM_LINE = re.compile(r"^\s*(?:\*\*)?bottom line:?(?:\*\*)?\s*(yes|no|unclear)\b", re.I | re.M)


def load_fact_patterns(path: str | Path, split: str) -> list[dict]:
    """The fact patterns of ``path`` in ``split`` (tune, report or all)."""
    items = _read_items(path, {"id", "question", "answer", "issues", "conclusion_keys", "split"})
    return [it for it in items if split in ("all", it["split"])]


def pattern_documents(items: Sequence[Mapping[str, Any]], qa_path: str | Path) -> list[Path]:
    """The user documents fact patterns are about (``documents``, paths from the QA file's
    folder), each once; FileNotFoundError naming one that is missing."""
    paths = [Path(qa_path).parent / d for it in items for d in it.get("documents") or []]
    if missing := [p for p in paths if not p.is_file()]:
        raise FileNotFoundError(f"document not found: {missing[0]}")
    return list(dict.fromkeys(paths))


def resolve_gold_text(items: Sequence[dict], passages: Sequence[Mapping[str, Any]]) -> None:
    """Give each issue with ``gold_text`` (words of its gold sentences in a user document, whose
    passage ids depend on where the document is) the ids of the passages holding one of them;
    ValueError naming words no passage holds."""
    for item in items:
        for issue in item["issues"]:
            if words := issue.get("gold_text"):
                ids = [str(p["id"]) for p in passages if any(w in p["text"] for w in words)]
                if not ids:
                    raise ValueError(f"{item['id']}: no loaded passage holds {words[0]!r}")
                issue["gold_ids"] = ids


def verdict_of(result: Mapping[str, Any]) -> str | None:
    """The answer's yes/no: the record's verdict, else a "Bottom line: yes|no" line of its text."""
    if result.get("verdict"):
        return str(result["verdict"]).lower()
    m = _BOTTOM_LINE.search(str(result.get("answer") or ""))
    return m.group(1).lower() if m else None


def conclusion_hits(item: Mapping[str, Any], answer: str) -> list[bool]:
    """Per key group of the item: one of its phrases occurs in the answer (lower case)."""
    text = " ".join((answer or "").lower().split())
    return [any(k.lower() in text for k in group) for group in item["conclusion_keys"]]


def score_fact_pattern(
    item: Mapping[str, Any],
    mode: str,
    result: Mapping[str, Any],
    seconds: float,
    same_doctrine: Callable[[str, Sequence[str]], bool],
) -> dict:
    """One fact-pattern row of an answer dict (empty ``passage_ids``: an uncited sentence)."""
    gold_by_issue = [list(i["gold_ids"]) for i in item["issues"]]
    gold = [g for ids in gold_by_issue for g in ids]
    abstained = bool(result.get("abstained"))
    sentences = [] if abstained else list(result.get("sentences") or [])
    cited = {pid for s in sentences for pid in s["passage_ids"]}
    verdict = None if abstained else verdict_of(result)
    hits = conclusion_hits(item, str(result.get("answer") or "")) if not abstained else []

    misgrounded = _misgrounded(sentences, gold, same_doctrine)
    words = [w for issue in item["issues"] for w in issue.get("gold_text") or []]
    rules = [s for s in sentences if s.get("role") == "rule"]
    # An issue the facts raise has a sentence citing a gold passage or one on its doctrine; a
    # misgrounded sentence under another issue answers an issue the facts do not raise.
    raised = {s.get("issue") for s in sentences if s["passage_ids"] and s not in misgrounded}
    return {
        "id": item["id"],
        "mode": mode,
        "split": item["split"],
        "subject": item.get("subject"),
        "expected": item["answer"],
        "verdict": verdict,
        "abstained": abstained,
        "gold_cited": bool(cited & set(gold)),
        "issues": len(gold_by_issue),
        "issues_found": sum(bool(cited & set(ids)) for ids in gold_by_issue),
        "conclusion_keys": len(hits),
        "conclusion_keys_hit": sum(hits),
        "conclusion_correct": verdict == item["answer"] and all(hits) and not abstained,
        "verdict_correct": verdict == item["answer"],
        # the model's answer to the question and the support of the conclusion it rests on, shown
        # as the verdict or not (VERDICT_SUPPORT): what the precision-coverage table reads
        "reading": None if abstained else result.get("reading", verdict),
        "support": None if abstained else result.get("support"),
        "sentences": len(sentences),
        "uncited_sentences": sum(1 for s in sentences if not s["passage_ids"]),
        "misgrounded_sentences": len(misgrounded),
        # of a pattern whose gold is named by words of its sentences (a user's document): the
        # quoted rule sentences, and those that are gold (a case's narrative quoted is not)
        "rule_sentences": len(rules),
        "gold_rule_sentences": sum(any(w in s["text"] for w in words) for s in rules)
        if words
        else None,
        "misgrounded_off_agenda": sum(s.get("issue") not in raised for s in misgrounded),
        # the passages each issue cites, to tell which of them a misgrounded sentence rests on
        "cited_by_issue": {
            str(issue): sorted(
                {p for s in sentences if s.get("issue") == issue for p in s["passage_ids"]}
            )
            for issue in dict.fromkeys(s.get("issue") for s in sentences)
        },
        # the doctrines the answer names as not researched (the user's next step: --issues)
        "others": list(result.get("others") or []),
        "llm_calls": result.get("llm_calls"),
        "seconds": round(seconds, 3),
        "answer": str(result.get("answer") or ""),
    }


def summarize_fact_mode(rs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Right doctrine found (a gold passage cited), issue recall, conclusion correct (verdict and
    key phrases), verdict correct, declined, uncited and misgrounded sentences, and the judge's
    A/B rate when graded."""
    return {
        "items": len(rs),
        "gold_cited": _rate(rs, "gold_cited"),
        "issue_recall": _rate(rs, "issues_found", "issues"),
        "conclusion_correct": _rate(rs, "conclusion_correct"),
        "verdict_correct": _rate(rs, "verdict_correct"),
        "verdicts_shown_right": _share(
            sum(r["verdict_correct"] for r in rs), sum(r["verdict"] in ("yes", "no") for r in rs)
        ),
        "support_table": support_table(rs),
        "declined": _rate(rs, "abstained"),
        "uncited_sentences": sum(r["uncited_sentences"] for r in rs),
        "misgrounded_sentences": _rate(rs, "misgrounded_sentences", "sentences"),
        "misgrounded_off_agenda": sum(r.get("misgrounded_off_agenda", 0) for r in rs),
        "gold_rule_sentences": _share(
            sum(r.get("gold_rule_sentences") or 0 for r in rs),
            sum(r["rule_sentences"] for r in rs if r.get("gold_rule_sentences") is not None),
        ),
        # of the answers citing no gold passage, those naming a passed-over doctrine that finds one
        "steer_found": _share(
            sum(bool(r.get("steer")) for r in rs if not r["gold_cited"]),
            sum(not r["gold_cited"] for r in rs),
        ),
        "others_gold": _others_gold(rs),
        "judge_a_or_b": _graded(rs),
        **_cost(rs),
    }


def support_table(rs: Sequence[Mapping[str, Any]]) -> str:
    """Precision and coverage of the verdicts as VERDICT_SUPPORT rises: at each support a reading
    reached, how many verdicts would be shown (a yes/no reading whose support reaches it) and how
    many of those are right ("0.412: 3/5 (of 20)"); "" when no reading has a support."""
    readings = [r for r in rs if r.get("reading") in ("yes", "no") and r.get("support") is not None]
    cells = []
    for bar in sorted({float(r["support"]) for r in readings}):
        shown = [r for r in readings if float(r["support"]) >= bar]
        right = sum(r["reading"] == r["expected"] for r in shown)
        cells.append(f"{bar:.3f}: {right}/{len(shown)}")
    return f"{'; '.join(cells)} (of {len(rs)})" if cells else ""


def ceiling_answer(client: Any, item: Mapping[str, Any], gold: Sequence[Mapping[str, Any]]) -> dict:
    """The ceiling of a fact pattern: the same model handed the gold passages and the facts in one
    IRAC call (``skills/irac_ceiling.md``); its sentences cite the gold passages."""
    passages = prompts.format_evidence(list(gold))
    result = prompts.call(client, "irac", question=str(item["question"]), passages=passages)
    parsed = result.parsed
    if parsed is None:
        return {"answer": result.text, "abstained": False, "sentences": [], "verdict": None}
    text = (
        f"Rule: {parsed.rule}\nApplication: {parsed.application}\n"
        f"Bottom line: {parsed.answer}. {parsed.conclusion}"
    )
    ids = [str(g["id"]) for g in gold]
    sentences = [{"text": s, "passage_ids": ids} for s in (parsed.rule, parsed.application)]
    return {"answer": text, "abstained": False, "sentences": sentences, "verdict": parsed.answer}
