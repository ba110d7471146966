"""Prompt-injection screening: of the user's input (before any research) and of corpus passages
(at load time and at retrieval), plus the policy that combines the deterministic screen with the
model's verdict.

Policy (:func:`detect`): a deterministic pattern hit rejects at once, without an LLM call (the
patterns are specific to attacks on the assistant, never to legal subject matter).  Otherwise the
model judges (``skills/detect_prompt_injection.md``).  When its verdict is unavailable (skipped,
the call failed, the reply could not be parsed) the result says so (``injection_check:
"prescreen_only"``) instead of silently passing.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Literal, TypedDict

import prompts
from llm_config import LLMCallError

logger = logging.getLogger(__name__)


class InjectionCheck(TypedDict):
    is_safe: bool
    verdict: Literal["safe", "injection"]
    prescreen: list[str]
    """Names of the deterministic patterns the text matched."""
    llm_verdict: str | None
    """safe | injection | skipped | error | unparsed."""
    reason: str
    injection_check: Literal["full", "prescreen_only"]


_INJECTION_PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(p, re.IGNORECASE)
    for name, p in {
        "override_instructions": r"\b(ignore|disregard|forget|override|bypass)\b[^.\n]{0,40}\b"
        r"(previous|prior|above|earlier|all|your|the|system|safety)\b[^.\n]{0,30}\b"
        r"(instructions?|prompts?|rules|directives|guidelines|restrictions|filters?)\b",
        "reveal_prompt": r"\b(reveal|print|show|repeat|output|display|leak|tell me)\b[^.\n]{0,40}\b"
        r"(system\s+prompt|your\s+(initial\s+|hidden\s+|original\s+)?(prompt|instructions)|"
        r"hidden\s+instructions|developer\s+message)",
        "jailbreak_persona": r"\b(DAN|do anything now|developer mode|jailbreak|jailbroken|god mode|"
        r"unfiltered mode|no longer bound)\b",
        "unrestricted_roleplay": r"\b(pretend|act|behave|role-?play)\b[^.\n]{0,40}\b"
        r"(no|without|free of)\s+(rules|restrictions|limits|filters|guidelines|ethics)",
        "fake_system_turn": r"(^|\n)\s*(system|assistant)\s*:|<\s*/?\s*(system|im_start|im_end)\b"
        r"|\[\s*/?\s*INST\s*\]",
        "new_instructions": r"\bnew\s+(instructions|directive|task)\s*:",
    }.items()
}


_CONTROL_CUES = re.compile(
    r"\b(you|your|assistant|ai|chatbot|bot|prompt|instructions?|ignore|disregard|forget|"
    r"override|pretend|role-?play|persona|act as|from now on|respond|reply|print|reveal|say|"
    r"write|jailbreak)\b",
    re.IGNORECASE,
)
"""Words an instruction aimed at the assistant needs. An LLM 'injection' verdict on text with
none of them is overruled: the small local model flags plain bar-exam fact patterns."""


def addresses_the_assistant(text: str) -> bool:
    """True when ``text`` holds words an instruction to the assistant would use."""
    return bool(_CONTROL_CUES.search(text))


def screen_user_input(text: str) -> list[str]:
    """Names of the deterministic injection patterns ``text`` matches (empty = looks safe)."""
    return [name for name, pattern in _INJECTION_PATTERNS.items() if pattern.search(text)]


prescreen_injection = screen_user_input


_PASSAGE_PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(p, re.IGNORECASE)
    for name, p in {
        "addresses_ai": r"\b(note|message|instructions?)\s+(to|for)\s+(the\s+)?"
        r"(ai|assistant|language\s+model|llm|chatbot|model)\b",
        "override_instructions": _INJECTION_PATTERNS["override_instructions"].pattern,
        "forced_answer": r"\b(correct|right|best)\s+answer\s+(to\s+(this|any|the)\s+question\s+)?"
        r"(is|must\s+be)\s*:?\s*\(?[A-D]\)?(?![A-Za-z])",
        "reveal_prompt": _INJECTION_PATTERNS["reveal_prompt"].pattern,
        "fake_system_turn": _INJECTION_PATTERNS["fake_system_turn"].pattern,
    }.items()
}


def screen_passage(text: str) -> list[str]:
    """Names of the injection patterns a corpus passage matches (empty: clean).  Written for
    documents: real legal text describes instructions to juries and parties, but never addresses
    an AI or declares the answer letter of a question."""
    return [name for name, pattern in _PASSAGE_PATTERNS.items() if pattern.search(text or "")]


def detect(text: str, client: Any, *, skip_llm: bool) -> InjectionCheck:
    """The injection verdict on the user's input (see the module docstring for the policy)."""
    hits = screen_user_input(text)
    if hits:
        return InjectionCheck(
            is_safe=False,
            verdict="injection",
            prescreen=hits,
            llm_verdict=None,
            reason=f"pre-screen: {', '.join(hits)}",
            injection_check="full",
        )
    if skip_llm:
        return _prescreen_only(hits, "skipped", "LLM check skipped (SKIP_INJECTION_CHECK)")
    try:
        result = prompts.call(client, "injection", user_input=prompts.quote("user_input", text))
    except LLMCallError as exc:
        logger.warning("injection check LLM call failed; the pre-screen verdict stands: %s", exc)
        return _prescreen_only(hits, "error", "LLM verdict unavailable (call failed)")
    parsed = result.parsed
    if parsed is None:
        return _prescreen_only(hits, "unparsed", "LLM verdict unusable; pre-screen clean")
    if parsed.verdict == "injection" and not addresses_the_assistant(text):
        return InjectionCheck(
            is_safe=True,
            verdict="safe",
            prescreen=hits,
            llm_verdict="injection",
            reason=f"LLM verdict overruled: no instruction to the assistant ({parsed.reason})",
            injection_check="full",
        )
    return InjectionCheck(
        is_safe=parsed.verdict == "safe",
        verdict=parsed.verdict,
        prescreen=hits,
        llm_verdict=parsed.verdict,
        reason=parsed.reason,
        injection_check="full",
    )


def _prescreen_only(hits: list[str], llm_verdict: str, reason: str) -> InjectionCheck:
    return InjectionCheck(
        is_safe=True,
        verdict="safe",
        prescreen=hits,
        llm_verdict=llm_verdict,
        reason=reason,
        injection_check="prescreen_only",
    )
