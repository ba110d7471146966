"""The answer stage: one typed answer record, decided once, that applies the law to the facts
(docs/ARCHITECTURE.md, "The answer stage").

Per agenda issue, from the passages its research found, the answer is a bar essay: the **rule**
(sentences of its passages quoted verbatim, chosen by cosine to the issue and its facts, each
cited), the **application** (one call, ``skills/apply_rule.md``: per requirement, the stated fact
that meets or fails it), the **conclusion** (every requirement met: the rule applies; one failed: it
does not; else the facts do not settle it), then the **bottom line** (a yes/no question: one call,
``skills/bottom_line.md``, from the conclusions; a "which ..." question: the issues by conclusion).

Each heuristic on the way is a named guard of :data:`GUARDS`.  Under the **evidence policy**
(``ANSWER_MODE=evidence``) each rule sentence must also pass the grounding gate
(``skills/verify_quotes.md``).  A rule question states the rule as its source does
(:func:`lead_rule`).  With no passage to stand on, the record abstains and says why.  Everything
the CLI, the exit code, the QA memory and the evals need is a field of :class:`AnswerRecord`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
from langchain_core.runnables.config import ContextThreadPoolExecutor

import mc
import prompts
from documents import term_used
from prompts import Application, Check, Finding, Met
from question import AUX, Kind, Question, split_sentences

Policy = Literal["research", "evidence"]
EmbedFn = Callable[[list[str]], Any]
Pair = tuple[Mapping[str, Any], str]
"""A sentence quoted from a passage: (the passage, the sentence verbatim)."""

RULE_SENTENCES = 2
"""Sentences quoted as an issue's rule (the best by cosine to the issue and its facts)."""
RULE_QUESTION_SENTENCES = 3
"""The first sentences of its own passage quoted as a rule question's rule (:func:`lead_rule`)."""
VERIFY_CANDIDATES = 4
"""Candidate rule sentences per issue the grounding gate judges (evidence policy)."""
HEADING_WORDS = 6
"""A passage's first sentence of at most this many words is its heading, never a rule."""
TITLED_HEADING_WORDS = 10
"""A first sentence of at most this many words, most of them its title's, is its heading too."""
FACT_SENTENCES = 3
"""Sentences of a fact pattern kept with an issue (the closest to it by cosine)."""
FACT_FIT = 0.33
"""Cosine of an issue's quoted rule to the closest fact sentence below which the facts do not raise
the issue (``off_facts``): the low end of the tune half's plateau (docs/MEASUREMENTS_HISTORY.md,
"`FACT_FIT` re-tuned")."""
FACT_RELEVANCE = 0.10
"""Cosine of a requirement to the fact a check names below which that fact cannot decide it
(``unrelated_fact``, stop 36): the 1.5B marks most requirements met by some unrelated fact."""
ASKED_FIT = 0.45
"""Cosine of an issue's quoted rule to a rule question below which the question does not ask about
it (``not_asked``, stop 44): noise picks sit below 0.45, a second doctrine asked about 0.5-0.7."""
QUESTION_FIT = 0.20
"""Cosine of an open question to the closest rule sentence of its answer below which the rules are
about other matters and the answer is declined (``off_question``, stop 37: a singer's video
answered with commercial speech scores 0.13)."""
DOCTRINE_MATCH = 0.30
"""Cosine of an issue's name to a passage's title below which the passage is on another doctrine
(``off_doctrine``): all-MiniLM-L6-v2 puts a doctrine and its own passage at 0.45-0.85."""
DEFINITIONS = 2
"""Definitions of the terms its rule sentences use quoted with an issue's rule, at most."""
NO_VERDICT = float("inf")
"""VERDICT_SUPPORT on the embedded model: no reading of its is shown as a conclusion or verdict."""
API_VERDICT_SUPPORT = 0.0
"""VERDICT_SUPPORT with an API model: every reading is shown (not measured here: no API model
answers offline).  The embedded model shows none (:data:`NO_VERDICT`): its bottom line read "yes"
on all 21 fact patterns it decided, and the support that made its tune-half verdicts 3/3 right
(0.25) gave 1/4 on the report half (docs/MEASUREMENTS.md, "Fact patterns")."""


class Guard(NamedTuple):
    """One heuristic on model output or text and the measurement that keeps it (tune half decides,
    report half confirms: docs/MEASUREMENTS_HISTORY.md); :meth:`_Stage.fire` counts it."""

    stage: str
    does: str
    threshold: str = ""
    kept_by: str = ""


GUARDS: dict[str, Guard] = {
    "off_doctrine": Guard(
        "rules",
        "a passage on another doctrine is never the issue's rule",
        f"DOCTRINE_MATCH {DOCTRINE_MATCH}",
        "ablation, stop 35: misgrounded tune 86/253 with, 105/267 without; report 106/242 with, "
        "118/256 without; issues found 24/40 with, 25/40 without",
    ),
    "same_rule": Guard(
        "rules",
        "an issue whose closest sentences an earlier issue quotes quotes the closest ones no "
        "earlier issue does; with none left, it is not answered again",
        kept_by="stop 43 (fp_tune_s43_same): tune misgrounded 36/194 -> 36/183, issues found "
        "23/40 kept; stop 57, the sentences left (fp_s57_leftover): issues found tune 21/40 kept, "
        "report 17 -> 18/34, misgrounded unchanged (29, 87)",
    ),
    "off_facts": Guard(
        "application",
        "an issue whose rule is far from every stated fact is named, not applied (the best fit "
        "is exempt unless what is asked names an issue)",
        f"FACT_FIT {FACT_FIT}",
        "stop 33: the rule-to-fact cosine predicts a gold-doctrine citation (AUC 0.87 tune, "
        "0.81 report); re-tuned stop 41 at 0.33: misgrounded tune 53/211 -> 36/194, report "
        "90/210 -> 85/205; stop 65, no exemption where an issue is named (open_s65_asks): open "
        "set misgrounded 223 -> 208, key points and abstention kept; fact patterns the same",
    ),
    "not_asked": Guard(
        "application",
        "a rule question's issue whose rule is far from the question is named, not answered "
        "(the best fit is exempt unless the question names an issue: 'What is the mailbox "
        "rule?' quoted time, place and manner restrictions); one that names issues is answered "
        "on them and issues named after them",
        f"ASKED_FIT {ASKED_FIT}",
        "stop 44, rule questions half A: misgrounded 31 -> 25, no gold issue lost; stop 65, "
        "named issues alone (open_s65_named2 against open_s65_cut; items alternately in two "
        "halves): misgrounded 131/374 -> 115/345 and 77/302 -> 71/287, key points 65 -> 64 and "
        "63 -> 62 (each counted from words of a sentence on another doctrine), abstention kept",
    ),
    "not_raised": Guard(
        "application",
        "an issue no stated fact bears on is named, not answered",
        kept_by="ablation, stop 35: misgrounded tune 86/253 with, 91/258 without; report 106/242 "
        "with, 117/258 without; issues found unchanged",
    ),
    "unrelated_fact": Guard(
        "application",
        "a check whose fact is unrelated to its requirement decides nothing",
        f"FACT_RELEVANCE {FACT_RELEVANCE}",
        "stop 36, tune half: 22 of 86 decided checks named a fact below 0.10 to the requirement; "
        "ablation, stop 60 (fp_s60_norel): misgrounded tune 33/169 with, 42/184 without, report "
        "61/167 with, 72/178 without; issues found tune 22 -> 23/40 without, report 18/34 both",
    ),
    "off_question": Guard(
        "answer",
        "an answer resting only on rules about other matters is declined",
        f"QUESTION_FIT {QUESTION_FIT}",
        "stop 37 (_s37b): misgrounded tune 65/226 -> 59/220, report 97/227 -> 85/215; gold "
        "and issues found unchanged; declines only wrong-law answers",
    ),
    "named_issue": Guard(
        "application",
        "an issue the question names or the user sets is applied even where off_facts or "
        "not_raised would set it aside, with the facts the model ties to it even where "
        "unrelated_fact would drop them",
        kept_by='user trial (stop 47): "Has she committed larceny or embezzlement?" set '
        "embezzlement aside as not raised; ablation, stop 58 (fp_s58_nonamed): no fact pattern "
        "changes on the tune half (they rarely name a doctrine), report misgrounded 65 -> 61 "
        'without; user trial (stop 60): "Is Dana guilty of larceny?" lost its laptop facts '
        '(cosine 0.06 to "intent to permanently deprive") to unrelated_fact',
    ),
    "case_narrative": Guard(
        "rules",
        "a sentence of the user's opinion that tells its own case (names a party of its caption, "
        "or its courts, record or disposition) is never quoted as a rule",
        kept_by="stop 67, the six document patterns on three opinions written for it, the cues "
        "read off them (docs_s67_b20fix -> docs_s67_narr): rule sentences holding the gold's "
        "words tune 1/7 -> 2/6, report 0/7 -> 0/6; misgrounded tune 16/20 -> 11/17, report "
        "20/20 -> 17/17; key points tune 3/9 -> 4/9, report 2/9 -> 4/9; the other patterns "
        "the same",
    ),
    "defined_term": Guard(
        "rules",
        "a rule sentence of the user's document that uses a term the document defines "
        '("a dangerous dog", "without Cause") is followed by the definition, cited to its line',
        f"DEFINITIONS {DEFINITIONS}",
        "stop 67, the document fact patterns (docs_s67_base -> docs_s67_defs): issues found "
        "tune 6/11 -> 10/11, report 6/12 -> 12/12; key points tune 14 -> 15/16, report 10 -> "
        "13/15; misgrounded tune 4/37 -> 6/50, report 6/37 -> 6/46",
    ),
    "unparsed_application": Guard(
        "application", "an unreadable apply reply: the rule stands without an application"
    ),
    "unparsed_bottom_line": Guard("bottom line", "an unreadable bottom-line reply: no bottom line"),
    "unnamed_bottom_line": Guard(
        "bottom line", "a yes or no naming no conclusion rests on all of them"
    ),
    "unparsed_verdicts": Guard(
        "rules (evidence policy)", "an unreadable grounding-gate reply verifies nothing"
    ),
}
"""The guards of the answer stage.  A row with no measurement counts a reply the model got wrong
in form (nothing to tune: the answer goes on without that part)."""


@dataclass
class Citation:
    """One numbered source of the answer: the passage and the sentence a reader can check."""

    n: int
    passage_id: str
    title: str
    support: str
    """The sentence of the passage that the citing sentences rest on (verbatim)."""
    pin: str = ""
    """Where a reader finds it in the source (:func:`pin_cite`; "" without document metadata)."""


@dataclass
class Sentence:
    text: str
    role: Literal["rule", "application", "conclusion", "bottom_line"]
    cites: list[int] = field(default_factory=list)
    """Citation numbers (:attr:`Citation.n`); a legal sentence always has at least one."""


@dataclass
class IssueAnswer:
    issue: str
    status: Literal["answered", "no_evidence", "not_researched", "not_raised"]
    sentences: list[Sentence] = field(default_factory=list)
    outcome: Met | None = None
    """The conclusion shown: ``reading`` where ``support`` reaches the bar, else unclear; None: no
    application (a rule question, no rule found)."""
    why: str = ""
    reading: Met | None = None
    """The application's reading of the facts, shown as ``outcome`` only when it is earned."""
    support: float | None = None
    """How far the research supports the reading (:func:`reading_support`)."""
    finding: str = ""
    """The conclusion the reading states (what the bottom-line call reads, shown or not)."""
    turns_on: list[dict[str, str | None]] = field(default_factory=list)
    """What decides the issue (:func:`turns_on`): each requirement's gist and the stated fact said
    to decide it (None: no stated fact)."""
    checks: list[dict[str, Any]] = field(default_factory=list)
    """The application (:class:`prompts.Check` as dicts); a follow-up may carry it over."""
    fit: float | None = None
    """How near its rule is to the stated facts (:func:`_ruled_issues`; None: no rule found)."""


@dataclass
class AnswerRecord:
    """The run's answer, decided once: ``text`` is what the user reads, the rest is it as data."""

    kind: Kind
    text: str
    issues: list[IssueAnswer]
    citations: list[Citation]
    abstained: bool
    why: str = ""
    """Why the answer abstained, or what it could not do."""
    verdict: Met | None = None
    """The bottom line's answer: ``reading`` where ``support`` reaches VERDICT_SUPPORT."""
    reading: Met | None = None
    """The model's answer to the yes/no question from the issues' readings, shown or not."""
    support: float | None = None
    letter: str | None = None
    grounded: bool = False
    """Every legal sentence cites a source (evidence policy: every rule is a verified quote)."""
    quotes: list[dict] = field(default_factory=list)
    """Evidence policy: every sentence the gate judged, {issue, passage_id, text, verdict}."""
    guards: dict[str, int] = field(default_factory=dict)
    """How often each named guard on model output fired in this answer."""
    mc: dict[str, Any] | None = None
    """Multiple choice: how the letter was picked (strategy, retried, closed_book, evidence_ids)
    and ``text``, the answer as shown with its letter (``text`` stays the research's answer)."""
    lean: dict[str, Any] | None = None
    """Multiple choice: lean's retrieval for the letter (route, evidence_score, gate, ids)."""
    reused: list[str] = field(default_factory=list)
    """A follow-up's issues whose application is the thread's earlier one (:func:`_checks`)."""
    others: list[str] = field(default_factory=list)
    """Candidates left off the agenda, named after the answer (:meth:`shown`): the user's next
    step (``--issues``, ``--review``) where the research missed."""

    @classmethod
    def declined(cls, kind: Kind, text: str, why: str) -> AnswerRecord:
        """A record that abstains before any answer was written (injection, failed run)."""
        return cls(kind, text, [], [], True, why)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def shown(record: Mapping[str, Any]) -> str:
        """What the user reads of a record (``to_dict()``): with a letter, the answer and it; then
        the doctrines it did not research (``others``: named, not stated, so not in ``text``)."""
        text = str((record.get("mc") or {}).get("text") or record.get("text") or "")
        if others := record.get("others"):
            # a name holding ";" ("Termination of offers; option contracts and firm offers")
            # shows with a comma, as --issues reads it: the list itself is split by ";"
            names = "; ".join(o.replace(";", ",") for o in others)
            text += f"\n\nOther doctrines the sources hold, not researched: {names.rstrip('.')}."
        return text

    @property
    def sentences(self) -> list[Sentence]:
        return [s for issue in self.issues for s in issue.sentences]

    @property
    def quoted_doctrines(self) -> set[str]:
        """The doctrines of the sources the answer quotes (their titles' :func:`mc.doctrine_key`):
        none of them is listed as set aside ("Considered, but …") or as not researched."""
        return {mc.doctrine_key(c.title) for c in self.citations}


def _rows(embed: EmbedFn, texts: list[str]) -> np.ndarray:
    return np.asarray(embed(texts), dtype=np.float32) if texts else np.zeros((0, 1), np.float32)


def cosines(embed: EmbedFn, query: str, texts: Sequence[str]) -> np.ndarray:
    """The cosine of ``query`` to each of ``texts``, from one ``embed`` call (unit rows)."""
    rows = _rows(embed, [query, *texts])
    return rows[1:] @ rows[0]


def issue_facts(issue: str, facts: Sequence[str], embed: EmbedFn) -> list[str]:
    """The :data:`FACT_SENTENCES` fact sentences closest to ``issue``, in the facts' order."""
    if len(facts) <= FACT_SENTENCES:
        return list(facts)
    closest = np.argsort(-cosines(embed, issue, facts))[:FACT_SENTENCES]
    return [facts[i] for i in sorted(closest)]


_AUXILIARY = re.compile(rf"\b{AUX}\b", re.IGNORECASE)


def is_heading(sentence: str, title: str) -> bool:
    """Whether a passage's first sentence is its heading, not a rule: short, or a little longer
    with no auxiliary verb and most of its words (of three letters or more) its title's."""
    n = len(sentence.split())
    if n <= HEADING_WORDS:
        return True
    if n > TITLED_HEADING_WORDS or _AUXILIARY.search(sentence):
        return False
    words = [w for w in mc.WORD.findall(sentence.lower()) if len(w) > 2]
    title_words = set(mc.WORD.findall(title.lower()))
    return sum(w in title_words for w in words) > len(words) / 2


_ENDS_SENTENCE = re.compile(r"[.!?:;][\"'\u201d\u2019)\]]*$")
CAPTION_WORDS = 12


def _is_caption(line: str) -> bool:
    """A document's caption or citation line ("SMITH v. JONES Supreme Court of Ohio Decided March
    3, 2022"), never a rule: short, ending no sentence, with no auxiliary verb."""
    short = len(line.split()) <= CAPTION_WORDS
    return short and not _ENDS_SENTENCE.search(line.rstrip()) and not _AUXILIARY.search(line)


_GENERIC_PARTIES = frozenset({"state", "people", "united", "commonwealth", "city", "county", "in"})
_PROCEDURE = re.compile(
    r"\b(?:trial court|court of appeals|appellate court|district court|testified|the judgment"
    r"|the order|(?:is|are) (?:reversed|affirmed|remanded)|we (?:reverse|affirm)"
    r"|delivered the opinion)\b|^(?:Here|In this case|In the present case)\b",
    re.IGNORECASE,
)
"""What a court says of its own case: its courts and record, its disposition, "Here, ..."."""


def case_narrative(doc: Mapping[str, Any], sentences: Sequence[str]) -> set[str]:
    """The ``sentences`` of a loaded opinion (``kind`` opinion) that tell its own case, never its
    rule (guard ``case_narrative``): those naming a party of its caption ("HOLLIS v. GRANGE
    HARDWARE CO.": Hollis, Grange) or its procedure (:data:`_PROCEDURE`)."""
    if doc.get("kind") != "opinion":
        return set()
    sides = re.split(r"\s+v\.?\s+", str(doc.get("title") or ""), maxsplit=1)
    heads = [m[0] for side in sides if len(sides) == 2 and (m := re.match(r"[A-Za-z]+", side))]
    names = [n for n in heads if n.lower() not in _GENERIC_PARTIES and len(n) > 2]
    party = re.compile(rf"\b(?:{'|'.join(map(re.escape, names))})\b", re.I) if names else None
    return {s for s in sentences if _PROCEDURE.search(s) or (party and party.search(s))}


def candidate_sentences(doc: Mapping[str, Any]) -> list[str]:
    """A passage's sentences that can state a rule (:func:`_sentences`), but an opinion's story of
    its own case (:func:`case_narrative`)."""
    sentences = _sentences(doc)
    told = case_narrative(doc, sentences)
    return [s for s in sentences if s not in told]


def _sentences(doc: Mapping[str, Any]) -> list[str]:
    """A passage's sentences of five words or more but its heading (:func:`is_heading`), caption
    lines, and leading lines that repeat its title, its ``heading`` path or a Markdown heading."""
    heads = {str(doc.get("title") or "").strip(), *str(doc.get("heading") or "").split(" > ")}
    lines = str(doc.get("text") or "").split("\n")
    while len(lines) > 1 and (lines[0].strip() in heads or lines[0].lstrip().startswith("#")):
        lines.pop(0)
    if "\n" in str(doc.get("text") or ""):  # a loaded document's blocks, each its own sentences
        lines = [line for line in lines if not _is_caption(line)]
    sentences = [s for line in lines for s in split_sentences(line)]
    if sentences and is_heading(sentences[0], str(doc.get("title") or "")):
        sentences = sentences[1:]
    return [s for s in sentences if len(s.split()) >= 5]


def doctrine_scores(issue: str, docs: Sequence[Mapping[str, Any]], embed: EmbedFn) -> list[float]:
    """Per passage: the cosine of ``issue``'s name to its title and first sentence."""
    firsts = [(split_sentences(str(d.get("text") or "")) or [""])[0] for d in docs]
    heads = [f"{d.get('title') or ''}. {f}".strip(". ") for d, f in zip(docs, firsts, strict=True)]
    return [float(s) for s in cosines(embed, issue, heads)] if docs else []


def lead_rule(doc: Mapping[str, Any], question: str, embed: EmbedFn) -> list[Pair]:
    """The rule as its source states it: a passage's first :data:`RULE_QUESTION_SENTENCES`
    candidate sentences, and the one closest to ``question`` when it comes later, in order."""
    sentences = candidate_sentences(doc)
    n = RULE_QUESTION_SENTENCES
    keep = list(range(min(n, len(sentences))))
    if len(sentences) > n:
        closest = int(np.argmax(cosines(embed, question, sentences)))
        keep += [closest] if closest >= n else []
    return [(doc, sentences[i]) for i in keep]


def select_rule(
    query: str,
    docs: Sequence[Mapping[str, Any]],
    embed: EmbedFn,
    n: int = RULE_SENTENCES,
    taken: Container[tuple[str, str]] = (),
    asked: str = "",
) -> list[Pair]:
    """The ``n`` sentences of all the issue's passages closest to ``query`` (the issue and its
    facts), in passage order, but those ``taken`` (the fitting rule is often the search's third or
    fourth passage: docs/MEASUREMENTS_HISTORY.md, stop 32); with ``asked``, also the one closest
    to it (a user's ordinance: "What fine does she face?" is answered by its penalty clause, and
    the facts matched the leash and dog-bite sections)."""
    pool = [(d, s) for d in docs for s in candidate_sentences(d) if (d["id"], s) not in taken]
    if not pool:
        return []
    texts = [s for _, s in pool]
    keep = {int(i) for i in np.argsort(-cosines(embed, query, texts))[:n]}
    if asked:
        keep.add(int(np.argmax(cosines(embed, asked, texts))))
    return [pool[i] for i in sorted(keep)]


@dataclass
class IssueResearch:
    """What the research hands over for one issue: its passages, best first (empty: none passed)."""

    issue: str
    docs: list[dict]
    researched: bool = True
    why: str = ""
    facts: list[str] | None = None
    """The fact sentences the step kept for the issue (None: chosen here by cosine)."""
    chosen: bool = False
    """The user set it (``--issues`` or the plan review): applied as an issue the question names."""


def pin_cite(doc: Mapping[str, Any], sentence: str = "", pin: str = "") -> str:
    """A pin cite to a passage of the user's documents, from its metadata ("Terry v. Ohio, 392
    U.S. 1, 27 (1968)", "28 U.S.C. § 1441(b)(2)"); "" without one.  With ``sentence``, the pin of
    the passage's line that holds it (a chunk of § 9-3(a) and (b) quoted for its (b)).  A research
    record (``nodes._passage_record``) carries them already computed."""
    lines = doc.get("line_pins") or {}
    if sentence and (at := next((p for line, p in lines.items() if sentence in line), "")):
        return at
    if doc.get("pin"):
        return str(doc["pin"])
    meta = doc.get("metadata") or {}
    pin = pin or str(meta.get("pin") or "").strip()
    if not pin:
        return ""
    cite = str(meta.get("citation") or "").strip()
    title = str(doc.get("title") or meta.get("title") or "").strip()
    if pin == title:  # a heading pin that repeats the title
        return title
    if cite and "§" in cite and pin.startswith("§"):  # the statute's own section, deepest part
        return f"{cite.split('§')[0].strip()} {pin}"
    if cite and pin.startswith(("*", "p. ")):  # a reported case: name, reporter, page (year)
        page = pin.lstrip("*").removeprefix("p. ").strip()
        year = str(meta.get("date") or "")[:4]
        name = f"{title}, " if title and title not in cite else ""
        return f"{name}{cite}, {page}" + (f" ({year})" if year.isdigit() else "")
    return f"{cite or title}, {pin}" if (cite or title) else pin


def _clean(text: str) -> str:
    return " ".join(str(text).split()).rstrip(".;,")


NOT_STATED_FACT = "not stated"
"""A check's fact when no stated fact decides its requirement."""
NOT_STATED = frozenset({NOT_STATED_FACT, "none stated", "not mentioned", "n/a", "none", "unknown"})


def fact_decides(check: Check) -> bool:
    """Whether a stated fact decides the check (met or not)."""
    return check.met != "unclear" and _clean(check.fact).lower() not in NOT_STATED


def named_in(issue: str, asked: str) -> bool:
    """Whether the question as asked names the issue: a comma-separated item of its name before any
    parentheses, as words ("larceny" names "Embezzlement, false pretenses, and larceny by trick";
    "rights" does not name "Rights and duties of cotenants").  Such an issue is always applied."""
    name = issue.partition("(")[0]
    parts = [re.sub(r"^(?:and|or)\s+", "", p.strip()) for p in name.split(",")]
    parts += [name.partition(":")[0].strip()] if ":" in name else []  # "Felony murder: killings…"
    return any(re.search(rf"\b{re.escape(p)}\b", asked, re.I) for p in parts if len(p) > 3)


def named_after(name: str, issues: Sequence[str]) -> bool:
    """Whether ``name`` is one of ``issues`` or named after one: a rule question that names
    "Hearsay" asks about "Hearsay definition" too."""
    return any(named_in(i, name) for i in issues)


def raised(checks: Sequence[Check]) -> bool:
    """Whether the facts raise the issue at all: a stated fact decides some requirement (else guard
    ``not_raised``: it is named, not answered)."""
    return any(map(fact_decides, checks))


def _outcome(checks: Sequence[Check]) -> Met:
    """A requirement that fails -> no; every requirement met -> yes; else unclear."""
    if any(c.met == "no" for c in checks):
        return "no"
    return "yes" if checks and all(c.met == "yes" for c in checks) else "unclear"


_VERDICT = {"yes": "met", "no": "not met", "unclear": "not decided by the facts"}
UNSETTLED_CHECK = "not settled; the stated fact"


def _sources(requirement: str, rule: Sequence[str], cites: list[int]) -> list[int]:
    """The citation of the rule sentence a requirement is (every rule sentence's for a requirement
    that is none of them: a follow-up's checks carried over from an older version's answer)."""
    hits = [n for s, n in zip(rule, cites, strict=True) if _clean(s) == requirement]
    return hits[:1] or list(cites)


def _application_sentences(
    checks: Sequence[Check], rule: Sequence[str], cites: list[int], bar: float = 0.0
) -> list[Sentence]:
    """Per requirement a stated fact bears on, once: its opening words (quoted whole just above),
    met or not when the fact's support reaches ``bar``, and the fact; then one sentence naming
    those no stated fact bears on.  Each cites its rule sentence."""
    out, open_items, seen, open_cites = [], [], set(), set()
    for c in checks:
        requirement = _clean(c.requirement)
        if requirement.lower() in seen:
            continue
        seen.add(requirement.lower())
        fact = _clean(c.fact)
        if fact.lower() in NOT_STATED:
            open_items.append(f'"{_gist(requirement)}"')
            open_cites.update(_sources(requirement, rule, cites))
            continue
        fact += "" if fact.endswith("…") else "."
        verdict = _VERDICT[c.met] if (c.support or 0.0) >= bar else UNSETTLED_CHECK
        text = f'"{_gist(requirement)}" — {verdict}: {fact}'
        out.append(Sentence(text, "application", _sources(requirement, rule, cites)))
    if open_items:
        text = f"No stated fact decides: {'; '.join(open_items)}."
        out.append(Sentence(text, "application", sorted(open_cites)))
    return out


_CONCLUSION = {
    "yes": "every requirement is met on these facts, so the rule applies.",
    "no": 'the rule does not apply: the facts do not meet "{}".',
    "unclear": "the facts stated do not settle whether the rule applies.",
}
"""An issue's conclusion per outcome (:func:`_outcome`); "no" names the requirement the facts fail."""


def _deciding(checks: Sequence[Check], reading: Met) -> list[Check]:
    """The checks a reading rests on: all for "yes"; for "no", the failed one it names."""
    if reading == "yes":
        return list(checks)
    if reading == "no":
        return [c for c in checks if c.met == "no"][:1]
    return []


def reading_support(checks: Sequence[Check], reading: Met) -> float | None:
    """The least support of a check the reading rests on (a requirement "met" by a fact far from
    it is the 1.5B's usual error); None when it rests on none."""
    return min((c.support or 0.0 for c in _deciding(checks, reading)), default=None)


TURNS_ON = 3
"""Requirements named as what decides an issue the research does not settle."""


def turns_on(checks: Sequence[Check], reading: Met) -> list[dict[str, str | None]]:
    """What decides the issue: the requirements the reading rests on with the fact said to decide
    each, then those no stated fact decides (fact None)."""
    deciding = _deciding(checks, reading) or [c for c in checks if fact_decides(c)]
    open_items = [c for c in checks if not fact_decides(c) and c not in deciding]
    pairs = [(_gist(c.requirement), _inner(_clean(c.fact))) for c in deciding]
    pairs += [(_gist(c.requirement), None) for c in open_items]
    return [dict(requirement=r, fact=f) for r, f in dict.fromkeys(pairs)][:TURNS_ON]


GIST_WORDS = 10
"""Words that name a rule sentence already quoted whole (in the application and conclusion)."""


def _inner(text: str) -> str:
    """``text`` to stand inside double quotes: its own double quotes made single ('""Cause"
    means…"' read as an empty quotation)."""
    return re.sub(r'["\u201c\u201d]', "'", text)


def _gist(requirement: str) -> str:
    words = _inner(_clean(requirement)).split()
    return " ".join(words[:GIST_WORDS]) + ("…" if len(words) > GIST_WORDS else "")


def _turns_on_text(items: Sequence[dict[str, str | None]]) -> str:
    """How an unsettled conclusion or bottom line ends: what it turns on, if anything."""
    said = [
        f'"{t["requirement"]}"'
        + (f' (stated: "{t["fact"]}")' if t["fact"] is not None else " (no stated fact)")
        for t in items
    ]
    return f"; it turns on {'; '.join(said)}." if said else "."


def requirements(sentences: Sequence[str]) -> list[str]:
    """What the facts must meet: each quoted rule sentence, whole.  The clauses, exceptions and
    defenses that code once cut from them (15 patterns) gained nothing on either half of the fact
    patterns (docs/MEASUREMENTS.md, "Fact patterns")."""
    return [r for r in map(_clean, sentences) if len(r.split()) >= 2]


LATER_FACT = " (stated later: where it conflicts with an earlier fact, it holds)"
"""How the ``apply`` call sees a follow-up's new facts (they win where the facts conflict)."""


def apply_rule(
    client: Any, issue: str, reqs: Sequence[str], facts: Sequence[str], later: int = 0
) -> list[Check] | None:
    """The ``apply`` call: per requirement, the stated fact that decides it, undecided where the
    reply says nothing (None: unusable reply; one cut off keeps its complete checks).  Facts after
    the first ``later`` (a follow-up's) are marked as stated later, to win a conflict."""
    numbered = "\n".join(f"{n}. {r}" for n, r in enumerate(reqs, 1))
    mark = LATER_FACT if later else ""
    listed = "\n".join(f"F{n}.{mark if n > later else ''} {f}" for n, f in enumerate(facts, 1))
    # a reply cut off at its budget is kept and cached when it holds complete checks (the 1.5B
    # sometimes lists one requirement's facts until its budget runs out: a call each rerun)
    result = prompts.call(
        client,
        "apply",
        accept=lambda text: complete_checks(text) is not None,
        issue=issue,
        rule=numbered,
        facts=listed,
    )
    parsed = result.parsed or complete_checks(result.text)  # cut off now, or when cached
    if parsed is None:
        return None
    # the first finding per requirement; one the reply left out is not decided
    found = {f.n: f for f in reversed(parsed.checks) if 1 <= f.n <= len(reqs)}
    if not found:
        return None
    checks = []
    for n, r in enumerate(reqs, 1):
        fact = _fact_text(found[n].fact, facts) if n in found else NOT_STATED_FACT
        met = "unclear" if fact == NOT_STATED_FACT else found[n].met
        checks.append(Check(requirement=r, fact=fact, met=met))
    return checks


def related_checks(
    checks: Sequence[Check], embed: EmbedFn, keep: bool = False
) -> tuple[list[Check], int]:
    """``checks`` with each decided one whose fact is unrelated to its requirement (below
    :data:`FACT_RELEVANCE`) made undecided unless ``keep``, and how many are unrelated; each other
    decided check names the part of its fact that bears on the requirement (:func:`fact_part`)."""
    judged = [i for i, c in enumerate(checks) if fact_decides(c)]
    out = list(checks)
    rows = _rows(embed, [t for i in judged for t in (checks[i].requirement, checks[i].fact)])
    unrelated = [i for n, i in enumerate(judged) if rows[2 * n] @ rows[2 * n + 1] < FACT_RELEVANCE]
    for i in [] if keep else unrelated:
        out[i] = checks[i].model_copy(update={"fact": NOT_STATED_FACT, "met": "unclear"})
    kept = [(n, i) for n, i in enumerate(judged) if keep or i not in unrelated]
    # Checks often name the same fact sentence: its clauses are embedded once, not per check.
    clause_rows = functools.cache(lambda clauses: _rows(embed, list(clauses)))
    for n, i in kept:
        others = [rows[2 * m] for m, j in kept if j != i]
        rest = np.stack(others) if others else None
        part = fact_part(checks[i].fact, rows[2 * n], lambda t: clause_rows(tuple(t)), rest)
        support = round(float(rows[2 * n] @ rows[2 * n + 1]), 4)
        out[i] = checks[i].model_copy(update={"fact": part, "support": support})
    return out, len(unrelated)


FACT_PART_WORDS = 14
"""A fact sentence this long or shorter is quoted whole in an application sentence."""
_FACT_CLAUSE = re.compile(
    r"([,;:]\s+|\s+(?=(?:and|but|without|because|after|before|while|when|until|so that)\s))"
)
"""Where a fact sentence is cut into clauses; the group keeps the separator, which a clause too
short to stand alone is joined back with ("Lena, a trespasser, climbed ...")."""


def fact_part(
    fact: str, requirement: np.ndarray, embed: EmbedFn, others: np.ndarray | None = None
) -> str:
    """The clause of a long fact sentence closest to a requirement (its row), marked "…" where cut.
    Given ``others`` (the other requirements' rows), a clause scores its cosine to this one less its
    mean cosine to those: a clause that names the parties is close to every requirement."""
    if len(fact.split()) <= FACT_PART_WORDS:
        return fact
    parts = _FACT_CLAUSE.split(fact)  # clause, separator, clause, ...
    pieces: list[str] = []
    for k in range(0, len(parts), 2):
        if pieces and len(parts[k].split()) < 3:  # "and he" is part of the clause before it
            pieces[-1] += parts[k - 1] + parts[k]
        elif parts[k].strip():
            pieces.append(parts[k].strip())
    if len(pieces) < 2:
        return fact
    rows = _rows(embed, pieces)
    score = rows @ requirement
    if others is not None:
        score = score - (rows @ others.T).mean(axis=1)
    best = pieces[int(np.argmax(score))].strip(" ,;.")
    best = re.sub(r"^(?:and|but)\s+", "", best)
    head = "" if fact.startswith(best) else "…"
    tail = "" if fact.rstrip(" .").endswith(best) else "…"
    return f"{head}{best}{tail}"


def _fact_text(ref: int | str, facts: Sequence[str]) -> str:
    """The fact a check names: the numbered fact sentence ("F2", 2), the model's own words, or
    :data:`NOT_STATED_FACT` (0, out of range, or empty)."""
    text = str(ref).strip()
    number = text.upper().removeprefix("F")
    if number.isdigit():
        n = int(number)
        return facts[n - 1] if 1 <= n <= len(facts) else NOT_STATED_FACT
    return text[:120] or NOT_STATED_FACT


def complete_checks(text: str) -> Application | None:
    """The complete checks of an application reply cut off at its token budget (None: none)."""
    from llm_config import json_objects

    checks = []
    for raw in next(json_objects(text, cut_off=True), {}).get("checks") or []:
        try:
            checks.append(Finding.model_validate(raw))
        except ValueError:
            break  # the cut-off one, and nothing after it
    return Application(checks=checks) if checks else None


def verify_rule(
    client: Any, issue: str, pairs: Sequence[Pair]
) -> tuple[list[Pair], list[dict] | None]:
    """The grounding gate: the verified candidate rule sentences, in order, and one quote record per
    sentence; (``[]``, None) for an unusable reply: nothing is verified that was not judged."""
    numbered = "\n".join(
        f'{n}. "{prompts.neutralize(s)}" ({prompts.neutralize(str(d.get("title") or ""))})'
        for n, (d, s) in enumerate(pairs, 1)
    )
    result = prompts.call(client, "verify", issue=issue, quotes=numbered)
    if result.parsed is None:
        return [], None
    # reversed: a sentence judged twice keeps its first verdict
    verdicts = {v.n: v.verdict for v in reversed(result.parsed.verdicts) if 1 <= v.n <= len(pairs)}
    quotes = [
        dict(issue=issue, passage_id=str(d["id"]), text=s, verdict=verdicts.get(n, "not_judged"))
        for n, (d, s) in enumerate(pairs, 1)
    ]
    return [p for n, p in enumerate(pairs, 1) if verdicts.get(n) == "ok"], quotes


def _all_cites(issues: Sequence[IssueAnswer]) -> list[int]:
    return sorted({n for i in issues for s in i.sentences for n in s.cites})


def _finding(n: int, issue: IssueAnswer) -> str:
    """One numbered line of the bottom line's input: the conclusion of the issue's reading and the
    rule it applied (the rule says what follows: "...is strictly liable", "...is admissible")."""
    rule = " ".join(s.text for s in issue.sentences if s.role == "rule")
    return f"{n}. {issue.finding} (Rule: {rule[:400]})"


def _unsettled_line(asked: str, issues: Sequence[IssueAnswer], why: str = "") -> Sentence:
    """A bottom line with no verdict: the question, not settled, and what the issues turn on (those
    the model read as decided first, each group by its rule's fit to the facts), citing them."""
    issues = sorted(issues, key=lambda i: (i.reading not in ("yes", "no"), -(i.fit or 0.0)))
    items = [(t, n) for n, i in enumerate(issues) for t in i.turns_on]
    # A requirement two issues quote is named once, with the fact one of them ties to it (an
    # offer question's bottom line named the offer rule with "no stated fact", then with one).
    tied = {t["requirement"]: (t, n) for t, n in reversed(items) if t["fact"] is not None}
    named = {t["requirement"]: tied.get(t["requirement"], (t, n)) for t, n in items}
    listed = list(named.values())[:TURNS_ON]
    text = f"{asked} Not settled by this research{why}{_turns_on_text([t for t, _ in listed])}"
    return Sentence(text, "bottom_line", _all_cites([issues[n] for n in {n for _, n in listed}]))


Verdict = tuple[Met | None, Met | None, float | None, Sentence]
"""(the verdict shown, the model's reading, the support of the conclusion it rests on, the line)."""


def bottom_line(
    client: Any,
    asked: str,
    applied: Sequence[IssueAnswer],
    fire: Callable[[str], None],
    bar: float = 0.0,
) -> Verdict | None:
    """The answer to the yes-or-no question ``asked`` (None: unparseable reply): the model answers
    from the issues' readings, naming the deciding conclusion, shown when its support reaches
    ``bar`` (else the line says what decides it).  No call if no issue is decided or ``bar`` > 1."""
    decided = [i for i in applied if i.reading in ("yes", "no")]
    if not decided:
        why = ": the stated facts decide none of the issues above"
        return None, "unclear", None, _unsettled_line(asked, applied, why)
    if bar > 1:  # no verdict is shown: the line names what the issues turn on, in their order
        return None, None, None, _unsettled_line(asked, applied)
    findings = "\n".join(_finding(n, i) for n, i in enumerate(decided, 1))
    line = prompts.call(client, "bottom_line", question=asked, findings=findings).parsed
    if line is None:
        return None
    if line.answer == "unclear":
        return None, "unclear", None, _unsettled_line(asked, applied)
    head = line.answer.capitalize()
    if 1 <= line.conclusion <= len(decided):
        rests = [decided[line.conclusion - 1]]
        decisive = next(s for s in rests[0].sentences if s.role == "conclusion")
        said = Sentence(f"{asked} {head}. {decisive.text}", "bottom_line", list(decisive.cites))
    else:
        fire("unnamed_bottom_line")
        rests = decided
        text = f"{asked} {head}, on the conclusions above."
        said = Sentence(text, "bottom_line", _all_cites(rests))
    support = min((i.support or 0.0) for i in rests)
    if support < bar:
        return None, line.answer, support, _unsettled_line(asked, rests)
    return line.answer, line.answer, support, said


def in_short(asked: str, applied: Sequence[IssueAnswer]) -> Sentence:
    """A "which" or "what" question's bottom line: the question, then the issues by conclusion."""
    heads = ("yes", "Applies on these facts"), ("no", "Does not apply"), ("unclear", "Not settled")
    groups = [(h, [i.issue for i in applied if i.outcome == o]) for o, h in heads]
    text = " ".join([asked, *(f"{head}: {'; '.join(names)}." for head, names in groups if names)])
    return Sentence(text, "bottom_line", _all_cites(applied))


@dataclass
class _Stage:
    """One answer's working set: the question, model, embedder, citations so far, guard counts."""

    client: Any
    q: Question
    embed: EmbedFn
    policy: Policy
    bar: float = 0.0
    """VERDICT_SUPPORT: the support a reading needs to be shown as a conclusion or a verdict."""
    guards: dict[str, int] = field(default_factory=dict)
    cited: dict[tuple[str, str], Citation] = field(default_factory=dict)
    """(passage id, sentence) -> its citation."""
    taken: dict[tuple[str, str], str] = field(default_factory=dict)
    """(passage id, sentence) -> the issue it is a rule of (guard ``same_rule``)."""
    quotes: list[dict] = field(default_factory=list)
    earlier: Mapping[str, list[dict]] = field(default_factory=dict)
    """A follow-up's thread: each issue's last application (``IssueAnswer.checks``)."""
    reused: list[str] = field(default_factory=list)
    bearing: set[str] = field(default_factory=set)
    """The issues a follow-up's new facts bear on (:func:`borne_on`): applied anew."""
    named: set[str] = field(default_factory=set)
    """The issues the question names (:func:`named_in`) or the user set (guard ``named_issue``)."""

    def __post_init__(self) -> None:
        evidence = self.policy == "evidence"  # only it has a grounding gate
        self.guards = {g: 0 for g in GUARDS if evidence or g != "unparsed_verdicts"}

    def fire(self, name: str, times: int = 1) -> None:
        """Count guard ``name`` (a row of :data:`GUARDS`) as fired ``times`` more."""
        self.guards[name] += times

    def record(self, issues: list[IssueAnswer], why: str = "", declined: str = "") -> AnswerRecord:
        """The record; one that abstains (``why``) reads "No answer: ``declined`` (``why``)."."""
        text = f"{NO_ANSWER}: {declined} ({why})." if why else ""
        citations = [] if why else list(self.cited.values())
        kept = dict(quotes=self.quotes, guards=self.guards, reused=self.reused)
        return AnswerRecord(self.q.kind, text, issues, citations, bool(why), why, **kept)


Ruled = tuple[int, IssueResearch, list[Pair], float]
"""An issue with a rule: its slot in the answer, its research, its rule, the rule's fit."""


def _issue_rule(stage: _Stage, item: IssueResearch) -> list | IssueAnswer:
    """The (passage, sentence) pairs quoted as ``item``'s rule, or the issue's answer when it has
    none: not researched, no passage on its doctrine (``off_doctrine``), none verified (evidence
    policy), or no sentence beyond the rule already quoted for an earlier issue (``same_rule``)."""
    if not item.researched:
        return IssueAnswer(item.issue, "not_researched", why=item.why)
    scores = doctrine_scores(item.issue, item.docs, stage.embed)
    docs = [d for d, s in zip(item.docs, scores, strict=True) if s >= DOCTRINE_MATCH]
    stage.fire("off_doctrine", len(item.docs) - len(docs))
    # An issue that is one of the user's documents (its title) is answered from that document.
    mine = [d for d in docs if d.get("doc_id") and " ".join(d["title"].split()) == item.issue]
    docs = mine or docs
    opinions = [d for d in docs if d.get("kind") == "opinion"]  # the others tell no case
    stage.fire(
        "case_narrative", len({s for d in opinions for s in case_narrative(d, _sentences(d))})
    )
    if not docs:
        found = "the passages found are about other doctrines" if item.docs else "no passage found"
        return IssueAnswer(item.issue, "no_evidence", why=item.why or found)
    # A rule question gets the rule as the issue's own passage (the one most about its doctrine)
    # states it; a fact pattern, what its passages say closest to issue and facts.
    rule_question = stage.q.kind == "rule_question"
    own = item.docs[int(np.argmax(scores))]
    lead = lead_rule(own, stage.q.text, stage.embed) if rule_question else []
    near = [stage.q.text] if rule_question else item.facts
    if near is None:
        near = issue_facts(item.issue, stage.q.facts, stage.embed)
    query = " ".join([item.issue, *near] if not mine else [stage.q.text])  # a title says nothing
    evidence = stage.policy == "evidence"
    if evidence:
        candidates = lead or select_rule(query, docs, stage.embed, VERIFY_CANDIDATES)
        rule, judged = verify_rule(stage.client, item.issue, candidates)
        stage.fire("unparsed_verdicts", judged is None)
        stage.quotes += judged or []
        rule = rule[: len(lead) or RULE_SENTENCES]
        if not rule:
            why = "no sentence of its passages passed the grounding gate"
            return IssueAnswer(item.issue, "no_evidence", why=why)
    else:
        asked = stage.q.asked if mine and stage.q.facts else ""  # a document's answer to it
        rule = lead or select_rule(query, docs, stage.embed, asked=asked)
    # outside the evidence policy, an issue quotes what else its passages say when they say more
    if rule and all(r in stage.taken for r in _keys(rule)):
        more = [] if evidence else select_rule(query, docs, stage.embed, taken=stage.taken)
        if not more:
            stage.fire("same_rule")
            owners = ", ".join(dict.fromkeys(stage.taken[r] for r in _keys(rule)))
            why = f"its rule is the one already quoted for {owners}"
            return IssueAnswer(item.issue, "no_evidence", why=why)
        rule = more
    stage.taken.update(dict.fromkeys(_keys(rule), item.issue))
    return rule if evidence else _defined(stage, rule)


def _defined(stage: _Stage, rule: list[Pair]) -> list[Pair]:
    """``rule`` with the definition of a term a sentence uses after it, where its document
    defines the term (``nodes._passage_record``: ``definitions``), up to :data:`DEFINITIONS`."""
    out, quoted, added = [], {s for _, s in rule}, 0
    for d, s in rule:
        out.append((d, s))
        for term in d.get("definitions") or []:
            if added >= DEFINITIONS or term["text"] in quoted:
                continue
            if term_used(term["term"], s):
                quoted.add(term["text"])
                added += 1
                source = {"id": term["id"], "title": d.get("title"), "pin": term["pin"]}
                out.append(
                    ({**source, "text": term["text"], "doc_id": d.get("doc_id")}, term["text"])
                )
                stage.fire("defined_term")
    return out


def _keys(rule: Sequence[Pair]) -> list[tuple[str, str]]:
    return [(d["id"], s) for d, s in rule]


def _ruled_issues(
    stage: _Stage, research: Sequence[IssueResearch]
) -> tuple[list[IssueAnswer], list[Ruled]]:
    """Every issue's place in the answer, and those with a rule to apply (their places are filled
    in by :func:`_apply_issues`)."""
    # what an issue's rule must fit: a fact pattern's facts, a rule question's question
    fit_to = {"fact_pattern": list(stage.q.facts), "rule_question": [stage.q.text]}
    fit_rows = _rows(stage.embed, fit_to.get(stage.q.kind, []))
    issues: list[IssueAnswer] = []
    ruled: list[Ruled] = []
    for item in research:
        rule = _issue_rule(stage, item)
        if isinstance(rule, IssueAnswer):
            issues.append(rule)
            continue
        fit = 1.0
        if rule and len(fit_rows):  # its closest sentence's cosine to the closest it must fit
            fit = float((_rows(stage.embed, [s for _, s in rule]) @ fit_rows.T).max())
        ruled.append((len(issues), item, rule, fit))
        issues.append(IssueAnswer(item.issue, "answered"))  # its place, filled in below
    return issues, ruled


def _answered(
    stage: _Stage, issue: str, rule: list, applied: list[Check] | None, cut: bool
) -> IssueAnswer:
    """An issue's answer: its rule sentences, and its application and conclusion when applied."""
    for d, s in rule:  # a sentence is cited once, numbered in the order first quoted
        if (key := (str(d["id"]), s)) not in stage.cited:
            title = str(d.get("title") or "")
            stage.cited[key] = Citation(len(stage.cited) + 1, key[0], title, s, pin_cite(d, s))
    cites = [stage.cited[(str(d["id"]), s)].n for d, s in rule]
    answer = IssueAnswer(issue, "answered")
    answer.sentences = [Sentence(s, "rule", [n]) for (_, s), n in zip(rule, cites, strict=True)]
    if applied is not None:
        answer.checks = [c.model_dump() for c in applied]
        answer.reading = _outcome(applied)
        answer.support = reading_support(applied, answer.reading)
        answer.turns_on = turns_on(applied, answer.reading)
        earned = answer.reading != "unclear" and (answer.support or 0.0) >= stage.bar
        answer.outcome = answer.reading if earned else "unclear"
        answer.sentences += _application_sentences(applied, [s for _, s in rule], cites, stage.bar)
        failed = [_gist(c.requirement) for c in applied if c.met == "no"][:1]
        answer.finding = f"{issue}: {_CONCLUSION[answer.reading].format(*failed)}"
        # where the research does not support the reading, it says what decides it
        unsettled = f"{issue}: not settled by this research{_turns_on_text(answer.turns_on)}"
        said = answer.finding if earned else unsettled
        answer.sentences.append(Sentence(said, "conclusion", list(cites)))
    elif cut:  # a fact pattern's rule cut into requirements, and no usable application
        stage.fire("unparsed_application")
        answer.why = "the application could not be parsed"
    return answer


Applied = tuple[list[Check] | None, bool, int, bool]
"""An issue's application (None: none, or an unusable reply), whether its rule was cut into
requirements, the checks dropped as unrelated, and whether it is the thread's (:func:`_checks`)."""


def _checks(stage: _Stage, issue: str, rule: list) -> Applied:
    """The application of a fact pattern's rule to its facts.  A follow-up's is carried over from
    its thread where the same rule's requirements were applied to the earlier facts and no new fact
    bears on it (:func:`borne_on`)."""
    reqs = [] if stage.q.kind == "rule_question" else requirements([s for _, s in rule])
    if not reqs or not stage.q.facts:  # the rule is quoted, with nothing to apply it to
        return None, False, 0, False
    earlier = stage.earlier.get(issue)
    if issue not in stage.bearing and earlier and {c["requirement"] for c in earlier} == set(reqs):
        return [Check(**c) for c in earlier], True, 0, True
    applied = apply_rule(stage.client, issue, reqs, stage.q.facts, later=len(stage.q.earlier))
    if applied is None:
        return None, True, 0, False
    applied, unrelated = related_checks(applied, stage.embed, keep=issue in stage.named)
    return applied, True, unrelated, False


def _applications(stage: _Stage, todo: Sequence[tuple[str, list]]) -> list[Applied]:
    """The applications of the (issue, rule) pairs ``todo``: at once when the model answers calls
    in parallel (an API's), in turn on the embedded model (one call at a time: threads would only
    queue for it, and a Ctrl-C during one call would let a worker start the next)."""
    if stage.client.is_local("apply") or len(todo) < 2:
        done = [_checks(stage, *pair) for pair in todo]
    else:
        with ContextThreadPoolExecutor(max_workers=len(todo)) as pool:
            done = list(pool.map(lambda pair: _checks(stage, *pair), todo))
    for (issue, _), (*_, unrelated, carried) in zip(todo, done, strict=True):
        stage.fire("named_issue" if issue in stage.named else "unrelated_fact", unrelated)
        stage.reused += [issue] if carried else []
    return done


def borne_on(stage: _Stage, ruled: Sequence[Ruled]) -> set[str]:
    """The issues a follow-up's new facts bear on: per new fact, the issue whose rule it fits best
    and any other it fits at :data:`FACT_FIT`.  Always some issue: one sentence rarely reaches
    FACT_FIT on its own ("The store had put a warning sign next to the puddle" fits an invitee's
    "...duty to inspect and to fix or warn of dangers" at 0.21, comparative negligence at -0.02)."""
    new = list(stage.q.new_facts) if stage.earlier else []
    if not new or not ruled:
        return set()
    rows = _rows(stage.embed, new)
    # per issue (a row), each new fact's fit to its closest rule sentence: one embed per rule
    fits = np.array(
        [(_rows(stage.embed, [s for _, s in rule]) @ rows.T).max(axis=0) for *_, rule, _ in ruled]
    )
    out = {ruled[int(i)][1].issue for i in fits.argmax(axis=0)}
    return out | {r[1].issue for r, row in zip(ruled, fits, strict=True) if row.max() >= FACT_FIT}


def _apply_issues(stage: _Stage, issues: list[IssueAnswer], ruled: Sequence[Ruled]) -> None:
    """Fill in each ruled issue, applied or named as not raised; the planner's first issue, the best
    fit and a named issue are always applied, and so is the first unraised one when no other is."""
    rule_question = stage.q.kind == "rule_question"
    floor, guard = (ASKED_FIT, "not_asked") if rule_question else (FACT_FIT, "off_facts")
    asks = [named_in(item.issue, stage.q.asked) for _, item, *_ in ruled]
    fact_pattern = stage.q.kind == "fact_pattern"
    named = [
        item.chosen or fact_pattern and a for a, (_, item, *_) in zip(asks, ruled, strict=True)
    ]
    # A named issue keeps the facts the model ties to it (guard named_issue's "Dana" trial), new
    # ones too: "Dana had planned to keep the laptop" reads nearer work product's "tangible things".
    stage.named = {item.issue for (_, item, *_), name in zip(ruled, named, strict=True) if name}
    # with no new fact (a thread's question again, on issues the user names), the earlier
    # application of an issue the thread researched stands
    stage.bearing = borne_on(stage, ruled) | (stage.named if stage.q.new_facts else set())
    if rule_question and any(asks):  # answered on the issues it names ("res ipsa" had defamation)
        said = [item.issue for a, (_, item, *_) in zip(asks, ruled, strict=True) if a]
        low_fit = [not named_after(item.issue, said) for _, item, *_ in ruled]
    else:
        # The best fit is applied, unless what is asked names an issue: "What is the mailbox
        # rule?" had time, place and manner restrictions beside it (fit 0.30 to its own 0.30).
        low = floor if any(asks) else min(floor, max((fit for *_, fit in ruled), default=1.0))
        low_fit = [n > 0 and fit < low for n, (*_, fit) in enumerate(ruled)]
    unfit = [far and not name for far, name in zip(low_fit, named, strict=True)]
    todo = [(r[1].issue, r[2]) for r, out in zip(ruled, unfit, strict=True) if not out]
    applications = iter(_applications(stage, todo))
    held = None  # the first issue not raised, answered after all if no other issue is
    for n, (slot, item, rule, fit) in enumerate(ruled):
        stage.fire("named_issue", named[n] and low_fit[n])  # applied though unfit
        if unfit[n]:
            stage.fire(guard)
            what = "what the question asks" if rule_question else "the stated facts"
            why = (
                f"its rule does not fit {what} (cosine {fit:.2f} < {floor})"
                if fit < floor
                else "the question names other issues"
            )
            issues[slot] = IssueAnswer(item.issue, "not_raised", why=why)
            continue
        applied, cut, *_ = next(applications)
        unraised = applied is not None and not raised(applied)
        stage.fire("named_issue", unraised and named[n] and not low_fit[n])
        if unraised and not named[n]:
            stage.fire("not_raised")
            issues[slot] = IssueAnswer(item.issue, "not_raised", why="no stated fact bears on it")
            held = held or (slot, item.issue, rule, applied)
            continue
        issues[slot] = _answered(stage, item.issue, rule, applied, cut)
    if held and not any(i.status == "answered" for i in issues):
        # The research found the rule: the application's finding that no stated fact bears on it
        # is the model's, and a question the corpus answers is not declined on it.
        stage.fire("not_raised", -1)
        slot, *rest = held
        issues[slot] = _answered(stage, *rest, True)
    for slot, *_, fit in ruled:
        issues[slot].fit = fit


def _unanswerable(stage: _Stage, issues: list[IssueAnswer]) -> str:
    """Why the answer abstains ("" when it does not): no issue found a rule, or none of its rules
    is near the question (``off_question``); the answered issues are then marked as such."""
    answered = [i for i in issues if i.status == "answered"]
    if not answered:
        why = "; ".join(f"{i.issue} ({i.why or i.status})" for i in issues)
        return f"no issue's research found a rule on its doctrine: {why}"
    rules = [s.text for i in answered for s in i.sentences if s.role == "rule"]
    closest = 1.0
    if rules and not stage.q.choices:
        closest = float(cosines(stage.embed, stage.q.text, rules).max())
    if closest >= QUESTION_FIT:
        return ""
    stage.fire("off_question")
    titles = {c.n: c.title or c.passage_id for c in stage.cited.values()}
    cited = [(i, dict.fromkeys(titles[n] for s in i.sentences for n in s.cites)) for i in answered]
    found = "; ".join(f"{', '.join(t)} (for {i.issue})" for i, t in cited)
    for n, i in enumerate(issues):
        if i.status == "answered":
            issues[n] = IssueAnswer(i.issue, "no_evidence", why="its rule is about another matter")
    closest_at = f"closest cosine to the question {closest:.3f} < {QUESTION_FIT:.2f}"
    return f"the rules its research found are about other matters: {found}; {closest_at}"


def _tail(stage: _Stage, applied: Sequence[IssueAnswer]) -> tuple[Verdict | None, list[Sentence]]:
    """A fact pattern's bottom line: a yes/no question's from the model (:func:`bottom_line`), a
    "Which rights were violated, and what must she show?" one the issues by conclusion."""
    if stage.q.kind != "fact_pattern" or not applied:
        return None, []
    if not stage.q.yes_no:
        return None, [in_short(stage.q.asked, applied)]
    decided = bottom_line(stage.client, stage.q.asked, applied, stage.fire, stage.bar)
    stage.fire("unparsed_bottom_line", decided is None)
    return decided, [decided[-1]] if decided else []


NO_ANSWER = "No answer"


def build_record(
    client: Any,
    question: Question,
    research: Sequence[IssueResearch],
    embed: EmbedFn,
    *,
    decline: str = "",
    policy: Policy = "research",
    verdict_support: float = 0.0,
    earlier: Mapping[str, list[dict]] | None = None,
) -> AnswerRecord:
    """The answer to ``question`` from each issue's research.  ``decline``: why the research
    declines the question as asked (the record abstains, no model call).  ``verdict_support``: the
    support a reading needs to be shown (above 1: none is).  ``earlier``: a follow-up's thread,
    each issue's application in its last answer (:func:`_checks`)."""
    stage = _Stage(client, question, embed, policy, verdict_support, earlier=earlier or {})
    if decline:
        return stage.record([], decline, "the sources do not cover this question as asked")
    issues, ruled = _ruled_issues(stage, research)
    _apply_issues(stage, issues, ruled)
    if why := _unanswerable(stage, issues):
        found = "the research found nothing in the sources that answers this question"
        return stage.record(issues, why, found)
    applied = [i for i in issues if i.status == "answered" and i.outcome is not None]
    decided, tail = _tail(stage, applied)
    record = stage.record(issues)
    if decided:
        record.verdict, record.reading, record.support = decided[:3]
    record.grounded = all(s.cites for s in record.sentences) and all(s.cites for s in tail)
    record.text = render(record, tail)
    if tail:
        record.issues.append(IssueAnswer("Bottom line", "answered", tail, outcome=record.verdict))
    return record


def _refs(cites: Sequence[int]) -> str:
    return "".join(f"[{n}]" for n in cites)


def render(record: AnswerRecord, tail: Sequence[Sentence] = ()) -> str:
    """The answer as the CLI prints it: per issue its cited rule, application and conclusion; then
    the bottom line; then what was not answered."""
    lines: list[str] = []
    for n, issue in enumerate((i for i in record.issues if i.status == "answered"), 1):
        lines.append(f"{n}. {issue.issue}")
        for s in issue.sentences:
            lines.append(f"   {s.role.capitalize()}: {s.text} {_refs(s.cites)}".rstrip())
        if issue.why:
            lines.append(f"   ({issue.why})")
    lines += [f"\nBottom line: {s.text} {_refs(s.cites)}".rstrip() for s in tail]
    # an issue set aside is not listed as not raised where the answer quotes a source on its
    # doctrine ("no stated fact raises" FRE 609 under its rule applied to a perjury conviction)
    quoted = record.quoted_doctrines
    set_aside = [i.issue for i in record.issues if i.status == "not_raised"]
    unraised = [i for i in set_aside if mc.doctrine_key(i) not in quoted]
    if unraised:
        rule_question = record.kind == "rule_question"
        why = "not what the question asks" if rule_question else "no stated fact raises it"
        lines.append(f"\nConsidered, but {why}: {'; '.join(unraised).rstrip('.')}.")
    missing = [i for i in record.issues if i.status not in ("answered", "not_raised")]
    if missing:
        said = "; ".join(f"{i.issue} ({i.why or i.status.replace('_', ' ')})" for i in missing)
        lines.append(f"\nNot answered: {said}.")
    return "\n".join(lines).strip()


def render_sources(citations: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per citation (``AnswerRecord.to_dict()["citations"]``): its number, pin cite or
    title, passage id, and the sentence it rests on."""
    return [
        f"[{c['n']}] {c.get('pin') or c['title'] or '(untitled)'} ({c['passage_id']}): "
        f'"{c["support"]}"'
        for c in citations
    ]
