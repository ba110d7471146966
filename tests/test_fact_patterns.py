"""The fact-pattern dataset (datasets/fact_patterns.jsonl): shape, balance, and grounding in the starter corpus."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

DATASETS = Path(__file__).resolve().parent.parent / "datasets"
FACT_PATTERNS = DATASETS / "fact_patterns.jsonl"
PASSAGES = DATASETS / "starter" / "passages.jsonl"

SUBJECTS = (
    "TORTS",
    "CONTRACTS",
    "CRIM. LAW",
    "CRIM. PRO.",
    "EVIDENCE",
    "CONST. LAW",
    "REAL PROP.",
    "CIV. PRO.",
)
FIELDS = {
    "id": str,
    "subject": str,
    "split": str,
    "question": str,
    "answer": str,
    "issues": list,
    "conclusion": str,
    "conclusion_keys": list,
    "should_abstain": bool,
}
REQUIRED_TUNE = {
    "fp_torts_slip_and_fall",
    "fp_contracts_firm_offer_plywood",
    "fp_crimpro_suspended_license_car_search",
    "fp_realprop_garden_strip",
    "fp_evidence_dying_victim_names_shooter",
    "fp_civpro_removal_aggregated_claims",
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Parse a JSON-lines file, skipping blank lines."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


ITEMS = read_jsonl(FACT_PATTERNS)
PASSAGE_TEXT: dict[str, str] = {p["idx"]: p["text"] for p in read_jsonl(PASSAGES)}


def gold_ids(item: dict[str, Any]) -> list[str]:
    """Every gold passage id named by the item's issues, in order."""
    return [gid for issue in item["issues"] for gid in issue["gold_ids"]]


def gold_text(item: dict[str, Any]) -> str:
    """The item's gold passages joined together, lowercased."""
    return " ".join(PASSAGE_TEXT[gid] for gid in gold_ids(item)).lower()


by_id = pytest.mark.parametrize("item", ITEMS, ids=[item["id"] for item in ITEMS])


def test_item_count_and_unique_ids() -> None:
    ids = [item["id"] for item in ITEMS]
    assert len(ITEMS) == 40  # 32 in legal words, 8 in everyday words (fp_lay_*)
    assert len(set(ids)) == len(ids)


@by_id
def test_fields_and_types(item: dict[str, Any]) -> None:
    assert set(item) == set(FIELDS)
    for name, kind in FIELDS.items():
        assert isinstance(item[name], kind), name
    assert item["id"].startswith("fp_")
    assert item["subject"] in SUBJECTS
    assert item["split"] in {"tune", "report"}
    assert item["answer"] in {"yes", "no"}
    assert item["should_abstain"] is False
    assert item["conclusion"].strip()


@by_id
def test_issues_shape(item: dict[str, Any]) -> None:
    assert 1 <= len(item["issues"]) <= 3
    for issue in item["issues"]:
        assert set(issue) == {"name", "gold_ids"}
        assert isinstance(issue["name"], str) and issue["name"].strip()
        assert 1 <= len(issue["gold_ids"]) <= 2
        assert all(isinstance(gid, str) for gid in issue["gold_ids"])


@by_id
def test_gold_ids_exist_in_corpus(item: dict[str, Any]) -> None:
    missing = [gid for gid in gold_ids(item) if gid not in PASSAGE_TEXT]
    assert not missing


@by_id
def test_question_is_a_single_yes_no_stem(item: dict[str, Any]) -> None:
    question = item["question"]
    assert question.endswith("?")
    assert "(A)" not in question
    assert 50 <= len(question.split()) <= 120


@by_id
def test_conclusion_keys_grounded_in_gold_passages(item: dict[str, Any]) -> None:
    keys = item["conclusion_keys"]
    assert 1 <= len(keys) <= 3
    text = gold_text(item)
    for group in keys:
        assert isinstance(group, list) and group
        assert all(
            isinstance(p, str) and p == p.lower() and 1 <= len(p.split()) <= 3 for p in group
        ), group
        assert any(phrase in text for phrase in group), (
            f"no phrase of {group} occurs in the gold passages"
        )


def test_four_items_per_subject_two_per_split() -> None:
    """The 32 items in legal words; the everyday-words items split four and four."""
    legal = [item for item in ITEMS if not item["id"].startswith("fp_lay_")]
    per_subject = Counter(item["subject"] for item in legal)
    per_split = Counter((item["subject"], item["split"]) for item in legal)
    assert per_subject == {subject: 4 for subject in SUBJECTS}
    assert all(
        per_split[(subject, split)] == 2 for subject in SUBJECTS for split in ("tune", "report")
    )
    lay = Counter(item["split"] for item in ITEMS if item["id"].startswith("fp_lay_"))
    assert lay == {"tune": 4, "report": 4}


def test_required_items_are_in_tune() -> None:
    splits = {item["id"]: item["split"] for item in ITEMS}
    assert {item_id: splits.get(item_id) for item_id in REQUIRED_TUNE} == dict.fromkeys(
        REQUIRED_TUNE, "tune"
    )


def test_answers_are_roughly_balanced() -> None:
    yes = sum(item["answer"] == "yes" for item in ITEMS)
    assert 0.35 <= yes / len(ITEMS) <= 0.65
