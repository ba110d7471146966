"""The user's question, read once at the start of a run (:class:`Question`) for every node and the
answer stage; :func:`parse` splits what a user typed into the question and its choices."""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from nupunkt import sent_tokenize

MC_LETTERS = "ABCD"
Kind = Literal["fact_pattern", "rule_question", "multiple_choice"]


class InputError(ValueError):
    """The user's input cannot be used; the message says why (one line)."""


MAX_QUESTION_CHARS = 6000
"""Longest accepted input (question + choices), in characters (~1,500 tokens)."""


@dataclass(frozen=True)
class StateLaw:
    """The state, or another country, whose law a question asks for."""

    name: str
    """A state's name ("Ohio"), or a country's demonym ("French")."""
    code: str
    """A state's USPS code (passage metadata ``jurisdiction``); "" for a country."""
    held: bool
    """Whether some passage of the collection is that state's law."""


@dataclass(frozen=True)
class Question:
    """A question as the run reads it (:meth:`read`)."""

    text: str
    """The question without its choices, whitespace collapsed."""
    choices: dict[str, str] = field(default_factory=dict)
    facts: tuple[str, ...] = ()
    """The sentences before what is asked (a fact pattern's facts)."""
    asked: str = ""
    """The closing sentences that ask (those ending in "?", else the last one)."""
    kind: Kind = "rule_question"
    yes_no: bool = False
    """Whether what is asked takes a yes or a no (:func:`asks_yes_or_no`)."""
    law: StateLaw | None = None
    """The state or country whose law it asks for (None: none named, or not read)."""
    issues: tuple[str, ...] = ()
    """The issues the user set as the agenda (``main.py --issues``), researched instead of the
    model's picks (empty: the model picks)."""
    earlier: tuple[str, ...] = ()
    """A follow-up's facts stated on its thread before it (the first of ``facts``; :meth:`after`)."""
    hypothetical: bool = False
    """A follow-up that asks the thread's last question again on changed facts ("What if ...?")."""

    def __post_init__(self) -> None:  # a checkpoint gives the tuples back as lists
        for name in ("facts", "issues", "earlier"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def new_facts(self) -> tuple[str, ...]:
        """The facts this question states itself (a follow-up's, after its thread's)."""
        return self.facts[len(self.earlier) :]

    def after(
        self, facts: Sequence[str], asked: str, law: Callable[[str], StateLaw | None] | None = None
    ) -> Question:
        """This question as a follow-up on a thread whose facts so far are ``facts`` and whose
        last question asked ``asked``: the thread's facts, then this question's own (a
        :data:`HYPOTHETICAL` follow-up states its new fact and asks ``asked`` again)."""
        what_if = HYPOTHETICAL.match(self.asked) if not self.choices and asked else None
        new = list(self.facts)
        if what_if:  # its clause as a fact sentence
            new.append(what_if[1][:1].upper() + what_if[1][1:] + ".")
        new = [f for f in new if f not in facts]  # "What if ...?" asked again (say with --issues)
        asked = asked if what_if else self.asked
        read = Question.read(" ".join([*facts, *new, asked]), self.choices, law, self.issues)
        return replace(  # the sentences as each turn stated them, however the splitter joins them
            read,
            facts=(*facts, *new),
            asked=asked,
            yes_no=asks_yes_or_no(asked),
            earlier=tuple(facts),
            hypothetical=bool(what_if),
        )

    @classmethod
    def read(
        cls,
        text: str,
        choices: Mapping[str, str] | None = None,
        law: Callable[[str], StateLaw | None] | None = None,
        issues: Sequence[str] = (),
    ) -> Question:
        """``text`` (without choices) read once; ``law(asked)`` names the law it asks for;
        ``issues``: the agenda the user set."""
        text = " ".join(str(text).split())
        facts, asked = split_question(text)
        choices = {str(k).upper(): str(v) for k, v in (choices or {}).items()}
        return cls(
            text,
            choices,
            tuple(facts),
            asked,
            question_kind(text, choices),
            asks_yes_or_no(asked),
            law(asked) if law else None,
            tuple(" ".join(i.split()) for i in issues if i.strip()),
        )

    @property
    def objective(self) -> str:
        """The question with its choices as "(A) ..." lines (what the injection screen reads)."""
        return "\n".join([self.text, *(f"({k}) {v}" for k, v in self.choices.items())])


HYPOTHETICAL = re.compile(r"^(?:what if|suppose|assume|imagine)(?: that)?\s+(.+?)[\s?.!]*$", re.I)
"""A follow-up that changes the facts and asks the same question again: "What if the university
had given her notice first?" states "The university had given her notice first." (a run's
``follow_up`` metric counts them)."""

MIN_FACT_WORDS = 8
"""A question with fewer words of facts before it asks is a rule question: one short sentence of
what happened is facts ("Jake punched a stranger in a bar.") (docs/MEASUREMENTS_HISTORY.md, stop 41)."""


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, whitespace collapsed (nupunkt: Punkt trained on legal text, so
    "28 U.S.C. § 1441(a)", "Fed. R. Evid." and "Smith v. Jones" stay whole)."""
    return [s.strip() for s in sent_tokenize(" ".join(str(text).split())) if s.strip()]


_MISSED_END = re.compile(r"(?<=[a-z]{3}[.!])\s+(?=[A-Z])")
"""A sentence end the splitter missed in front of a question: Punkt reads "Is" after "...no fault
of hers." or "...for a month." as inside the sentence (a word of three lowercase letters or more
before the stop is no abbreviation such as "v." or "U.S.")."""


def split_question(question: str) -> tuple[list[str], str]:
    """(fact sentences, what is asked): the asked part is the closing sentences that end in '?';
    a fact the splitter left in front of one is a fact (:data:`_MISSED_END`)."""
    sentences = split_sentences(question)
    asked: list[str] = []
    while sentences and sentences[-1].endswith("?"):
        *front, last = _MISSED_END.split(sentences.pop())
        asked.insert(0, last)
        if front:  # the facts end here
            sentences.extend(front)
            break
    return sentences, " ".join(asked) or (sentences.pop() if sentences else question.strip())


def question_kind(question: str, choices: Mapping[str, str] | None = None) -> Kind:
    """multiple_choice with choices; a fact pattern when facts precede what is asked; else a rule
    question."""
    if choices:
        return "multiple_choice"
    words = sum(len(f.split()) for f in split_question(question)[0])
    return "fact_pattern" if words >= MIN_FACT_WORDS else "rule_question"


AUX = r"(?:is|are|was|were|be|been|can|cannot|could|does|do|did|will|would|shall|should|may|might|must|has|have|had)"
"""Auxiliary verbs: a yes/no question opens with one; a heading has none (:func:`is_heading`)."""
_YES_NO = re.compile(
    rf"^{AUX}\b|^(?!(?:which|what|who|whom|whose|when|where|why|how)\b)[^?]*,\s+{AUX}\b", re.I
)
"""A question that opens with an auxiliary verb, or does so after an opening phrase ("At trial,
can the officer repeat it?"); a wh-question never ("Which rights, if any, were violated?")."""
_EITHER_OR = re.compile(r"\bor\b(?!\s+not\b)[^,;?]*\?\s*$", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!])\s+(?=[A-Z])")


def asks_yes_or_no(asked: str) -> bool:
    """Whether the question as asked takes a yes or a no: its last sentence asks with an auxiliary
    verb (:data:`_YES_NO`) and offers no alternatives ("Is it embezzlement or larceny?").  The
    part after the last sentence end is read too: the splitter can leave a fact in front (one
    :data:`_MISSED_END` does not cut: "Smith v. Jones held X. Is that right?")."""
    last = (split_sentences(asked)[-1] if asked.strip() else "").strip()
    asks = _YES_NO.match(last) or _YES_NO.match(_SENTENCE_END.split(last)[-1])
    return bool(asks) and not _EITHER_OR.search(last)


_CHOICE_LINE = re.compile(r"^\s*\(([A-Z])\)\s*(.*)$")
_INLINE_CHOICE = re.compile(r"(?:^|\s)\(([A-Z])\)\s+")
_OTHER_CHOICE_LINE = re.compile(r"^\s*([A-Z])([.)])\s+(\S.*)$")
_QUESTION_AFTER_LIST = re.compile(r"[.!;]\s+\S[^.!?;]*\?\s*$")
"""A question after the last inline item: the items were a list of subsections, not choices."""

_Choices = dict[str, list[str]]


def _split_choices(lines: list[str], pattern: re.Pattern[str]) -> tuple[list[str], _Choices]:
    """(the lines before the first choice line, letter -> its lines): ``pattern`` matches a choice
    line (its first group the letter, its last the text); a line after one continues it."""
    starts = {i: m for i, line in enumerate(lines) if (m := pattern.match(line))}
    first, current = min(starts, default=len(lines)), ""
    choices: _Choices = {}
    for i in range(first, len(lines)):
        if m := starts.get(i):
            current = m.group(1)
            if current in choices:
                raise InputError(f"choice ({current}) appears twice")
            choices[current] = [m.groups()[-1].strip()]
        elif lines[i].strip():
            choices[current].append(lines[i].strip())
    return lines[:first], choices


def _other_choice_lines(lines: list[str]) -> tuple[list[str], _Choices]:
    """(stem, choices) when the question ends in at least two "A. x" or "A) x" lines (one style,
    in order from A); else ``(lines, {})``: anything irregular leaves an open question."""
    found = [m for line in lines if (m := _OTHER_CHOICE_LINE.match(line))]
    letters = "".join(m.group(1) for m in found)
    one_style = len({m.group(2) for m in found}) == 1
    if len(found) < 2 or not one_style or letters != MC_LETTERS[: len(letters)]:
        return lines, {}
    stem, choices = _split_choices(lines, _OTHER_CHOICE_LINE)
    if not " ".join(stem).strip():
        return lines, {}  # no question before them: an outline, not choices
    return stem, choices


def _inline_choices(text: str) -> tuple[list[str], _Choices]:
    """(stem, choices) of a one-line question whose choices follow it inline, "... (A) x (B) y
    (C) z": at least three, in order from A, running to the end of the text (two could be a
    statute's "(A) and (B)"); else ``([text], {})``."""
    stem, *marked = _INLINE_CHOICE.split(text)  # stem, letter, its text, letter, ...
    letters = "".join(marked[::2])
    if len(letters) < 3 or letters != MC_LETTERS[: len(letters)]:
        return [text], {}
    choices = {k: [v.strip()] for k, v in zip(marked[::2], marked[1::2], strict=True)}
    if _QUESTION_AFTER_LIST.search(choices[letters[-1]][0]):
        return [text], {}  # "... (C) the agent's. Does a CEO's email count?": an enumeration
    return [stem], choices


def from_row(row: Mapping[str, Any]) -> str:
    """A JSON line's question as a user would type it: its shared facts (``prompt``), its question,
    and its choices as "(A) ..." lines, from ``choices`` (a list, or letter -> text) or Bar Exam
    QA's ``choice_a``..``choice_d`` (a user's ``--batch barexam_dev.jsonl`` was asked its stems
    as open questions)."""
    choices = row.get("choices")
    if isinstance(choices, list):  # past D, parse says how many letters it takes
        choices = dict(zip(string.ascii_uppercase, choices, strict=False))
    elif not isinstance(choices, Mapping):
        choices = {k: row.get(f"choice_{k.lower()}") for k in MC_LETTERS}
    stem = [str(row.get(f) or "").strip() for f in ("prompt", "question")]
    lines = [f"({str(k).upper()}) {v}" for k, v in choices.items() if str(v or "").strip()]
    return "\n".join([" ".join(s for s in stem if s), *lines])


def parse(text: str) -> tuple[str, dict[str, str] | None]:
    """Split user input into (question, choices).  Choices are lines ``(A) ...`` (2 to 4, in order
    from A); a line that follows a choice and is not a choice continues it.  Without such lines,
    three or more choices inline after the question ("... (A) x (B) y (C) z") count too."""
    if "\x00" in text:
        raise InputError("the input looks binary (NUL bytes); give a question in plain text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError("the input is not valid UTF-8 text") from None
    if not text.strip():
        raise InputError("the question is empty")
    if len(text) > MAX_QUESTION_CHARS:
        raise InputError(
            f"the input is {len(text)} characters; the limit is {MAX_QUESTION_CHARS} "
            "(shorten the fact pattern)"
        )
    stem, choices = _split_choices(text.splitlines(), _CHOICE_LINE)
    if not choices:
        stem, choices = _other_choice_lines(stem)
    if not choices:
        stem, choices = _inline_choices(" ".join(stem))
    question = " ".join(" ".join(stem).split())
    if not question:
        raise InputError("the question has answer choices but no question text")
    if not choices:
        return question, None
    letters = "".join(choices)
    if letters != MC_LETTERS[: len(letters)]:
        raise InputError(
            f"answer choices must be ({') ('.join(MC_LETTERS[:2])}) ... in order without gaps, "
            f"at most {len(MC_LETTERS)}; got ({') ('.join(letters)})"
        )
    if len(letters) < 2:
        raise InputError("a multiple-choice question needs at least two choices, (A) and (B)")
    out = {k: " ".join(" ".join(v).split()) for k, v in choices.items()}
    if empty := [k for k, v in out.items() if not v]:
        raise InputError(f"choice ({empty[0]}) has no text")
    return question, out
