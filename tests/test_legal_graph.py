"""The doctrine taxonomy and issue spotting: alias matching, linking a question to doctrines, and
the research agenda merged from the model's issues and the linked doctrines."""

from __future__ import annotations

import json

import pytest

import legal_graph as lg

DEMO = (
    "A public university suspended a student for a speech at a campus rally in which she "
    "criticized the government on religious grounds, without giving her notice or a hearing. "
    "Which constitutional rights were violated, and what must she show for each claim?"
)

# ------------------------------------------------------------------------------------------------
# taxonomy
# ------------------------------------------------------------------------------------------------


def _mentioned(text: str, tax: lg.Taxonomy) -> set[str]:
    """The doctrines whose aliases occur in ``text``."""
    return {did for m in tax.find(text) for did in m.doctrine_ids}


def test_taxonomy_covers_the_mbe_subjects_with_several_hundred_doctrines():
    tax = lg.load_taxonomy()
    subjects = sorted({d.subject for d in tax.doctrines.values()})
    assert len(tax.doctrines) >= 300
    assert subjects == [
        "Civil Procedure",
        "Constitutional Law",
        "Contracts and Sales (UCC Article 2)",
        "Criminal Law and Procedure",
        "Evidence",
        "Real Property",
        "Torts",
    ]
    per_subject = {s: sum(d.subject == s for d in tax.doctrines.values()) for s in subjects}
    assert min(per_subject.values()) >= 30, per_subject
    for d in tax.doctrines.values():
        assert d.aliases and d.description and d.name, d.id


def test_demo_issues_exist_with_the_phrasings_a_question_uses():
    tax = lg.load_taxonomy()
    for text, doctrine in [
        ("a campus rally", "conlaw.public_forum"),
        ("a content-based restriction", "conlaw.content_based"),
        ("on religious grounds", "conlaw.free_exercise"),
        ("without notice or a hearing", "conlaw.procedural_due_process"),
        ("the university suspended a student", "conlaw.student_discipline"),
        ("her right to free speech", "conlaw.free_speech"),
    ]:
        assert doctrine in _mentioned(text, tax), text
    assert tax.root("conlaw.student_discipline") == "conlaw.procedural_due_process"
    assert tax.root("conlaw.public_forum") == "conlaw.free_speech"


def test_a_broken_taxonomy_is_a_one_line_error_naming_the_file(tmp_path):
    bad = tmp_path / "tax.jsonl"
    bad.write_text(
        json.dumps({"id": "a", "name": "A", "subject": "S", "related_to": ["missing"]}) + "\n"
    )
    with pytest.raises(lg.TaxonomyError, match=r"tax.jsonl: a.related_to names unknown doctrine"):
        lg.load_taxonomy(bad)


def test_doctrine_mentions_are_whole_word_case_insensitive_longest_match():
    tax = lg.load_taxonomy()
    got = _mentioned("SUBSTANTIVE DUE PROCESS protects fundamental rights", tax)
    assert "conlaw.substantive_due_process" in got
    assert "conlaw.procedural_due_process" not in got  # "due process" is inside the longer alias
    assert tax.find("hearsays and overhearsay") == []
    found = [(m.alias, m.doctrine_ids) for m in tax.find("Hearsay, hearsay and res ipsa loquitur")]
    assert found == [
        ("hearsay", ("evidence.hearsay",)),
        ("hearsay", ("evidence.hearsay",)),
        ("res ipsa loquitur", ("torts.res_ipsa",)),
    ]


# ------------------------------------------------------------------------------------------------
# issue spotting
# ------------------------------------------------------------------------------------------------


def _claims(items: list[str]) -> set[str]:
    tax = lg.load_taxonomy()
    out = set()
    for item in items:
        did = lg.issue_doctrine(item, tax)
        if did:
            out.add(tax.root(did))
    return out


DEMO_CLAIMS = {"conlaw.free_speech", "conlaw.free_exercise", "conlaw.procedural_due_process"}


def test_demo_agenda_from_aliases_covers_speech_religion_and_due_process(tmp_settings):
    linked = lg.link_doctrines(DEMO, tmp_settings, k=6, use_embeddings=False)
    agenda = lg.claim_agenda(linked)
    assert len(agenda) == len(set(agenda))
    assert _claims(agenda) >= DEMO_CLAIMS


def test_the_agenda_names_a_claim_once_with_the_doctrines_it_absorbed():
    tax = lg.load_taxonomy()
    linked = [tax["evidence.hearsay"], tax["evidence.present_sense"], tax["evidence.hearsay"]]
    assert lg.claim_agenda(linked) == ["Hearsay (Present sense impression)"]
    assert lg.claim_agenda([*linked, tax["torts.negligence"]], max_items=1) == [
        "Hearsay (Present sense impression)"
    ]


@pytest.mark.slow
def test_demo_agenda_with_the_real_embedder(tmp_settings):
    linked = lg.link_doctrines(DEMO, tmp_settings, k=6)
    assert {lg.load_taxonomy().root(d.id) for d in linked} >= DEMO_CLAIMS
    agenda = lg.claim_agenda(linked, max_items=3)
    assert _claims(agenda) == DEMO_CLAIMS


def test_an_issue_named_in_the_users_words_is_researched_under_the_doctrine_they_name_too():
    """`--issues propensity`: the step searches "Character evidence" beside the user's word; a
    candidate the user names is kept as it is, and words naming no doctrine are searched as
    written."""
    import nodes

    agenda = nodes.user_agenda(
        ["propensity", "Arrest", "zzyzx widgets"], ["Arrest"], lg.doctrine_named
    )
    assert agenda == ["propensity (Character evidence)", "Arrest", "zzyzx widgets"]
    assert "Character evidence" in nodes.step_for(1, agenda[0], [])["strategy"]["queries"]
    assert lg.doctrine_named("character evidence") == "Character evidence"
    assert nodes.user_agenda(["character evidence"], [], lg.doctrine_named) == [
        "character evidence"
    ]
    # a user's "--issues 'Withdrawal from conspiracy; Accomplice liability'" researched the first
    # as "Withdrawal from conspiracy (Accomplice liability)": "withdrawal" was accomplice
    # liability's alias alone
    assert nodes.user_agenda(["Withdrawal from conspiracy"], [], lg.doctrine_named) == [
        "Withdrawal from conspiracy (Conspiracy)"
    ]
