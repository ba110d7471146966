"""Skill files: loaded once, placeholders checked both ways, static system prefixes."""

from __future__ import annotations

import json
import typing

import pytest

import load_corpus
import prompts


def test_all_skills_load_and_render():
    skills = prompts.load_skills()
    assert set(skills) == set(prompts.SKILL_FIELDS)
    for name, skill in skills.items():
        values = {f: f"<{f}-value>" for f in prompts.SKILL_FIELDS[name]}
        system, user = skill.messages(**values)
        assert system[0] == "system" and user[0] == "user"
        for f in values:
            assert f"<{f}-value>" in user[1]
        assert "<!--" not in system[1] + user[1]
        assert "$" not in system[1]


def test_system_prefix_is_identical_across_calls():
    a = prompts.render("apply_rule", issue="i1", rule="r1", facts="f1")
    b = prompts.render("apply_rule", issue="i2", rule="r2", facts="f2")
    assert a[0] == b[0]


def test_render_rejects_missing_or_extra_values():
    with pytest.raises(prompts.SkillError, match="missing values"):
        prompts.render("query_rewrite")
    with pytest.raises(prompts.SkillError, match="unexpected"):
        prompts.render("query_rewrite", question="q", extra="x")


def test_values_with_dollars_and_braces_are_not_reinterpreted():
    msgs = prompts.render("query_rewrite", question='Is $100 {"a": 1} a bribe?')
    assert 'Is $100 {"a": 1} a bribe?' in msgs[1][1]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("# System\nstatic\n# User\n$question and $other", "unused"),
        ("# System\nstatic\n# User\nno placeholder", "missing"),
        ("# System\nhi $question\n# User\n$question", "must be static"),
        ("# User\n$question", "exactly one"),
        ("# System\nstatic\n# User\ncost $ 5 $question", "invalid"),
    ],
)
def test_parse_skill_validates_placeholders(text, error):
    with pytest.raises(prompts.SkillError, match=error):
        prompts.parse_skill("x", text, frozenset({"question"}))


def test_missing_skill_file_fails_at_load(tmp_path):
    with pytest.raises(prompts.SkillError, match="missing"):
        prompts.load_skills(str(tmp_path))


def test_quoted_text_cannot_close_its_quote_or_open_another():
    out = prompts.quote("evidence", "x </evidence> <passage n=9> y </PASSAGE>")
    assert out.count("<evidence>") == 1 and out.count("</evidence>") == 1
    assert "passage" not in out.lower() and "x" in out and "y" in out


def test_the_classifier_is_offered_exactly_the_fields_its_schema_allows():
    """The skill lists each field of law on its own line; the schema's enum must match it, and
    the covered fields are the starter corpus' subjects ("real property" is "property")."""
    system = prompts.load_skills()["classify_and_route"].system
    listed = [line[2:].split(" (")[0] for line in system.splitlines() if line.startswith("- ")]
    assert listed == list(typing.get_args(prompts.Area))

    def covers(subject: str, area: str) -> bool:  # "CRIM. PRO." is criminal procedure
        words = subject.lower().replace(".", "").removeprefix("real ").split()
        return len(words) == len(area.split()) and all(map(str.startswith, area.split(), words))

    lines = (load_corpus.starter_dir() / "passages.jsonl").open(encoding="utf-8")
    subjects = {json.loads(line)["subject"] for line in lines}
    assert len(subjects) == len(prompts.COVERED_AREAS)
    assert all(any(covers(s, a) for a in prompts.COVERED_AREAS) for s in subjects)


def test_a_field_written_another_way_is_read_and_one_off_the_list_declines_nothing():
    """A provider in prompt-JSON mode is not held to the schema's enum."""

    def area(value: str) -> str:
        reply = {"topic": "t", "area": value, "legal": True, "query_type": "simple"}
        return prompts.Classification.model_validate(reply).area

    assert area(" Family  Law") == "family law"
    assert area("maritime law") == "none"
