"""Phase-3 answer metrics: the open question set, citation counting over the record's sentences,
key-point coverage, quote validity, the grader, and the summary per mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import eval_answers as ea

ABSTAIN_TEXT = (
    "No answer: the research found nothing in the sources that answers this question (off topic)."
)

REPO = Path(__file__).resolve().parent.parent
STARTER = {
    json.loads(line)["idx"]: json.loads(line)
    for line in (REPO / "datasets" / "starter" / "passages.jsonl").read_text().splitlines()
    if line.strip()
}


def test_open_question_set_is_complete_and_its_key_points_are_in_the_starter_corpus():
    items = ea.load_open_questions()
    assert len(items) >= 40
    assert len({i["id"] for i in items}) == len(items)
    by_cat = {c: [i for i in items if i["category"] == c] for c in ea.CATEGORIES}
    assert all(by_cat.values())
    assert all(i["should_abstain"] for i in by_cat["out_of_corpus"])
    for item in by_cat["in_corpus"] + by_cat["multi_hop"]:
        assert 2 <= len(item["key_points"]) <= 5 and not item["should_abstain"]
    for item in items:
        if item["should_abstain"]:
            assert not item["key_points"]
            continue
        gold = " ".join(STARTER[g]["text"] for g in item["gold_ids"])
        hits = ea.key_point_hits(gold, item["key_points"])
        assert all(hits), (
            item["id"],
            [k for k, h in zip(item["key_points"], hits, strict=True) if not h],
        )


def test_citations_are_counted_over_the_records_sentences():
    sentences = [
        {"text": "A plaintiff must prove duty and breach.", "passage_ids": ["p1"]},
        {"text": "Duty of care is met: the store invited her.", "passage_ids": ["p1", "p9"]},
        {"text": "Breach of the duty.", "passage_ids": []},
    ]
    counts = ea.citation_counts(sentences, {"p1": "...", "p2": "..."})
    assert counts == {"sentences": 3, "cited": 2, "valid": 1}  # p9 was never retrieved


def test_key_point_coverage_and_quote_validity():
    answer = "An acceptance is effective when it is dispatched [1]. Rejections matter [2]."
    hits = ea.key_point_hits(
        answer,
        [
            "an acceptance is effective when dispatched",
            "revocations and rejections are effective only on receipt",
            "the rule does not apply to option contracts",
        ],
    )
    assert hits == [True, False, False]
    quotes = [
        {"passage_id": "p", "text": "effective when dispatched", "verdict": "ok"},
        {"passage_id": "p", "text": "invented words", "verdict": "ok"},
        {"passage_id": "p", "text": "about another doctrine", "verdict": "other_doctrine"},
    ]
    assert ea.quote_validity(quotes, {"p": "An acceptance is effective when dispatched."}) == (1, 2)


def test_a_key_point_named_only_in_a_list_of_issues_not_answered_is_not_covered():
    """An answer ending "Not answered: Dying declarations (MAX_STEPS 3 reached)" had been counted
    as covering the key point "dying declaration"."""
    item = {"id": "x", "category": "in_corpus", "should_abstain": False}
    item["key_points"] = ["dying declaration", "prior statement"]
    text = "A prior statement of a testifying witness is not hearsay."
    result = {
        "answer": f"1. Prior statements\n   Rule: {text} [1]\n\nNot answered: Dying declarations.",
        "abstained": False,
        "sentences": [{"text": text, "passage_ids": ["p"]}],
    }
    assert ea.score_answer(item, "research", result, 1.0)["key_points_covered"] == 1


class FakeGrader:
    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.prompts: list[str] = []

    def invoke(self, messages, *, role, schema, max_tokens):
        from llm_config import LLMResult, parse_json_reply

        self.prompts.append("\n".join(m[1] for m in messages))
        assert role == "judge"
        return LLMResult(text=self.reply, parsed=parse_json_reply(self.reply, schema))


def test_grader_sees_the_expectation_and_returns_the_grade():
    items = {i["id"]: i for i in ea.load_open_questions()}
    grader = FakeGrader('{"grade": "B", "reason": "one element missing"}')
    out = ea.grade_answer(
        grader, items["in_mailbox_rule"], "Acceptance is effective on dispatch [1]."
    )
    assert out == {"grade": "B", "reason": "one element missing"}
    assert "effective only on receipt" in grader.prompts[0]
    # A question the sources do not cover is graded on whether the answer declines.
    ea.grade_answer(grader, items["ooc_h1b"], ABSTAIN_TEXT)
    assert "the correct answer DECLINES" in grader.prompts[1]
    assert "Expected key points" not in grader.prompts[1] and ABSTAIN_TEXT in grader.prompts[1]


def test_answers_are_scored_and_summarized_per_mode_with_intervals():
    items = [
        i
        for i in ea.load_open_questions()
        if i["id"] in {"in_mailbox_rule", "ooc_h1b", "in_burglary"}
    ]

    def research(question: str) -> dict:
        text = "An acceptance is effective when dispatched."
        return {
            "answer": f"Rule: {text} [1]",
            "abstained": False,
            "sentences": [{"text": text, "passage_ids": ["p"]}],
            "llm_calls": 4,
        }

    def evidence_mode(question: str) -> dict:
        if "H-1B" in question or "burglary" in question:
            return {"answer": f"{ABSTAIN_TEXT}\nMissing: a rule.", "abstained": True, "quotes": []}
        text = "An acceptance is effective when dispatched."
        return {
            "answer": f"Rule: {text} [1]",
            "abstained": False,
            "sentences": [{"text": text, "passage_ids": ["p"]}],
            "quotes": [{"passage_id": "p", "text": "effective when dispatched", "verdict": "ok"}],
            "passages": {"p": "An acceptance is effective when dispatched."},
            "llm_calls": 4,
        }

    modes = {"research": research, "evidence": evidence_mode}
    rows = [
        ea.score_answer(item, mode, answer(str(item["question"])), 1.0)
        for item in items
        for mode, answer in modes.items()
    ]
    assert all("grade" not in r for r in rows)  # grading is its own pass
    for r in rows:
        r["grade"] = "A" if "dispatched" in r["answer"] else "D"
    summary = ea.summarize_answers(rows)
    ev, rs = summary["evidence"], summary["research"]
    assert ev["abstention_recall"]["rate"] == 1.0 and rs["abstention_recall"]["rate"] == 0.0
    assert ev["false_abstention"]["k"] == 1 and ev["false_abstention"]["n"] == 2
    assert ev["cited_sentences"]["rate"] == 1.0 and ev["uncited_sentences"] == 0
    assert ev["quote_validity"] == {
        "k": 1,
        "n": 1,
        "rate": 1.0,
        "ci95": ev["quote_validity"]["ci95"],
    }
    lo, hi = ev["quote_validity"]["ci95"]
    assert 0 < lo < 1 and hi == 1.0
    assert ev["a_or_b"]["k"] == 1 and ev["grades"] == {"A": 1, "D": 2}
    assert 0 < ev["key_point_coverage"]["mean"] < 1


def test_interleaving_takes_the_categories_in_turn_so_a_short_run_covers_each():
    items = [
        {"id": f"{c}{i}", "category": c} for c in ("a", "b", "c") for i in range(3 - "abc".index(c))
    ]
    order = [it["id"] for it in ea.interleave_categories(items)]
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2"]
    first = ea.interleave_categories(ea.load_open_questions())[:4]
    assert {it["category"] for it in first} == set(ea.CATEGORIES)


def test_phase3_table_has_a_row_per_metric_and_a_column_per_mode():
    import eval_comprehensive

    share = {"k": 3, "n": 16, "rate": 0.1875, "ci95": [0.066, 0.43]}
    table = eval_comprehensive.answers_table(
        {
            "research": {"gold_cited": share, "uncited_sentences": 0},
            "ceiling": {"gold_cited": share},
        }
    )
    head, gold, uncited = table.splitlines()
    assert head.split() == ["metric", "research", "ceiling"]
    assert gold.split()[:3] == ["gold_cited", "3/16", "0.19"] and "(0.07–0.43)" in gold
    assert uncited.split() == ["uncited_sentences", "0", "—"]


def test_a_fact_pattern_answer_counts_sentences_on_another_doctrine_as_misgrounded():
    item = {
        "id": "fp",
        "split": "tune",
        "answer": "yes",
        "issues": [{"gold_ids": ["g1"]}, {"gold_ids": ["g2"]}],
        "conclusion_keys": [["liable"]],
    }
    sentences = [
        {"issue": "Negligence", "text": "Rule.", "passage_ids": ["g1"]},
        {"issue": "Negligence", "text": "A second rule.", "passage_ids": ["near_g1", "x"]},
        {"issue": "Negligence", "text": "Off the gold doctrine.", "passage_ids": ["x"]},
        {"issue": "Arson", "text": "Another doctrine.", "passage_ids": ["y"]},
    ]
    result = {"answer": "Bottom line: yes, the store is liable.", "sentences": sentences}
    result["others"] = ["Products liability"]  # named, not researched: kept for the steer count
    row = ea.score_fact_pattern(item, "research", result, 1.0, lambda p, gold: p == "near_g1")
    assert row["others"] == ["Products liability"]
    assert (row["gold_cited"], row["issues_found"], row["verdict"]) == (True, 1, "yes")
    assert row["conclusion_correct"]
    # the third sentence cites neither gold nor its doctrine; the Arson one is off the agenda
    assert (row["misgrounded_sentences"], row["misgrounded_off_agenda"]) == (2, 1)
    assert row["cited_by_issue"] == {"Negligence": ["g1", "near_g1", "x"], "Arson": ["y"]}
    missed = {**row, "gold_cited": False, "steer": ["Products liability"]}
    steered = ea.summarize_fact_mode([row, missed, {**missed, "steer": []}])["steer_found"]
    assert (steered["k"], steered["n"]) == (1, 2)  # of the two answers citing no gold passage
    declined = ea.score_fact_pattern(item, "research", {"answer": "No answer", "abstained": True}, 1.0, lambda p, g: False)  # fmt: skip
    assert declined["sentences"] == declined["misgrounded_sentences"] == 0
    assert declined["cited_by_issue"] == {} and not declined["conclusion_correct"]


def test_an_open_answer_counts_sentences_on_another_doctrine_as_misgrounded():
    """An answerable open question with gold passages gets the fact patterns' misgrounding count;
    a question to decline, or one without gold passages, has none (and the summary skips it)."""
    item = {"id": "q", "category": "in_corpus", "should_abstain": False, "gold_ids": ["g"]}
    sentences = [
        {"text": "The rule.", "passage_ids": ["g"]},
        {"text": "Its sibling passage.", "passage_ids": ["near_g"]},
        {"text": "Another doctrine.", "passage_ids": ["x"]},
    ]
    result = {"answer": "The rule.", "abstained": False, "sentences": sentences}
    same = lambda p, gold: p == "near_g"  # noqa: E731
    row = ea.score_answer(item, "research", result, 1.0, same)
    assert row["misgrounded_sentences"] == 1
    no_gold = ea.score_answer({**item, "gold_ids": []}, "research", result, 1.0, same)
    assert no_gold["misgrounded_sentences"] is None
    summary = ea.summarize_mode([row, no_gold])
    assert (summary["misgrounded_sentences"]["k"], summary["misgrounded_sentences"]["n"]) == (1, 3)


def test_the_document_patterns_gold_sentences_are_in_their_documents_as_loaded(tmp_path):
    """The document fact patterns name their gold by words of the sentence (a loaded document's
    passage ids depend on where the file is): each must resolve to passages of its documents as
    they are chunked today, both halves are there, and a missing document is named."""
    import documents

    path = REPO / "datasets" / "document_patterns.jsonl"
    items = ea.load_fact_patterns(path, "all")
    assert {it["split"] for it in items} == {"tune", "report"} and len(items) >= 10
    files = ea.pattern_documents(items, path)
    assert {f.name for f in files} == {Path(d).name for it in items for d in it["documents"]}
    chunks = [c for f in files for c in documents.chunk_document(documents.read_document(f))]
    ea.resolve_gold_text(items, [{"id": c["idx"], "text": c["text"]} for c in chunks])
    for it in items:
        own = {documents.document_id(path.parent / d) for d in it["documents"]}
        for issue in it["issues"]:
            assert issue["gold_ids"] and all(g.split("#")[0] in own for g in issue["gold_ids"])
    with pytest.raises(ValueError, match="no loaded passage holds"):
        ea.resolve_gold_text(items, [])
    gone = [{**items[0], "documents": ["documents/nope.txt"]}]
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        ea.pattern_documents(gone, path)


def test_a_document_patterns_row_counts_the_rule_sentences_that_are_its_gold():
    """A case's narrative quoted as its rule cites a gold passage (the same chunk) and so counted
    as found: the row also counts the quoted rule sentences holding words of the gold."""
    item = {"id": "x", "split": "tune", "answer": "yes", "conclusion_keys": [],
            "issues": [{"name": "rule", "gold_ids": ["op#1"], "gold_text": ["must take reasonable"]}]}  # fmt: skip
    sentences = [
        {"text": "A store must take reasonable steps.", "role": "rule", "issue": "Op", "passage_ids": ["op#1"]},
        {"text": "The manager testified.", "role": "rule", "issue": "Op", "passage_ids": ["op#1"]},
        {"text": "Not settled.", "role": "conclusion", "issue": "Op", "passage_ids": ["op#1"]},
    ]  # fmt: skip
    row = ea.score_fact_pattern(item, "research", {"sentences": sentences}, 1.0, lambda *a: False)
    assert (row["rule_sentences"], row["gold_rule_sentences"]) == (2, 1)
    assert ea.summarize_fact_mode([row])["gold_rule_sentences"]["k"] == 1
    plain = {**item, "issues": [{"name": "rule", "gold_ids": ["op#1"]}]}
    assert (
        ea.score_fact_pattern(plain, "research", {"sentences": sentences}, 1.0, lambda *a: False)[
            "gold_rule_sentences"
        ]
        is None
    )


def test_an_open_answers_row_keeps_the_doctrines_it_names_and_the_summary_counts_the_useful_ones():
    """The open set's answers name passed-over doctrines too ("Other doctrines the sources hold,
    not researched"), but its rows kept none of them, so no run could say whether they help."""
    item = {"id": "q", "category": "in_corpus", "should_abstain": False, "key_points": []}
    result = {"answer": "x [1]", "sentences": [], "others": ["Mailbox rule", "Perfect tender rule"]}
    row = ea.score_answer(item, "research", result, 1.0)
    assert row["others"] == ["Mailbox rule", "Perfect tender rule"]
    row["steer"] = ["Mailbox rule"]
    assert ea.summarize_mode([row])["others_gold"]["k"] == 1
    assert ea.summarize_mode([row])["others_gold"]["n"] == 2
