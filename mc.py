"""Multiple-choice answering: one prompt (``skills/mc_select.md``) and one letter parser.

Used by the agent's ``mc_select`` node and by the eval modes llm_only (``evidence=None``), rag and
gold_passage, so every mode is scored with the same prompt and the same extraction.

Letter extraction (:func:`parse_mc_answer`), in order:

1. ``answer_format`` — an explicit marker: ``**Answer: (B)**``, ``Answer: B``, ``the answer is (B)``,
   ``correct choice is B``, or a reply that is only a letter (``B``, ``(B)``, ``B.``). Of several
   markers the first wins: the letter the prompt asks for on the first line.  The embedded 1.5B
   model often labels its per-choice lines with the marker (``**Answer: (C)** C fails ...``), so
   its last marker is only the last choice it discussed; where its first and last letters
   differed on barexam_dev, the first was right 9 times and the last once.
2. ``choice_text`` — the reply quotes the full text of exactly one choice.
3. ``word_overlap`` — the reply's last line shares most content words with exactly one choice
   (>= 60% of that choice's words and a clear margin over the next).
4. ``none`` — no letter.

When the first reply yields no letter, :func:`select_answer` retries once with the strict prompt
(``skills/mc_select_strict.md``: the letter only, a few tokens).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import prompts

logger = logging.getLogger(__name__)

MC_LETTERS = "ABCD"

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
    """The reply without its lines that only name the letter ("**Answer: (A)**"): what the model
    said besides the letter, which :func:`answer_line` states (empty: nothing).  A reply cut off
    at its token limit ends at its last full sentence, marked "…"."""
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


def parse_mc_answer(text: str, choices: Mapping[str, str]) -> tuple[str | None, str]:
    """(letter or None, strategy) extracted from a reply; letters outside ``choices`` are ignored;
    of several answer markers, the first."""
    valid = {k.upper() for k in choices}
    reply = (text or "").strip()
    if not reply:
        return None, "none"
    markers = [m.group(1).upper() for m in _MARKER.finditer(reply)]
    markers = [m for m in markers if m in valid]
    if markers:
        return markers[0], "answer_format"
    bare = _BARE.match(reply)
    if bare and bare.group(1).upper() in valid:
        return bare.group(1).upper(), "answer_format"

    norm_reply = _norm(reply)
    quoted = [k for k, v in choices.items() if _norm(str(v)) and _norm(str(v)) in norm_reply]
    if len(quoted) == 1:
        return quoted[0].upper(), "choice_text"

    lines = [ln for ln in reply.splitlines() if ln.strip()]
    last = content_words(lines[-1]) if lines else set()
    scores = []
    for k, v in choices.items():
        words = content_words(str(v))
        if words:
            scores.append((len(words & last) / len(words), k.upper()))
    scores.sort(reverse=True)
    if scores and scores[0][0] >= 0.6 and (len(scores) == 1 or scores[0][0] - scores[1][0] >= 0.2):
        return scores[0][1], "word_overlap"
    return None, "none"


def select_answer(
    client: Any,
    question: str,
    choices: Mapping[str, str],
    evidence: str | None,
) -> MCResult:
    """Pick a letter with one LLM call (plus one strict retry when no letter can be parsed).

    ``evidence`` is plain text (numbered passages); it is quoted as data in the prompt.  LLM
    transport errors (``llm_config.LLMCallError``) propagate to the caller.
    """
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
