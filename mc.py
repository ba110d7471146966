"""Multiple-choice answering: one prompt and one letter parser for the agent and every eval mode.

:func:`parse_mc_answer` tries ``answer_format`` (the first ``**Answer: (B)**``-like marker, or a
bare letter: the 1.5B model also labels its per-choice lines, and on barexam_dev its first letter
beat its last 9 times of 10), ``choice_text`` (one choice quoted), ``word_overlap`` (the last line
holds >= 60% of one choice's content words), then ``none``, which :func:`select_answer` retries
once with the strict prompt."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import prompts

logger = logging.getLogger(__name__)

NO_EVIDENCE = "(No passages: answer from your own knowledge of the law.)"

_MARKER = re.compile(
    r"(?:\banswer\b|\bcorrect\s+(?:answer|choice|option)\b|\bbest\s+(?:answer|choice|option)\b)"
    r"\s*(?:is|would\s+be|:|=)?\s*[:\-]?\s*\**\s*(?:choice\s+|option\s+)?"
    r"[\(\[]?\s*((?-i:[A-H]))\s*[\)\]]?(?![A-Za-z0-9'])",
    re.IGNORECASE,
)
_BARE = re.compile(r"^\W*\(?\s*([A-Ha-h])\s*\)?\W*$")
WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = (
    "a an the of to in on for and or but is are was were be been by with as "
    "at from that this it its his her their he she they not no any all which who whom whose"
)
STOPWORDS = frozenset(_STOPWORDS.split())


@dataclass
class MCResult:
    letter: str | None
    strategy: str
    text: str
    retried: bool = False
    parse_failed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_choices(choices: Mapping[str, str]) -> str:
    """``(A) text`` lines in letter order."""
    return "\n".join(f"({k}) {' '.join(str(v).split())}" for k, v in sorted(choices.items()))


def answer_line(letter: str | None, choices: Mapping[str, str]) -> str:
    """The answer's last line: ``**Answer: (X)** choice text``, or why there is no letter."""
    if letter:
        return f"**Answer: ({letter})** {choices.get(letter, '')}"
    return "**Answer: none** (no letter could be parsed from the model's reply)"


_WHOLE = re.compile(r"(?s).*[.!?](?=\s)")


def reasoning(reply: str) -> str:
    """The reply without its lines that only name the letter (:func:`answer_line` states it); a
    reply cut off at its token limit ends at its last full sentence, marked "…"."""
    lines = reply.strip().splitlines()
    said = "\n".join(ln for ln in lines if _MARKER.sub("", ln).strip(" *:-.")).strip()
    if said and not said.endswith((".", "!", "?", ")", '"', "*")):
        whole = _WHOLE.match(said + " ")
        said = (whole[0] if whole else said).rstrip() + " …"
    return said


def _norm(text: str) -> str:
    return " ".join(WORD.findall(text.lower()))


def content_words(text: str) -> set[str]:
    """Lower-case words of ``text`` without stop words and single letters."""
    return {w for w in WORD.findall(text.lower()) if w not in STOPWORDS and len(w) > 1}


def doctrine_key(name: str) -> str:
    """The doctrine a candidate name stands for: the content words before " (", in any order and
    in the singular ("Offer (Firm offer (UCC 2-205))" is "Offer"; "Negligence damages" is "Damages
    in negligence"; "Prior statements of testifying witnesses" is "Prior statements of a
    testifying witness"; "FRE 404(b)" stays whole; "Assignment versus sublease" is "Assignment
    and sublease")."""
    words = content_words(name.split(" (")[0]) - {"versus", "vs"}
    return " ".join(sorted(map(_singular, words)))


def _singular(word: str) -> str:
    if len(word) <= 3 or word.endswith("ss"):
        return word
    if word.endswith(("sses", "ies")):
        return word[:-2] if word.endswith("sses") else word[:-3] + "y"
    return word.removesuffix("s")


def parse_mc_answer(text: str, choices: Mapping[str, str]) -> tuple[str | None, str]:
    """(letter or None, strategy) of a reply; letters outside ``choices`` are ignored."""
    valid = {k.upper() for k in choices}
    reply = (text or "").strip()
    if not reply:
        return None, "none"
    found = [*_MARKER.finditer(reply), _BARE.match(reply)]
    if letters := [m[1].upper() for m in found if m and m[1].upper() in valid]:
        return letters[0], "answer_format"

    norm_reply = _norm(reply)
    quoted = [k for k, v in choices.items() if _norm(str(v)) and _norm(str(v)) in norm_reply]
    if len(quoted) == 1:
        return quoted[0].upper(), "choice_text"

    last = content_words([ln for ln in reply.splitlines() if ln.strip()][-1])
    words = {k.upper(): content_words(str(v)) for k, v in choices.items()}
    scores = sorted(((len(w & last) / len(w), k) for k, w in words.items() if w), reverse=True)
    if scores and scores[0][0] >= 0.6 and (len(scores) == 1 or scores[0][0] - scores[1][0] >= 0.2):
        return scores[0][1], "word_overlap"
    return None, "none"


def select_answer(
    client: Any, question: str, choices: Mapping[str, str], evidence: str | None
) -> MCResult:
    """Pick a letter with one LLM call (plus one strict retry when none parses); ``evidence``
    (numbered passages) is quoted as data.  ``llm_config.LLMCallError`` propagates."""
    values = {
        "question": " ".join(question.split()),
        "choices": format_choices(choices),
        "evidence": prompts.quote("evidence", evidence) if evidence else NO_EVIDENCE,
    }

    def lettered(text: str) -> bool:  # a reply with no letter is not cached (asked again later)
        return parse_mc_answer(text, choices)[0] is not None

    result = prompts.call(client, "mc_select", accept=lettered, **values)
    letter, strategy = parse_mc_answer(result.text, choices)
    if letter is not None:
        return MCResult(letter, strategy, result.text)
    logger.info("mc_select: no letter in the reply; retrying with the strict format")
    retry = prompts.call(client, "mc_select_strict", accept=lettered, **values)
    letter, strategy = parse_mc_answer(retry.text, choices)
    text = f"{result.text}\n\n[strict retry] {retry.text}"
    return MCResult(letter, strategy, text, retried=True, parse_failed=letter is None)
