"""The answer stage's logic (answer.py) with a bag-of-words embedder and a scripted model."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from conftest import BagOfWordsEmbedder
from fakes import CutOff, scripted_client

import answer
import question as question_mod
from prompts import Check
from question import Question

EMBED = BagOfWordsEmbedder().embed_documents

GANT = {
    "id": "sia",
    "title": "Search incident to arrest",
    "text": "Search incident to a lawful arrest. After a lawful custodial arrest, police may search "
    "the arrestee's person and the area within his immediate control. For vehicles, police may "
    "search the passenger compartment incident to arrest only if the arrestee is unsecured and "
    "within reaching distance, or if it is reasonable to believe evidence of the crime of arrest "
    "is inside. Police may seize a cell phone incident to arrest.",
}
PRODUCTS = {
    "id": "prod",
    "title": "Products liability: design defects",
    "text": "Design defects. A product is defective in design when a reasonable alternative "
    "design would have reduced the risk.",
}
FACTS = (
    "Police arrested Dan for driving with a suspended license. They handcuffed him and locked him "
    "in the patrol car. Then they searched the passenger compartment of his car and found cocaine. "
    "Can he get the cocaine suppressed?"
)


def test_the_question_splits_into_facts_and_what_is_asked():
    facts, asked = question_mod.split_question(FACTS)
    assert asked == "Can he get the cocaine suppressed?"
    assert facts[1] == "They handcuffed him and locked him in the patrol car."
    assert question_mod.question_kind(FACTS, None) == "fact_pattern"
    assert question_mod.question_kind("What is the mailbox rule?", None) == "rule_question"
    assert question_mod.question_kind(FACTS, {"A": "x", "B": "y"}) == "multiple_choice"


@pytest.mark.parametrize(
    ("question", "fact"),
    [
        (
            "Lena borrowed her neighbor's ladder. It broke while she was using it, through no "
            "fault of hers. Is she liable to the neighbor?",
            "It broke while she was using it, through no fault of hers.",
        ),
        ("Ann lent Bo her car. He kept it for a month. Is he liable?", "He kept it for a month."),
    ],
)
def test_a_fact_the_sentence_splitter_leaves_in_front_of_the_question_is_a_fact(question, fact):
    """Punkt reads "Is" after "...no fault of hers." as inside the sentence: the fact that
    decides a user's ladder question was read as part of what is asked, not as a fact."""
    facts, asked = question_mod.split_question(question)
    assert facts[-1] == fact and asked.startswith("Is ")
    # an abbreviation before the question is not cut
    assert question_mod.split_question("Was Smith v. Jones overruled?")[1] == (
        "Was Smith v. Jones overruled?"
    )


def test_the_rule_is_the_passages_own_sentences_closest_to_the_issue_and_its_facts():
    rule = answer.select_rule("vehicle passenger compartment arrestee handcuffed", [GANT], EMBED)
    sentences = [s for _, s in rule]
    assert all(s in GANT["text"] for s in sentences)  # verbatim
    assert any("passenger compartment" in s for s in sentences)
    assert not any(
        s.startswith("Search incident to a lawful arrest.") for s in sentences
    )  # heading


def test_a_heading_that_restates_the_title_is_never_a_rule():
    """A seven-word heading ("Consequential damages and the Hadley v. Baxendale rule.") matched a
    query about damages and was shown, and applied, as a rule; a first sentence that states one
    ("There is one form of action—the civil action.") stays."""
    hadley = {
        "id": "hadley",
        "title": "Consequential damages: Hadley v. Baxendale foreseeability",
        "text": "Consequential damages and the Hadley v. Baxendale rule. Damages for breach are "
        "limited to losses that were reasonably foreseeable when the contract was made.",
    }
    rule2 = {
        "id": "frcp_2",
        "title": "Rule 2. One Form of Action",
        "text": "There is one form of action—the civil action.",
    }
    rule = answer.select_rule("consequential damages Hadley Baxendale rule", [hadley], EMBED)
    assert [s for _, s in rule] == [
        "Damages for breach are limited to losses that were reasonably foreseeable when the "
        "contract was made."
    ]
    assert answer.candidate_sentences(rule2) == ["There is one form of action—the civil action."]


def test_a_document_chunks_heading_lines_never_open_its_first_rule():
    """A loaded document's chunk opens with its title and section heading on lines of their own;
    joined to the first paragraph they made the rule read "Ohio Revised Code 5321.16 — Security
    deposits Return of the deposit Any deduction ..."."""
    chunk = {
        "id": "ohio#2",
        "title": "Ohio Revised Code 5321.16 — Security deposits",
        "heading": "Ohio Revised Code 5321.16 — Security deposits > Return of the deposit",
        "text": "Ohio Revised Code 5321.16 — Security deposits\nReturn of the deposit\nAny "
        "deduction from the security deposit shall be itemized in a written notice. The notice "
        "is due within thirty days after termination of the rental agreement.",
    }
    assert answer.candidate_sentences(chunk) == [
        "Any deduction from the security deposit shall be itemized in a written notice.",
        "The notice is due within thirty days after termination of the rental agreement.",
    ]
    notes = {"id": "n", "title": "Amendment", "text": "Party may amend once without consent of the court\n- Only allowed one time."}  # fmt: skip
    assert answer.candidate_sentences(notes)[0].startswith("Party may amend once")
    # a case's caption and a statute's citation line are not rules, nor the start of one
    opinion = {"id": "s", "title": "Smith v. Jones", "text": "SMITH v. JONES Supreme Court of Ohio Decided March 3, 2022\nThe plaintiff sued her neighbor for flying a drone over her yard. We hold that a single overflight is not an intrusion upon seclusion."}  # fmt: skip
    assert answer.candidate_sentences(opinion)[0] == (
        "The plaintiff sued her neighbor for flying a drone over her yard."
    )
    cite = {"id": "c", "title": "Drone Privacy Act", "text": "Drone Privacy Act\nOhio Rev. Code § 4561.99 (enacted 2023-05-01)"}  # fmt: skip
    assert answer.candidate_sentences(cite) == []


def test_the_rule_comes_from_the_passage_that_fits_the_facts_not_only_the_first_found():
    """The search ranked the joint-tenancy severance passage third; the facts (a conveyance by
    one joint tenant) pick its sentence over the first passages' general ones."""
    general = {"id": "co", "title": "Concurrent ownership", "text": "Concurrent ownership. "
               "Cotenants each have the right to possess the whole property at all times."}  # fmt: skip
    kinds = {"id": "kinds", "title": "Concurrent ownership: kinds", "text": "Kinds of cotenancy. "
             "A tenancy in common has no right of survivorship between the cotenants."}  # fmt: skip
    severance = {"id": "sev", "title": "Joint tenancy and severance", "text": "Severance. "
                 "A joint tenant who conveys his share to a buyer severs the joint tenancy."}  # fmt: skip
    rule = answer.select_rule(
        "Concurrent ownership joint tenant conveys share buyer",
        [general, kinds, severance],
        EMBED,
        1,
    )
    assert [d["id"] for d, _ in rule] == ["sev"]


def test_a_passage_about_another_doctrine_is_told_apart():
    scores = answer.doctrine_scores("Search incident to arrest", [GANT, PRODUCTS], EMBED)
    assert [s >= answer.DOCTRINE_MATCH for s in scores] == [True, False]


@pytest.mark.parametrize(
    "mets, outcome",
    [(["yes", "yes"], "yes"), (["yes", "no"], "no"), (["yes", "unclear"], "unclear")],
)
def test_the_issue_outcome_follows_from_its_requirements(mets, outcome):
    checks = [Check(requirement=f"r{i}", fact="f", met=m) for i, m in enumerate(mets)]
    assert answer._outcome(checks) == outcome


def test_an_application_cut_off_mid_check_keeps_the_complete_ones():
    full = {"checks": [{"n": 1, "fact": "b", "met": "no"}, {"n": 2, "fact": "d", "met": "yes"}]}  # fmt: skip
    text = json.dumps(full)
    got = answer.complete_checks(text[: text.index('"d"') + 2])
    assert [c.fact for c in got.checks] == ["b"]
    assert answer.complete_checks('{"checks": [{"requi') is None


def test_a_record_applies_the_rule_and_answers_the_question(tmp_settings):
    apply = json.dumps({"checks": [{"n": 2, "fact": "he was handcuffed in the patrol car", "met": "no"}]})  # fmt: skip
    bottom = json.dumps({"answer": "yes", "conclusion": 1})
    client, script = scripted_client(tmp_settings, {"apply": [apply], "bottom_line": [bottom]})
    research = [
        answer.IssueResearch("Search incident to arrest", [GANT]),
        answer.IssueResearch(
            "Automobile exception", [], researched=False, why="MAX_STEPS 1 reached"
        ),
    ]
    record = answer.build_record(client, Question.read(FACTS), research, EMBED)
    assert record.verdict == "yes" and not record.abstained and record.grounded
    # the application names the rule sentence by its opening words: it is quoted whole above it
    assert (
        'Application: "For vehicles, police may search the passenger compartment incident to…" '
        "— not met: he was handcuffed in the patrol car. [2]" in record.text
    )
    assert (
        'rule does not apply: the facts do not meet "For vehicles, police may search' in record.text
    )
    # the bottom line answers the question as asked, in the words of the conclusion the model
    # named, with that issue's citations
    assert (
        "Bottom line: Can he get the cocaine suppressed? Yes. Search incident to arrest: the rule "
        "does not apply: the facts do not meet" in record.text
    )
    conclusion = next(s for s in record.issues[0].sentences if s.role == "conclusion")
    assert record.issues[-1].sentences[0].cites == conclusion.cites
    assert record.text.endswith("Not answered: Automobile exception (MAX_STEPS 1 reached).")
    # the facts and the rule reach the application call; the conclusions reach the bottom line
    assert "locked him in the patrol car" in script.prompts("apply")[0]
    assert "rule does not apply" in script.prompts("bottom_line")[0]
    lines = answer.render_sources(record.to_dict()["citations"])
    assert lines[0].startswith('[1] Search incident to arrest (sia): "')


def test_a_rule_questions_rule_is_its_passages_rule_with_what_the_question_asks(tmp_settings):
    """A rule question is answered by the rule as its source states it: the first sentences of
    the passage most about the issue's doctrine, in its order, and the one closest to the
    question when that comes later.  Chosen by closeness to the question across passages, the
    mailbox rule's answer left out "effective when dispatched"."""
    land = {
        "id": "land",
        "title": "Landowner duties: trespassers, licensees, invitees",
        "text": "Landowner duties. A possessor's duty depends on the entrant's status. "
        "Undiscovered trespassers are owed only freedom from willful harm. Discovered "
        "trespassers must be warned of known deadly artificial conditions. A licensee must be "
        "warned of known concealed dangers. An invitee is owed reasonable care, including a "
        "duty to inspect.",
    }
    other = {"id": "trespass", "title": "Trespass to land", "text": "Trespass to land. An invitee who stays past the invitation's scope becomes a trespasser to land."}  # fmt: skip
    client, script = scripted_client(tmp_settings, {})
    issue = "Landowner duties: trespassers, licensees, invitees"
    research = [answer.IssueResearch(issue, [other, land])]
    question = "What duty does a landowner owe to an invitee?"
    record = answer.build_record(client, Question.read(question), research, EMBED)
    rules = [s.text for s in record.issues[0].sentences if s.role == "rule"]
    assert rules == [
        "A possessor's duty depends on the entrant's status.",
        "Undiscovered trespassers are owed only freedom from willful harm.",
        "Discovered trespassers must be warned of known deadly artificial conditions.",
        "An invitee is owed reasonable care, including a duty to inspect.",
    ]
    assert script.calls == []  # a rule question: no application, no bottom line


def _rule_answer(tmp_settings, question: str, *passages: dict) -> answer.AnswerRecord:
    """The answer to a rule question researched as one issue per passage, named by its title (a
    rule question makes no model call)."""
    client, script = scripted_client(tmp_settings, {})
    research = [answer.IssueResearch(p["title"], [p]) for p in passages]
    record = answer.build_record(client, Question.read(question), research, EMBED)
    assert script.calls == []
    return record


def test_a_rule_questions_later_issue_far_from_what_it_asks_is_named_not_answered(tmp_settings):
    """Asked for the requirements of adverse possession, the planner's later picks were personal
    jurisdiction and attractive nuisance: an issue after the first whose rule is far from the
    question is named under "Considered, but not what the question asks" (guard not_asked)."""
    possession = {"id": "ap", "title": "Adverse possession", "text": "Adverse possession. A possessor acquires title by possession that is actual, open, exclusive, hostile and continuous for the statutory period."}  # fmt: skip
    forum = {"id": "pj", "title": "Personal jurisdiction", "text": "Personal jurisdiction. A court may hear a claim against a defendant with minimum contacts with the forum state."}  # fmt: skip
    question = "What are the requirements for adverse possession of land?"
    record = _rule_answer(tmp_settings, question, possession, forum)
    status = {i.issue: i for i in record.issues}
    assert status["Adverse possession"].status == "answered"
    assert status["Personal jurisdiction"].status == "not_raised"
    assert status["Personal jurisdiction"].why.startswith("its rule does not fit what the question")
    assert record.guards["not_asked"] == 1 and record.guards["off_facts"] == 0
    assert "Considered, but not what the question asks: Personal jurisdiction." in record.text
    assert [c.passage_id for c in record.citations] == ["ap"]


def test_a_rule_question_that_names_its_issue_answers_no_other_issue_for_its_fit(tmp_settings):
    """ "What is the mailbox rule?" quoted time, place and manner restrictions beside the mailbox
    rule: both rules sat far from the question, and the better fit of the two was applied as the
    best fit.  Where what is asked names an issue, no other is applied for fitting best."""
    mailbox = {"id": "mb", "title": "Mailbox rule", "text": "Mailbox rule. Under the mailbox doctrine an acceptance sent by post is effective when dispatched."}  # fmt: skip
    speech = {"id": "tpm", "title": "Time, place and manner restrictions", "text": "Time, place and manner restrictions. The rule for speeches in parks must be content neutral."}  # fmt: skip
    record = _rule_answer(tmp_settings, "What is the mailbox rule?", mailbox, speech)
    assert [i.status for i in record.issues] == ["answered", "not_raised"]
    assert record.issues[1].why.startswith("its rule does not fit what the question asks")
    assert [c.passage_id for c in record.citations] == ["mb"]


def test_a_rule_question_that_names_its_issue_is_answered_on_it_and_issues_named_after_it(
    tmp_settings,
):
    """ "What must a plaintiff show to rely on res ipsa loquitur?" quoted defamation's elements
    too: their "must show" fits the question past ASKED_FIT.  A rule question that names an issue
    is answered on it and on issues named after it ("Hearsay definition" beside "Hearsay")."""
    res_ipsa = {"id": "ri", "title": "Res ipsa loquitur", "text": "Res ipsa loquitur. A plaintiff relying on res ipsa loquitur must show the accident ordinarily does not happen without negligence."}  # fmt: skip
    malice = {"id": "df", "title": "Defamation", "text": "Defamation. A public figure plaintiff must show actual malice to recover."}  # fmt: skip
    medical = {"id": "rm", "title": "Res ipsa loquitur in medical cases", "text": "Res ipsa loquitur in medical cases. An unconscious patient need not show which of the surgeons controlled the instrument."}  # fmt: skip
    question = "What must a plaintiff show to rely on res ipsa loquitur?"
    record = _rule_answer(tmp_settings, question, res_ipsa, malice, medical)
    status = {i.issue: i for i in record.issues}
    assert status["Defamation"].fit >= answer.ASKED_FIT
    assert status["Defamation"].status == "not_raised"
    assert status["Defamation"].why == "the question names other issues"
    assert status["Res ipsa loquitur"].status == "answered"
    assert status["Res ipsa loquitur in medical cases"].status == "answered"
    assert "Considered, but not what the question asks: Defamation." in record.text
    assert "df" not in [c.passage_id for c in record.citations]


def test_the_evidence_policy_verifies_the_rule_questions_lead_sentences(tmp_settings):
    """Under the evidence policy a rule question's candidates are the same lead sentences, each
    judged by the grounding gate; the ones it verifies are quoted, in the passage's order."""
    mailbox = {
        "id": "mailbox",
        "title": "Mailbox rule",
        "text": "The mailbox rule. An acceptance sent by reasonable means is effective when "
        "dispatched. Revocations and rejections are effective only on receipt. The rule does "
        "not apply to option contracts.",
    }
    verdicts = [{"n": 1, "verdict": "ok"}, {"n": 2, "verdict": "other_doctrine"}, {"n": 3, "verdict": "ok"}]  # fmt: skip
    client, script = scripted_client(tmp_settings, {"verify": [json.dumps({"verdicts": verdicts})]})
    research = [answer.IssueResearch("Mailbox rule", [mailbox])]
    record = answer.build_record(
        client, Question.read("What is the mailbox rule?"), research, EMBED, policy="evidence"
    )
    assert (
        '1. "An acceptance sent by reasonable means is effective when dispatched."'
        in (script.calls[0][1])
    )
    assert [s.text for s in record.issues[0].sentences] == [
        "An acceptance sent by reasonable means is effective when dispatched.",
        "The rule does not apply to option contracts.",
    ]


def test_a_record_with_nothing_to_stand_on_abstains_and_says_why(tmp_settings):
    client, script = scripted_client(tmp_settings, {})
    research = [answer.IssueResearch("Premises liability", [PRODUCTS])]
    record = answer.build_record(client, Question.read(FACTS), research, EMBED)
    assert record.abstained and record.citations == [] and script.calls == []
    assert "Premises liability (the passages found are about other doctrines)" in record.why
    assert record.guards["off_doctrine"] == 1
    declined = answer.build_record(
        client, Question.read(FACTS), research, EMBED, decline="off topic"
    )
    assert declined.abstained and declined.why == "off topic" and declined.issues == []


def test_requirements_no_stated_fact_bears_on_are_listed_once_not_each_as_an_application(
    tmp_settings,
):
    apply = json.dumps({"checks": [{"n": 1, "fact": 0, "met": "unclear"}, {"n": 2, "fact": "not stated", "met": "yes"}]})  # fmt: skip
    client, _ = scripted_client(tmp_settings, {"apply": [apply], "bottom_line": ["{}"]})
    research = [answer.IssueResearch("Search incident to arrest", [GANT])]
    record = answer.build_record(client, Question.read(FACTS), research, EMBED)
    applications = [s.text for s in record.sentences if s.role == "application"]
    assert applications == [
        'No stated fact decides: "After a lawful custodial arrest, police may search the '
        'arrestee\'s…"; "For vehicles, police may search the passenger compartment incident to…".'
    ]
    assert "not stated" not in record.text
    assert "Search incident to arrest: not settled by this research; it turns on " in record.text
    school = "A school's authority over off-campus student speech is reduced"
    said = answer._application_sentences(
        [Check(requirement=school, fact="not stated", met="unclear")], [f"{school}."], [1]
    )
    assert said[0].text == f'No stated fact decides: "{school}".'


def test_an_application_cites_the_rule_sentence_its_requirement_comes_from():
    """A reader who checks an application's citation finds the requirement it applies, not a
    sentence of the issue's other passage ("jurisdictions split" beside the malice rule)."""
    rule = [
        "Common law murder is the unlawful killing of a human being with malice aforethought.",
        "If the fatal shot is fired by a victim, police officer, or other non-felon, "
        "jurisdictions split.",
    ]
    checks = [
        Check(requirement=rule[0].rstrip("."), fact="Vic was killed", met="yes"),
        Check(requirement=rule[1].rstrip("."), fact="not stated", met="unclear"),
        Check(requirement="a clause of an older answer", fact="He fired", met="yes"),
    ]
    said = answer._application_sentences(checks, rule, [4, 7])
    assert [s.cites for s in said] == [[4], [4, 7], [7]]  # no source found: every rule sentence


def test_cut_off_application_reply_is_used_and_cached(tmp_settings):
    """A reply cut off at its budget keeps its complete checks, and is cached like a good one:
    each rerun of a fact pattern had asked the model again (4 such calls a fact-pattern eval)."""
    settings = tmp_settings.replace(llm_cache=True)
    cut = CutOff('{"checks": [{"n": 1, "fact": "handcuffed", "met": "no"}, {"req')  # fmt: skip
    for replies in ([cut], []):  # then from the cache: no reply is scripted
        client, _ = scripted_client(settings, {"apply": replies})
        got = answer.apply_rule(
            client, "Search incident to arrest", ["within reaching distance"], ["f"]
        )
        assert [(c.requirement, c.met) for c in got] == [("within reaching distance", "no")]
    assert client.summary()["cached_calls"] == 1


def test_a_check_names_its_fact_by_number_and_a_check_without_one_is_not_met(tmp_settings):
    reply = json.dumps({"checks": [{"n": 1, "fact": 2, "met": "no"}, {"n": 2, "fact": 0, "met": "yes"}, {"n": 3, "fact": "F9", "met": "yes"}]})  # fmt: skip
    client, script = scripted_client(tmp_settings, {"apply": [reply]})
    long = " after a long chase through three counties that ended when his car ran out of gas"
    facts = ["Police arrested Dan.", "They locked him in the patrol car" + long * 2 + "."]
    got = answer.apply_rule(
        client, "Search incident to arrest", ["reach", "arrest", "search"], facts
    )
    assert [(c.fact, c.met) for c in got] == [
        (facts[1], "no"), ("not stated", "unclear"), ("not stated", "unclear"),
    ]  # fmt: skip
    assert "F1. Police arrested Dan.\nF2. They locked him" in script.prompts("apply")[0]


def test_a_requirement_the_model_did_not_answer_is_not_met(tmp_settings):
    """A rule sentence the apply reply leaves out is not decided by the facts, so the issue is
    not read as met on every requirement."""
    reqs = answer.requirements(
        ["Negligence: A plaintiff must prove a duty of care and its breach.",
         "The breach must cause actual damages."]
    )  # fmt: skip
    assert reqs == [
        "Negligence: A plaintiff must prove a duty of care and its breach",
        "The breach must cause actual damages",
    ]  # each sentence whole, as quoted
    skipped = [{"n": 1, "fact": 1, "met": "yes"}]  # the reply leaves out the second one
    client, _ = scripted_client(tmp_settings, {"apply": [json.dumps({"checks": skipped})]})
    got = answer.apply_rule(client, "Negligence", reqs, ["The store left the spill."])
    assert [(c.requirement, c.met) for c in got] == [(reqs[0], "yes"), (reqs[1], "unclear")]
    assert answer._outcome(got) == "unclear"


RILEY = {
    "id": "riley",
    "title": "Search incident to arrest: cell phones",
    "text": "Cell phones seized incident to arrest. Police generally need a warrant before "
    "they search the digital contents of a cell phone seized from an arrestee.",
}
UNRELATED = json.dumps({"checks": [{"n": 1, "fact": "not stated", "met": "unclear"}]})
RELATED = json.dumps({"checks": [{"n": 1, "fact": "handcuffed in the patrol car", "met": "no"}]})


def test_an_issue_no_stated_fact_bears_on_is_named_not_answered(tmp_settings):
    """The application finds no stated fact for any requirement: the issue is not one of these
    facts, so its rule is not given as part of the answer (guard ``not_raised``)."""
    bottom = json.dumps({"answer": "yes", "conclusion": 1})
    replies = {"apply": [UNRELATED, RELATED], "bottom_line": [bottom]}
    client, _ = scripted_client(tmp_settings, replies)
    research = [
        answer.IssueResearch("Search incident to arrest: cell phones", [RILEY]),
        answer.IssueResearch("Search incident to arrest", [GANT]),
    ]
    record = answer.build_record(client, Question.read(FACTS), research, EMBED)
    assert record.guards["not_raised"] == 1
    assert [i.status for i in record.issues][:2] == ["not_raised", "answered"]
    assert (
        "Considered, but no stated fact raises it: Search incident to arrest: cell phones."
        in record.text
    )
    assert record.text.startswith("1. Search incident to arrest")


def test_an_issue_the_question_names_is_applied_even_when_no_fact_decides_it(tmp_settings):
    """A user's "Has she committed larceny or embezzlement?" got "Considered, but no stated fact
    raises it: Embezzlement, ...": the question asked about it, so it is answered (the facts
    stated do not settle it), not set aside as not raised."""
    bottom = json.dumps({"answer": "no", "conclusion": 1})
    client, _ = scripted_client(
        tmp_settings, {"apply": [RELATED, UNRELATED], "bottom_line": [bottom]}
    )
    research = [
        answer.IssueResearch("Search incident to arrest", [GANT]),
        answer.IssueResearch("Cell phones", [RILEY]),
    ]
    asked = FACTS.replace("Can he get the cocaine suppressed?", "Do the cell phones rules apply?")
    record = answer.build_record(client, Question.read(asked), research, EMBED)
    assert [i.status for i in record.issues][:2] == ["answered", "answered"]
    assert record.guards["not_raised"] == 0 and "Considered, but" not in record.text
    assert record.guards["named_issue"] == 1  # counted where it changed the answer
    assert "Cell phones: not settled by this research; it turns on" in record.text
    # a word of a longer name is not that name: "What rights does she have?"
    assert not answer.named_in("Rights and duties of cotenants", "What rights does she have?")
    assert answer.named_in(
        "Embezzlement, false pretenses, and larceny by trick", "Larceny or embezzlement?"
    )


def test_an_issue_whose_research_found_an_earlier_issues_rule_is_not_answered_twice(tmp_settings):
    """An issue whose passages say nothing beyond the rule quoted for an earlier issue is not
    answered again, and says whose rule it is (guard ``same_rule``).  The cement plant's
    "Commerce power" repeated the Dormant Commerce Clause's rule and its "met" requirements."""
    short = {**GANT, "text": GANT["text"].rsplit(" Police may", 1)[0]}
    checks = json.dumps({"checks": [{"n": 1, "fact": 2, "met": "no"}]})
    bottom = json.dumps({"answer": "yes", "conclusion": 1})
    client, script = scripted_client(tmp_settings, {"apply": [checks], "bottom_line": [bottom]})
    research = [
        answer.IssueResearch("Search incident to arrest", [short]),
        answer.IssueResearch("Search incident to arrest of a vehicle", [short]),
    ]
    record = answer.build_record(client, Question.read(FACTS), research, EMBED)
    assert [i.status for i in record.issues][:2] == ["answered", "no_evidence"]
    assert record.guards["same_rule"] == 1
    assert "the one already quoted for Search incident to arrest" in record.issues[1].why
    assert script.roles().count("apply") == 1


def test_a_later_issue_quotes_what_its_passages_say_beyond_an_earlier_issues_rule(
    tmp_settings, monkeypatch
):
    """A user trial: "Defamation: constitutional limits" was set aside as "its rule is the one
    already quoted for Defamation", though its passages held the negligence rule for a private
    plaintiff.  A later issue whose closest sentences an earlier issue quotes quotes the closest
    ones no earlier issue quotes."""
    monkeypatch.setattr(answer, "FACT_FIT", 0.2)  # the new sentence fits the facts at 0.21
    short = {**GANT, "text": GANT["text"].rsplit(" Police may", 1)[0]}
    more = "Evidence found in an unlawful search of a car is suppressed."
    passage = {**short, "text": f"{short['text']} {more}"}
    checks = json.dumps({"checks": [{"n": 1, "fact": 2, "met": "no"}]})
    bottom = json.dumps({"answer": "no", "conclusion": 1})
    client, _ = scripted_client(tmp_settings, {"apply": [checks, checks], "bottom_line": [bottom]})
    research = [
        answer.IssueResearch("Search incident to arrest", [short]),
        answer.IssueResearch("Search incident to arrest of a vehicle", [passage]),
    ]
    record = answer.build_record(client, Question.read(FACTS), research, EMBED)
    first, second = ([s.text for s in i.sentences if s.role == "rule"] for i in record.issues[:2])
    assert len(first) == 2 and more in second and not set(first) & set(second)
    assert record.guards["same_rule"] == 0


def test_a_fact_pattern_is_not_declined_because_no_stated_fact_seemed_to_bear_on_its_rule(
    tmp_settings,
):
    """The merchant's signed plywood offer was declined ("no issue's research found a rule on its
    doctrine") after the model tied no fact to the firm-offer rule its research had found.  The
    only issue with a rule is answered after all: its rule, and facts that do not settle it."""
    unrelated = json.dumps({"checks": [{"n": 1, "fact": 0, "met": "unclear"}]})
    client, script = scripted_client(tmp_settings, {"apply": [unrelated]})
    research = [answer.IssueResearch("Search incident to arrest", [GANT])]
    record = answer.build_record(client, Question.read(FACTS), research, EMBED)
    assert not record.abstained and record.guards["not_raised"] == 0
    assert record.text.startswith("1. Search incident to arrest")
    assert "Search incident to arrest: not settled by this research; it turns on" in record.text
    assert (
        "Bottom line: Can he get the cocaine suppressed? Not settled by this research: the stated "
        "facts decide none of the issues above; it turns on" in record.text
    )
    assert script.roles() == ["apply"]


def test_a_fact_unrelated_to_a_requirement_does_not_decide_it(tmp_settings):
    """The model marked "proximate cause ... — not met: The hotel objects." and "Nominal damages
    are not available — met: Maria went to Greenway Market": a check whose fact says nothing about
    its requirement is undecided (guard ``unrelated_fact``), and the conclusion follows from the
    checks that stand."""
    facts = "It was a rainy Tuesday in May. " + FACTS
    checks = json.dumps(
        {"checks": [{"n": 1, "fact": 3, "met": "yes"}, {"n": 2, "fact": 1, "met": "no"}]}
    )
    client, script = scripted_client(tmp_settings, {"apply": [checks]})
    research = [answer.IssueResearch("Search incident to arrest", [GANT])]
    record = answer.build_record(client, Question.read(facts), research, EMBED)
    assert record.guards["unrelated_fact"] == 1
    application = " ".join(s.text for s in record.sentences if s.role == "application")
    assert "— met: They handcuffed him and locked him in the patrol car" in application
    assert "— not met: It was a rainy Tuesday" not in application
    assert "Search incident to arrest: not settled by this research; it turns on" in record.text
    assert script.roles() == ["apply"]  # no conclusion decided: "not settled" without a call


def test_an_issue_the_question_names_keeps_the_facts_the_model_ties_to_it(tmp_settings):
    """ "Is Dana guilty of larceny?": the embedder put "Dana took her coworker's laptop ...,
    intending to return it Monday" at 0.06 to "intent to permanently deprive", and the answer said
    no stated fact decides larceny.  An issue the question names keeps the fact the model ties to
    it (counted as ``named_issue``, not ``unrelated_fact``)."""
    facts = "It was a rainy Tuesday in May. " + FACTS.replace(
        "Can he get the cocaine suppressed?", "Was it a lawful search incident to arrest?"
    )
    checks = json.dumps(
        {"checks": [{"n": 1, "fact": 3, "met": "yes"}, {"n": 2, "fact": 1, "met": "no"}]}
    )
    bottom = json.dumps({"answer": "no", "conclusion": 1})
    client, _ = scripted_client(tmp_settings, {"apply": [checks], "bottom_line": [bottom]})
    research = [answer.IssueResearch("Search incident to arrest", [GANT])]
    record = answer.build_record(client, Question.read(facts), research, EMBED)
    assert record.guards["unrelated_fact"] == 0 and record.guards["named_issue"] == 1
    application = " ".join(s.text for s in record.sentences if s.role == "application")
    assert "— not met: It was a rainy Tuesday in May." in application


def test_an_issue_whose_rule_does_not_fit_the_facts_is_named_not_applied(tmp_settings):
    """Of two researched issues, the one whose quoted rule shares nothing with the facts (a design
    defect, for a vehicle search) gets no application call and no rule in the answer (guard
    ``off_facts``); the issue that fits them is answered.  The planner's first issue is always
    applied."""
    apply = json.dumps({"checks": [{"n": 2, "fact": 2, "met": "no"}]})
    bottom = json.dumps({"answer": "yes", "conclusion": 1})
    client, script = scripted_client(tmp_settings, {"apply": [apply], "bottom_line": [bottom]})
    research = [
        answer.IssueResearch("Search incident to arrest", [GANT]),
        answer.IssueResearch("Products liability: design defects", [PRODUCTS]),
    ]
    record = answer.build_record(client, Question.read(FACTS), research, EMBED)
    assert record.guards["off_facts"] == 1 and script.roles().count("apply") == 1
    assert [i.status for i in record.issues][:2] == ["answered", "not_raised"]
    assert "reasonable alternative design" not in record.text
    assert "Considered, but no stated fact raises it: Products liability" in record.text
    client, _ = scripted_client(tmp_settings, {"apply": [apply, apply], "bottom_line": [bottom]})
    first = answer.build_record(client, Question.read(FACTS), research[::-1], EMBED)
    assert first.guards["off_facts"] == 0  # the planner's first issue is always applied


def test_an_answer_whose_rules_are_about_other_matters_is_declined(tmp_settings):
    """A tenant's song video got the rule on commercial speech, a parent's move with her child
    an offer: when no rule the answer would rest on is near the question (cosine below
    ``QUESTION_FIT``), it says "No answer", names what the research found, and asks for no bottom
    line (guard ``off_question``).  A multiple-choice question still gets its letter."""
    song = (
        "Tess filmed her cat dancing to a pop song and posted the clip online. The record label "
        "sent her a takedown letter. Does she have to remove it?"
    )
    apply = json.dumps({"checks": [{"n": 1, "fact": 1, "met": "yes"}]})
    client, script = scripted_client(tmp_settings, {"apply": [apply]})
    research = [answer.IssueResearch("Products liability: design defects", [PRODUCTS])]
    record = answer.build_record(client, Question.read(song), research, EMBED)
    assert record.abstained and record.guards["off_question"] == 1
    assert record.text.startswith("No answer")
    assert (
        "about other matters: Products liability: design defects (for Products liability"
        in record.why
    )
    assert not record.sentences and not record.citations
    assert script.roles() == ["apply"]
    client, _ = scripted_client(tmp_settings, {"apply": [apply]})
    record = answer.build_record(
        client, Question.read(song, {"A": "Yes.", "B": "No."}), research, EMBED
    )
    assert not record.abstained and record.guards["off_question"] == 0


@pytest.mark.parametrize(
    "asked, yes_no",
    [
        ("Can Dan get the cocaine suppressed?", True),
        ("Is the statement admissible?", True),
        (
            "Which constitutional rights were violated, and what must she show for each claim?",
            False,
        ),
        ("What must she show?", False),
        ("Is Dan guilty of embezzlement or larceny by trick?", False),  # one of two, not yes
        ("Is the statement admissible or not?", True),
        ("At the trial against the driver, can an officer who heard the scream repeat it?", True),
        ("Hank claims Eli's share under the will. Does Fay now hold Eli's share?", True),
        ("Is Mr. Jones liable to Dr. Smith?", True),  # "Mr." ends no question
        ("Which rights did Dr. Smith violate?", False),
        ("Which rights, if any, were violated?", False),
        ("If the court finds a duty, what damages may she recover?", False),
    ],
)
def test_only_a_yes_or_no_question_gets_a_yes_or_no_bottom_line(asked, yes_no):
    assert question_mod.asks_yes_or_no(asked) is yes_no


def test_an_issue_set_aside_is_not_listed_when_a_quoted_source_is_on_its_doctrine():
    """An impeachment answer applied FRE 609's rule to a perjury conviction under another issue,
    then ended "Considered, but no stated fact raises it: Impeachment by criminal conviction: FRE
    609"."""
    rule = "Any witness may be impeached with a conviction for any crime of dishonesty."
    fre609 = answer.Citation(1, "evidence_011", "Impeachment by criminal conviction: FRE 609", rule)
    first = answer.IssueAnswer("Impeachment: prior inconsistent statements", "answered")
    first.sentences = [answer.Sentence(rule, "rule", [1])]
    why = "no stated fact bears on it"
    issues = [
        first,
        answer.IssueAnswer("Impeachment by criminal conviction: FRE 609", "not_raised", why=why),
        answer.IssueAnswer("Hearsay", "not_raised", why=why),
    ]
    record = answer.AnswerRecord("fact_pattern", "", issues, [fre609], False)
    assert answer.render(record).endswith("\nConsidered, but no stated fact raises it: Hearsay.")


def test_a_requirement_two_issues_quote_is_named_once_in_an_unsettled_bottom_line():
    """A user's offer question: the bottom line said it turns on the offer rule with "no stated
    fact", then on the same rule with the fact the second issue tied to it."""
    offer = "An offer is a manifestation of willingness to enter a…"
    fact = "…promised to keep the offer open until Friday"
    first = answer.IssueAnswer("Offer", "answered")
    first.turns_on = [
        {"requirement": "The offeror controls the manner…", "fact": "Ben accepted"},
        {"requirement": offer, "fact": None},
    ]
    second = answer.IssueAnswer("Firm offers", "answered")
    second.turns_on = [
        {"requirement": offer, "fact": fact},
        {"requirement": "Preliminary negotiations are not offers", "fact": None},
    ]
    line = answer._unsettled_line("Is there a contract?", [first, second]).text
    assert line.count(offer) == 1 and f'"{offer}" (stated: "{fact}")' in line
    assert line.index("The offeror controls") < line.index(offer)  # the order of the issues


def test_an_unsettled_bottom_line_names_an_issue_the_model_left_undecided():
    """A user's milk-container law: the bottom line of "Is the law constitutional?" named only
    what the Erie doctrine turns on (the one issue the model read as decided), never the dormant
    Commerce Clause the research quoted; "Is Carl guilty of the robbery, and of conspiracy?"
    named robbery alone.  It names the decided issues' requirements first, then the others', the
    issue nearest the facts first, and cites only the issues it names."""

    def issue(name: str, reading: str, fit: float, cite: int) -> answer.IssueAnswer:
        out = answer.IssueAnswer(name, "answered", reading=reading, fit=fit)
        out.turns_on = [{"requirement": f"{name} requirement", "fact": "the law"}]
        out.sentences = [answer.Sentence(f"{name} rule.", "rule", [cite])]
        return out

    erie = issue("Erie", "yes", 0.35, 1)
    commerce = issue("Dormant Commerce Clause", "unclear", 0.50, 2)
    other = issue("Privileges and immunities", "unclear", 0.40, 3)
    fourth = issue("Spending power", "unclear", 0.30, 4)
    shown = answer.bottom_line(None, "Is it valid?", [erie, other, commerce, fourth], print, 2.0)
    line = shown[-1]
    assert shown[0] is None and line.text.index("Erie") < line.text.index("Dormant") < (
        line.text.index("Privileges")
    )
    assert "Spending" not in line.text and line.cites == [1, 2, 3]


def test_a_which_question_with_no_conclusion_shown_says_what_is_not_settled():
    """A user's "Who owns the strip?" (12 years of open possession, a 10-year statute) ended
    "Bottom line: Not settled: Adverse possession; Removal.": a reader had to work out what was
    not settled.  The line now starts with the question, as a yes-or-no question's does."""
    possession = answer.IssueAnswer("Adverse possession", "answered", outcome="unclear")
    possession.sentences = [answer.Sentence("Adverse possession rule.", "rule", [1])]
    line = answer.in_short("Who owns the strip?", [possession])
    assert line.text == "Who owns the strip? Not settled: Adverse possession." and line.cites == [1]


def test_a_which_question_gets_its_issues_by_conclusion_as_the_bottom_line(tmp_settings):
    """ "Which rights were violated?" takes no yes or no: the bottom line names the issues by
    their conclusions, cited, and no model call restates them."""
    apply = json.dumps({"checks": [{"n": 1, "fact": 2, "met": "no"}]})
    client, script = scripted_client(tmp_settings, {"apply": [apply]})
    question = FACTS.replace(
        "Can he get the cocaine suppressed?", "Which of his rights did the search violate?"
    )
    record = answer.build_record(
        client,
        Question.read(question),
        [answer.IssueResearch("Search incident to arrest", [GANT])],
        EMBED,
    )
    assert script.roles() == ["apply"] and record.verdict is None
    assert "Conclusion: Search incident to arrest" in record.text
    assert (
        "Bottom line: Which of his rights did the search violate? Does not apply: Search incident"
        " to arrest. [1]" in record.text
    )


@pytest.mark.parametrize(
    ("title", "meta", "expected"),
    [
        (
            "Terry v. Ohio",
            {"citation": "392 U.S. 1", "pin": "*27", "date": "1968-06-10"},
            "Terry v. Ohio, 392 U.S. 1, 27 (1968)",
        ),
        (
            "28 U.S.C. § 1441",
            {"citation": "28 U.S.C. § 1441", "pin": "§ 1441(b)(2)"},
            "28 U.S.C. § 1441(b)(2)",
        ),  # fmt: skip
        ("Brief for Appellant", {"pin": "p. 3"}, "Brief for Appellant, p. 3"),
        ("Negligence", {}, ""),  # a passage-table row has no pin
    ],
)
def test_a_citation_of_the_users_documents_carries_a_pin_cite(title, meta, expected):
    doc = {"id": "d#1", "title": title, "text": "x", "metadata": meta}
    assert answer.pin_cite(doc) == expected
    line = answer.render_sources([{"n": 1, "passage_id": "d#1", "title": title, "support": "s", "pin": expected}])  # fmt: skip
    assert line == [f'[1] {expected or title} (d#1): "s"']


def test_an_application_quotes_the_part_of_a_long_fact_that_bears_on_the_requirement():
    """The multi_hop demo states all its facts in one sentence, and each application sentence
    quoted all of it: which fact met which element went unsaid."""
    fact = (
        "A public university suspended a student for a speech at a campus rally in which she "
        "criticized the government, without giving her notice or a hearing."
    )
    notice = "the school must give notice of the charges and a hearing"
    part = answer.fact_part(fact, EMBED([notice])[0], EMBED)
    assert part == "…without giving her notice or a hearing"
    short = "Tom slipped on the wet floor."
    assert answer.fact_part(short, EMBED([notice])[0], EMBED) == short


def test_the_quoted_part_of_a_fact_is_the_one_that_sets_its_requirement_apart():
    """In the multi_hop demo the clause naming the university and the suspension is closest to
    every requirement, the notice requirement included, so its application quoted that clause
    instead of "without giving her notice or a hearing"."""
    fact = (
        "A public university suspended a student for a speech at a campus rally in which she "
        "spoke, without giving her notice or a hearing."
    )
    notice, speech = EMBED(
        [
            "a public university that suspended a student must give notice and a hearing",
            "a public university student keeps free speech rights at a campus rally",
        ]
    )
    assert answer.fact_part(fact, notice, EMBED).startswith("A public university suspended")
    others = np.stack([speech])
    assert (
        answer.fact_part(fact, notice, EMBED, others) == "…without giving her notice or a hearing"
    )


def test_a_short_clause_is_joined_back_to_its_neighbour_with_its_own_punctuation():
    """A user's trial quoted "…Lena a trespasser…" for "Lena, a trespasser, climbed a locked
    fence at night into a construction site": the comma was lost when the pieces were joined."""
    fact = "Lena, a trespasser, climbed a locked fence at night into a construction site to take photos."  # fmt: skip
    part = answer.fact_part(fact, EMBED(["Lena is a trespasser"])[0], EMBED)
    assert part == "Lena, a trespasser…"


AUTOMOBILE = {
    "id": "auto",
    "title": "Automobile exception",
    "text": "Automobile exception. Police may search a car without a warrant when they have "
    "probable cause to believe the car holds evidence of a crime.",
}


@pytest.mark.parametrize(("provider", "at_once"), [("ollama", 2), ("local", 1)])
def test_an_api_model_applies_the_issues_at_once_and_each_reply_stays_with_its_issue(
    tmp_settings, provider, at_once
):
    """With a model that answers calls in parallel, each issue's application is asked at once
    (a 3-issue answer waits for one call, not three); the embedded model takes them in turn."""
    barrier = threading.Barrier(at_once, timeout=10)  # sequential calls would wait here in vain

    def apply(prompt: str) -> str:
        barrier.wait()
        if "probable cause" in prompt:
            return json.dumps({"checks": [{"n": 1, "fact": "it holds evidence", "met": "yes"}]})
        handcuffed = {"n": 2, "fact": "he was handcuffed in the patrol car", "met": "no"}
        return json.dumps({"checks": [handcuffed]})

    settings = tmp_settings.replace(llm_provider=provider)
    client, script = scripted_client(settings, {"apply": [apply, apply], "bottom_line": ["{}"]})
    research = [
        answer.IssueResearch("Search incident to arrest", [GANT]),
        answer.IssueResearch("Automobile exception", [AUTOMOBILE]),
    ]
    record = answer.build_record(client, Question.read(FACTS), research, EMBED)
    facts = {i.issue: {c["fact"] for c in i.checks} for i in record.issues if i.checks}
    assert facts["Automobile exception"] == {"it holds evidence"}
    assert "he was handcuffed in the patrol car" in facts["Search incident to arrest"]
    assert len(script.prompts("apply")) == 2


def test_every_guard_is_a_row_of_the_measurements_table():
    """A reader of docs/MEASUREMENTS.md finds each guard an answer counts, with its threshold."""
    from pathlib import Path

    text = (Path(answer.__file__).parent / "docs" / "MEASUREMENTS.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in text.splitlines() if line[:3] == "| `"}
    for name, guard in answer.GUARDS.items():
        assert name in rows, name
        if guard.threshold:
            constant, value = guard.threshold.split()
            assert f"`{constant}` {value}" in rows[name], name


def test_a_quoted_requirement_or_fact_holding_quotation_marks_reads_as_one_quotation():
    """A user's contract defines "Cause": the application read '""Cause" means fraud…" — not
    settled' (an empty quotation, then a stray word), and a fact quoting a threat did the same in
    "it turns on"."""
    cause = '"Cause" means fraud, theft, or a material breach of this Agreement'
    threat = 'He told her, "I will sue you tomorrow"'
    checks = [
        Check(requirement=cause, fact=threat, met="yes", support=0.5),
        Check(requirement="The notice is in writing", fact="not stated", met="unclear"),
    ]
    said = [s.text for s in answer._application_sentences(checks, [cause], [1])]
    assert said[0].startswith("\"'Cause' means fraud, theft, or a material breach of this…\" — ")
    assert said[1] == 'No stated fact decides: "The notice is in writing".'
    ends = answer._turns_on_text(answer.turns_on(checks, "unclear"))
    assert "(stated: \"He told her, 'I will sue you tomorrow'\")" in ends
    assert ends.count('"') == 6


def test_a_rule_from_the_users_document_quotes_the_definition_of_a_term_it_uses(tmp_settings):
    """A user's contract: "3.3 If the Company terminates the Employee without Cause ... severance"
    was quoted and applied without what "Cause" means (its section 5.1, in another chunk), so the
    answer could not say whether losing a client is Cause.  The definition follows the sentence
    that uses the term, cited to its own line."""
    cause = (
        '5.1 "Cause" means the Employee\'s fraud, theft, or embezzlement against the Company, or '
        "an uncured material breach of this Agreement."
    )
    termination = {
        "id": "contract#3",
        "title": "Employment Agreement",
        "doc_id": "contract",
        "text": "3.3 Fired without Cause, the Employee gets severance of three months' pay.",
        "definitions": [
            {"term": "Cause", "text": cause, "id": "contract#5", "pin": "Employment Agreement, 5.1"},
            {"term": "Premises", "text": '"Premises" means the office.', "id": "contract#5",
             "pin": "Employment Agreement, 5.2"},
        ],
    }  # fmt: skip
    apply = json.dumps({"checks": [{"n": 1, "fact": 1, "met": "yes"}, {"n": 2, "fact": 1, "met": "no"}]})  # fmt: skip
    client, _ = scripted_client(tmp_settings, {"apply": [apply], "bottom_line": ["{}"]})
    asked = Question.read(
        "The company fired Priya because it lost its largest client. Is she owed severance?"
    )
    research = [answer.IssueResearch("Employment Agreement", [termination])]
    record = answer.build_record(client, asked, research, EMBED)
    rules = [s.text for s in record.sentences if s.role == "rule"]
    assert rules == [termination["text"], cause]
    cited = record.citations[-1]
    assert (cited.passage_id, cited.pin, cited.support) == (
        "contract#5",
        "Employment Agreement, 5.1",
        cause,
    )
    assert record.guards["defined_term"] == 1  # "Premises" is not used: not quoted
    assert "Cause' means the Employee's fraud" in record.text  # applied as a requirement


def test_a_set_aside_issue_whose_name_ends_in_a_period_ends_its_line_once():
    """A user's license titled "... for Beacon Corp." was listed as "Considered, but no stated
    fact raises it: Software License Agreement for Beacon Corp.."."""
    issue = answer.IssueAnswer("Software License Agreement for Beacon Corp.", "not_raised")
    record = answer.AnswerRecord("fact_pattern", "", [issue], [], False)
    said = answer.render(record)
    assert said.endswith("raises it: Software License Agreement for Beacon Corp.")
    record.others = ["Agreement for Beacon Corp."]
    assert answer.AnswerRecord.shown(record.to_dict()).endswith(
        "not researched: Agreement for Beacon Corp."
    )


def test_an_opinions_story_of_its_own_case_is_never_a_candidate_rule():
    """A user's opinion, "HOLLIS v. GRANGE HARDWARE CO.": "The store manager testified that it had
    been raining for two hours ..." was quoted as the rule of a slip on tracked-in snow.  The
    sentences that name a party of the caption or tell the case's procedure are not rules; the
    same sentences in a statute or a study passage are left alone."""
    text = (
        "Hollis slipped on the wet tile near the entrance and fractured her hip.\n"
        "The store manager testified that it had been raining for two hours.\n"
        "Here, the manager knew the floor had been wet for a long time.\n"
        "A store that knows of water tracked onto its floor must take reasonable steps to "
        "protect its customers.\n"
        "The judgment of the court of appeals is reversed, and the case is remanded."
    )
    opinion = {"title": "HOLLIS v. GRANGE HARDWARE CO.", "text": text, "kind": "opinion"}
    assert answer.candidate_sentences(opinion) == [text.split("\n")[3]]
    assert len(answer.candidate_sentences({**opinion, "kind": "statute"})) == 5
    people = {"title": "PEOPLE v. ALVAREZ", "text": "The People must prove every element of the "
              "offense beyond a reasonable doubt.", "kind": "opinion"}  # fmt: skip
    assert answer.candidate_sentences(people) == [people["text"]]  # "People" is no party name
