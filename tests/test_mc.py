"""Multiple-choice letter extraction and the one-call / strict-retry selection."""

from __future__ import annotations

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

import mc
from llm_config import LLMClient

CHOICES = {
    "A": "Yes, because the contract was oral.",
    "B": "No, because of the statute of frauds.",
    "C": "Yes, because of part performance.",
    "D": "No, because there was no consideration.",
}


def test_format_choices_orders_letters_and_flattens_whitespace():
    assert mc.format_choices({"B": "two\n words", "A": "one"}) == "(A) one\n(B) two words"


@pytest.mark.parametrize(
    ("reply", "letter", "strategy"),
    [
        ("**Answer: (B)**", "B", "answer_format"),
        ("The correct answer is D because consideration is missing.", "D", "answer_format"),
        ("Answer: B", "B", "answer_format"),
        ("(c)", "C", "answer_format"),
        ("B.", "B", "answer_format"),
        ("I would say: No, because of the statute of frauds.", "B", "choice_text"),
        ("The oral promise fails since the statute of frauds bars it", "B", "word_overlap"),
        ("The answer is a battery claim.", None, "none"),  # 'a' is an article, not a letter
        ("Answer choices (A) to (D) all discuss contracts.", None, "none"),
        ("", None, "none"),
        ("I cannot decide.", None, "none"),
    ],
)
def test_parse_mc_answer(reply, letter, strategy):
    assert mc.parse_mc_answer(reply, CHOICES) == (letter, strategy)


@pytest.mark.parametrize(
    ("reply", "first"),
    [
        # the 1.5B model labels its per-choice lines with the marker: the last is the last choice
        ("**Answer: (B)** B meets the rule. **Answer: (C)** C fails. **Answer: (D)** D too.", "B"),
        ("**Answer: (A)**\nRule: x\n(B) fails duty\n(C) meets all\n**Answer: (C)**", "A"),
    ],
)
def test_of_several_answer_markers_the_first_is_the_letter(reply, first):
    assert mc.parse_mc_answer(reply, CHOICES) == (first, "answer_format")


def test_letters_outside_the_choices_are_ignored():
    assert mc.parse_mc_answer("**Answer: (D)**", {"A": "x", "B": "y"}) == (None, "none")


def _client(tmp_settings, replies):
    settings = tmp_settings.replace(llm_max_retries=0)
    seen = []

    def factory(role):
        seen.append(role)
        return GenericFakeChatModel(messages=iter([AIMessage(content=replies.pop(0))]))

    return LLMClient(settings, llm_factory=factory), seen


def test_select_answer_one_call_with_evidence_quoted(tmp_settings):
    client, roles = _client(
        tmp_settings, ["**Answer: (C)**\nRule: part performance.\n**Answer: (C)**"]
    )
    result = mc.select_answer(
        client, "Is the promise enforceable?", CHOICES, "[1] Statute of frauds\nText"
    )
    assert (result.letter, result.strategy, result.retried, result.parse_failed) == (
        "C",
        "answer_format",
        False,
        False,
    )
    assert roles == ["mc_select"]
    assert client.summary()["llm_calls"] == 1


def test_select_answer_strict_retry_then_failure(tmp_settings):
    client, _ = _client(tmp_settings, ["Let me think about it.", "I am not sure."])
    result = mc.select_answer(client, "Is the promise enforceable?", CHOICES, None)
    assert result.letter is None and result.retried and result.parse_failed
    assert client.summary()["llm_calls"] == 2


def test_select_answer_strict_retry_recovers(tmp_settings):
    client, _ = _client(tmp_settings, ["Thinking about the elements...", "**Answer: (A)**"])
    result = mc.select_answer(client, "Q?", CHOICES, None)
    assert result.letter == "A" and result.retried and not result.parse_failed
    assert result.to_dict()["letter"] == "A"


def test_a_reply_that_only_names_the_letter_has_no_reasoning_to_show():
    """A closed-book painter question printed "The model's reasoning, in its own words:" over a
    reply that was only "**Answer: (A)**", the letter the answer line states again below it."""
    assert mc.reasoning("**Answer: (A)**\n\n") == ""
    reply = "**Answer: (C)** Rule: a promise needs new consideration.\nWhy: nothing changed.\n**Answer: (C)**"  # fmt: skip
    assert mc.reasoning(reply) == (
        "**Answer: (C)** Rule: a promise needs new consideration.\nWhy: nothing changed."
    )


def test_reasoning_cut_off_at_the_token_limit_ends_at_its_last_full_sentence():
    """The lean answer printed "... to mitigate damages when a tenant" and stopped."""
    reply = "Why: The landlord must try to re-let. The majority rule requires that when a tenant"
    assert mc.reasoning(reply) == "Why: The landlord must try to re-let. …"
