"""Evidence-first answering: an answer made only of verified verbatim quotes, or an abstention.

The stages form a LangGraph subgraph (:func:`build_evidence_graph`)::

    apply_retrieval_floor → extract_quotes → verify_quotes → compose_answer → review_answer ─┬→ finalize
            │                     │                │                             ↑           │
            └──────── abstain ←───┴────────────────┘                  revise_answer ←────────┘ (≤ 2)

1. **apply_retrieval_floor** — passages whose cosine to the question (``dense_score``) is below the
   floor (``EVIDENCE_FLOOR``, calibrated for all-MiniLM-L6-v2 by ``benchmarks/bench_evidence.py
   floor``) and passages flagged as holding instructions (``injection_flags``) never reach the model.
2. **extract_quotes** — each passage is split into sentences *in code* and shown with numbers; the
   model returns sentence numbers only, and the quote text is cut from the passage by code, so a
   quote is verbatim by construction: one to three consecutive whole sentences, 10–60 words (one
   whole sentence may be longer, up to :data:`MAX_SENTENCE_WORDS`: cutting it would break both
   "whole" and "verbatim").  A reply that carries text instead of numbers is checked against the
   passages and rejected as ``not_verbatim`` unless it occurs in one (then it is snapped to the whole
   sentences holding it).
3. **verify_quotes** — the grounding gate: each quote gets one verdict, ``ok`` or the first failed
   criterion (``does_not_address_question``, ``requires_inference``, ``incomplete_quote``); quotes
   are judged in batches.  A quote the gate did not judge is not verified (``not_judged``).
4. **compose_answer** — the model writes short claims, each naming the verified quotes that state
   it; code drops unknown IDs, merges identical or near-identical claims, shows conflicting quotes
   side by side and renders every sentence with its citations (``[Q2]``, ``[Q2, Q5]``).  When the
   model's reply is unusable the answer is the verified quotes themselves (extractive).
5. **review_answer** — programmatic checks per sentence (it cites IDs, every ID is verified, it shares
   at least :data:`MIN_SUPPORT_OVERLAP` of its content words with its quotes) plus one LLM check for
   claims beyond the quotes give a quality score 0–10; below :data:`QUALITY_THRESHOLD` the answer is
   revised (**revise_answer**: composed again with the problems as feedback), at most
   :data:`MAX_REVISIONS` times.
6. **finalize** — sentences that fail the programmatic checks or stay flagged by the LLM check are
   dropped (the extractive answer replaces an answer left empty), and the result keeps the last
   review's score.
7. **abstain** — nothing above the floor, nothing extracted or nothing verified: the answer is
   :data:`ABSTAIN_TEXT` followed by what is missing and the rejection reasons; ``grounded`` is false
   (for a multiple-choice question the caller still picks a letter).

Call budget (all constants below; :func:`max_llm_calls` computes it and a test holds it):
extraction ⌈:data:`MAX_PASSAGES` / (:data:`EXTRACT_BATCH_CHARS` // :data:`PASSAGE_CHARS`)⌉ = 2,
verification ⌈:data:`MAX_QUOTES` / :data:`VERIFY_BATCH`⌉ = 2, composition 1, review 1, revisions
:data:`MAX_REVISIONS` × (compose 1 + review 1) = 4: **at most 10 LLM calls**.  A typical answer takes
4 (one extraction batch, one gate batch, compose, review); an abstention 0–4.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypedDict

from pydantic import BaseModel, Field

import prompts
from llm_config import LLMCallError, LLMClient
from mc import near_duplicate
from settings import Settings

logger = logging.getLogger(__name__)

ABSTAIN_TEXT = "No authoritative rule found in the provided sources."

MIN_QUOTE_WORDS = 10
MAX_QUOTE_WORDS = 60
MAX_SENTENCE_WORDS = 120
"""A single sentence longer than MAX_QUOTE_WORDS is still quotable whole up to this length (the
elements of negligence are one 85-word sentence in the starter corpus)."""
MAX_QUOTE_SENTENCES = 3
HEADING_WORDS = 6
"""A passage's first sentence shorter than this is a heading (its title), never quoted."""
MAX_PASSAGES = 6
"""Passages above the floor that reach extraction (the best by rerank score, then cosine)."""
PASSAGE_CHARS = 1200
"""Characters of whole sentences offered per passage (a passage's first sentences)."""
EXTRACT_BATCH_CHARS = 3600
"""Sentence characters per extraction call: passages are packed whole, so 3 per call."""
MAX_QUOTES = 12
MAX_QUOTES_PER_PASSAGE = 3
VERIFY_BATCH = 6
"""Quotes judged per gate call (each ≤ ~60 words: ~600 prompt tokens of quotes per call)."""
MAX_REVISIONS = 2
QUALITY_THRESHOLD = 7.0
MIN_SUPPORT_OVERLAP = 0.5
"""Share of a sentence's content words that must occur in the quotes it cites."""
OVERRULE_OVERLAP = 0.9
"""An LLM "unsupported" flag on a sentence that shares at least this share of its content words
with one sentence of its quotes, and keeps every negation of that sentence, is overruled and
recorded: the embedded 1.5B model flagged every claim of near-verbatim answers, which wasted two
revisions and had finalize drop correct sentences."""
MIN_SENTENCE_WORDS = 4
"""A rendered sentence shorter than this (a heading the composer copied) is left out when its
claim has other sentences."""
EXTRACTIVE_QUOTES = 5
"""Verified quotes an extractive answer (the fallback) shows."""

MAX_TOKENS = {"extract": 60, "verify": 200, "compose": 400, "review": 50}
"""Reply budgets (the embedded 1.5B model writes ~10–15 tokens/s on 2 cores): six verdicts of ~25
tokens; up to six claims of ~30 words; a cut-off composition keeps its complete points."""
ROLES = {
    "extract": "evidence_extract",
    "verify": "evidence_verify",
    "compose": "evidence_compose",
    "review": "evidence_review",
}

REJECTION_REASONS = ("does_not_address_question", "requires_inference", "incomplete_quote")
SOURCE_TYPES = ("statute/rule", "caselaw", "study material")


def max_llm_calls() -> int:
    """The worst-case number of LLM calls of one evidence answer (see the module docstring)."""
    per_batch = max(1, EXTRACT_BATCH_CHARS // PASSAGE_CHARS)
    extract = math.ceil(MAX_PASSAGES / per_batch)
    verify = math.ceil(MAX_QUOTES / VERIFY_BATCH)
    return extract + verify + 1 + 1 + MAX_REVISIONS * 2


# ------------------------------------------------------------------------------------------------
# Structured outputs (kept tiny: the embedded 1.5B model fills them under a JSON-schema grammar)
# ------------------------------------------------------------------------------------------------


class SentencePicks(BaseModel):
    """Extraction: the numbers of the sentences worth quoting (nothing else)."""

    sentences: list[int] = Field(default_factory=list, max_length=12)


class QuoteVerdict(BaseModel):
    id: str | int
    verdict: Literal["ok", "does_not_address_question", "requires_inference", "incomplete_quote"]


class GateVerdicts(BaseModel):
    """The grounding gate: one verdict per quote of the batch."""

    verdicts: list[QuoteVerdict] = Field(default_factory=list, max_length=VERIFY_BATCH)


class ComposedPoint(BaseModel):
    claim: str = Field(min_length=1)
    quotes: list[str | int] = Field(min_length=1, max_length=4)
    """Quote IDs ("Q2"; a bare 2 is read as Q2)."""


class Composition(BaseModel):
    """The answer as short claims, each naming the quote IDs that state it."""

    points: list[ComposedPoint] = Field(default_factory=list, max_length=8)
    conflicts: list[list[str | int]] = Field(default_factory=list, max_length=3)


class ClaimReview(BaseModel):
    """The LLM half of the review: numbers of claims that say more than their quotes."""

    unsupported: list[int] = Field(default_factory=list, max_length=8)


# ------------------------------------------------------------------------------------------------
# Text helpers: sentences, words, citations
# ------------------------------------------------------------------------------------------------


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_ABBREVIATIONS = _word_set(
    """
    v vs e.g i.e cf al u.s u.s.c inc co corp ltd llc mr mrs ms dr st fed civ crim evid app ct
    cir supp stat ann rev jr sr amend const approx dept gov univ assn bros n.y n.j cal ill mass
    tex fla wash mich
    """
)
_NUMBER_ABBREVIATIONS = _word_set("no nos art sec secs p pp ch cl para r id")
"""Abbreviations only before a number ("No. 5", "Art. III"); elsewhere "no." ends a sentence."""
_BOUNDARY = re.compile(r"[.!?][\"'\u201d\u2019)\]]*(?=\s|$)")
_TOKEN = re.compile(r"[a-z0-9]+")
_CITE = re.compile(r"\[\s*(Q\d+(?:\s*,\s*Q\d+)*)\s*\]")
_QID = re.compile(r"Q?\s*(\d+)", re.IGNORECASE)

STOPWORDS = _word_set(
    """
    a an the of to in on for and or but with by from at as is are was were be been
    being it its this that these those there their they them he she his her him we our you your
    i if then than so such which who whom whose what when where why how any all each
    every some may must can could would should shall will do does did has have had also only
    even more most other into onto upon about over under after before between through during
    while because whether same very just own both either neither per one two three
    """
)


# Negations (not, no, nor, never, without, unless) are deliberately content words: "is not
# effective" must not count as supported by a quote saying "is effective".


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of ``text``, so every sentence is an exact slice.

    A boundary is . ! or ? (plus closing quotes/brackets) followed by whitespace and then an
    upper-case letter, a digit, a quote or a bracket; a period after a known abbreviation ("v.",
    "U.S.", "Fed.") or a single letter (an initial) is not one."""
    spans: list[tuple[int, int]] = []
    start = 0
    n = len(text)
    for m in _BOUNDARY.finditer(text):
        end = m.end()
        rest = text[end:].lstrip()
        if rest and not (rest[0].isupper() or rest[0].isdigit() or rest[0] in "\"'“‘(["):
            continue
        if text[m.start()] == ".":
            before = re.search(r"([A-Za-z][A-Za-z.]*)$", text[start : m.start()])
            raw = before.group(1).rstrip(".") if before else ""
            word = raw.lower()
            before_number = bool(rest) and (rest[0].isdigit() or re.match(r"[IVXL]+\b", rest))
            if (
                word in _ABBREVIATIONS
                or (word in _NUMBER_ABBREVIATIONS and before_number)
                or (len(raw) == 1 and raw.isupper() and rest)
            ):
                continue
        while start < end and text[start].isspace():
            start += 1
        if start < end:
            spans.append((start, end))
        start = end
    while start < n and text[start].isspace():
        start += 1
    if start < n:
        spans.append((start, n))
    return spans


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` (exact slices, see :func:`sentence_spans`)."""
    return [text[a:b] for a, b in sentence_spans(text)]


def word_count(text: str) -> int:
    return len(text.split())


def content_words(text: str) -> set[str]:
    """Lower-case content-word stems (first 6 letters: "negligence"/"negligent" match)."""
    return {
        w[:6] for w in _TOKEN.findall((text or "").lower()) if w not in STOPWORDS and len(w) > 2
    }


NEGATIONS = frozenset({"not", "no", "nor", "never", "without", "unless", "cannot", "none"})


def _negations(text: str) -> set[str]:
    return set(_TOKEN.findall(text.lower().replace("n't", " not"))) & NEGATIONS


def cited_ids(sentence: str) -> list[str]:
    """Quote IDs cited in ``sentence`` (``[Q2]``, ``[Q2, Q5]``), in order, without repeats."""
    ids: list[str] = []
    for m in _CITE.finditer(sentence):
        ids.extend(p.strip() for p in m.group(1).split(","))
    return list(dict.fromkeys(ids))


def strip_citations(sentence: str) -> str:
    return " ".join(_CITE.sub(" ", sentence).split())


def normalize_qid(value: Any) -> str | None:
    """ "Q3", "q3", "3", 3 -> "Q3"; anything else None."""
    m = _QID.fullmatch(str(value).strip())
    return f"Q{int(m.group(1))}" if m else None


def source_type(passage: Mapping[str, Any]) -> str:
    """statute/rule, caselaw or study material, from the passage's id prefix and source name."""
    pid = str(passage.get("id") or passage.get("idx") or "").lower()
    src = str(passage.get("source") or "").lower()
    if pid.startswith(("caselaw", "holding")) or "caselaw" in src or "holding" in src:
        return "caselaw"
    statute_prefixes = ("fre", "frcp", "frcmp", "usc", "const", "ucc", "cfr", "statute", "rule_")
    if (
        pid.startswith(statute_prefixes)
        or "federal rules" in src
        or "u.s.c" in src
        or "constitution" in src
        or src.endswith(":ucc")
        or src.endswith(":fre")
    ):
        return "statute/rule"
    return "study material"


def _flags(passage: Mapping[str, Any]) -> list[str]:
    raw = passage.get("injection_flags")
    if not raw:
        return []
    if isinstance(raw, str):
        return [f.strip() for f in raw.split(",") if f.strip()]
    return [str(f) for f in raw if str(f).strip()]


def _short(text: str, words: int = 25) -> str:
    """At most ``words`` whole words of ``text`` (never cut mid-word)."""
    parts = " ".join(str(text).split()).split(" ")
    return " ".join(parts) if len(parts) <= words else " ".join(parts[:words]) + " …"


# ------------------------------------------------------------------------------------------------
# State, context, stage bookkeeping
# ------------------------------------------------------------------------------------------------


def merge_audit(left: dict | None, right: dict | None) -> dict:
    """Reducer: each node adds its own stage sections; a section named again is updated."""
    out = dict(left or {})
    for key, value in (right or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


class EvidenceState(TypedDict, total=False):
    question: str
    choices: dict[str, str] | None
    candidates: list[dict]
    """The input passages: {id, title, source, text, dense_score, rerank_score, injection_flags}."""
    floor: float
    declined: str | None
    """Why the research declined the (open) question; then no passage reaches extraction."""
    kept: list[dict]
    """Passages that reach extraction, best first."""
    quotes: list[dict]
    draft: dict
    """{"sentences": [{"text", "ids"}], "method": "model" | "extractive", ...}."""
    review: dict
    revisions: int
    audit: Annotated[dict, merge_audit]
    result: dict


@dataclass
class EvidenceContext:
    """What the stages use: the LLM client (anything with ``invoke`` and ``records`` like
    :class:`llm_config.LLMClient`).  The research graph's context also has ``client``, so the
    subgraph runs under it unchanged."""

    client: Any = None


def _client(runtime: Any) -> Any:
    ctx = getattr(runtime, "context", None)
    client = getattr(ctx, "client", None)
    if client is None:  # a run without a context (LangGraph Studio): the environment's settings
        client = LLMClient(Settings.from_env())
        if ctx is not None:
            with contextlib.suppress(AttributeError):  # a frozen context: use it for this call
                ctx.client = client
    return client


def _n_records(client: Any) -> int:
    try:
        return len(client.records)
    except (AttributeError, TypeError):
        return 0


def _stage(name: str) -> Callable:
    """Wrap a node ``fn(state, client) -> update`` with its LLM calls and seconds in the audit
    trail (summed over visits: review_answer runs once per draft)."""

    def wrap(fn: Callable[[EvidenceState, Any], dict]) -> Callable:
        def node(state: EvidenceState, runtime: Any = None) -> dict:
            client = _client(runtime)
            before, t0 = _n_records(client), time.perf_counter()
            update = fn(state, client)
            prev = ((state.get("audit") or {}).get("stages") or {}).get(name) or {}
            stage = {
                "visits": prev.get("visits", 0) + 1,
                "llm_calls": prev.get("llm_calls", 0) + _n_records(client) - before,
                "seconds": round(prev.get("seconds", 0.0) + time.perf_counter() - t0, 3),
            }
            audit = merge_audit(update.get("audit"), {"stages": {name: stage}})
            return {**update, "audit": audit}

        node.__name__ = name
        node.__doc__ = fn.__doc__
        return node

    return wrap


def _invoke(client: Any, messages: list, stage: str, schema: type[BaseModel]) -> Any:
    """One LLM call; a transport failure (after the client's retries) counts as an unusable reply,
    so every stage has its fail-safe path instead of an exception."""

    try:
        return client.invoke(
            messages, role=ROLES[stage], schema=schema, max_tokens=MAX_TOKENS[stage]
        )
    except LLMCallError as exc:
        logger.warning("evidence %s: LLM call failed: %s", stage, exc)
        return None


# ------------------------------------------------------------------------------------------------
# Stage 1: the retrieval floor
# ------------------------------------------------------------------------------------------------


def _score(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


@_stage("apply_retrieval_floor")
def apply_retrieval_floor(state: EvidenceState, client: Any) -> dict:
    """Passages at or above the floor, unflagged, best first, at most MAX_PASSAGES; none when the
    research declined the question (``declined``)."""
    floor = float(state.get("floor", 0.0))
    candidates = [
        dict(p) for p in state.get("candidates") or [] if str(p.get("text") or "").strip()
    ]
    by_type = Counter(source_type(p) for p in candidates)
    below, flagged, unscored, kept = [], [], 0, []
    for p in candidates:
        p["id"] = str(p.get("id") or p.get("idx") or "")
        p["source_type"] = source_type(p)
        score = _score(p.get("dense_score"))
        if score is None:
            unscored += 1  # nothing to judge it by: it goes on, the gate still judges its quotes
        elif score < floor:
            below.append(p)
            continue
        if _flags(p):
            flagged.append(p)
            continue
        kept.append(p)
    kept.sort(
        key=lambda p: (
            -(_score(p.get("rerank_score")) if _score(p.get("rerank_score")) is not None else -1e9),
            -(_score(p.get("dense_score")) or 0.0),
        )
    )
    declined = state.get("declined")
    if declined:
        kept = []
    over = kept[MAX_PASSAGES:]
    kept = kept[:MAX_PASSAGES]
    scores = [s for s in (_score(p.get("dense_score")) for p in candidates) if s is not None]
    audit = {
        "floor": round(floor, 4),
        "passages": {
            "received": len(candidates),
            "by_source_type": {t: by_type.get(t, 0) for t in SOURCE_TYPES},
            "below_floor": len(below),
            "best_score": round(max(scores), 4) if scores else None,
            "flagged": len(flagged),
            "flagged_ids": [p["id"] for p in flagged],
            "unscored": unscored,
            "over_cap": len(over),
            "declined_by_research": declined or None,
            "to_extraction": len(kept),
            "to_extraction_by_source_type": {
                t: sum(p["source_type"] == t for p in kept) for t in SOURCE_TYPES
            },
        },
    }
    return {"kept": kept, "audit": audit}


# ------------------------------------------------------------------------------------------------
# Stage 2: extraction (sentence numbers in, verbatim quotes out)
# ------------------------------------------------------------------------------------------------


def offered_sentences(text: str, max_chars: int = PASSAGE_CHARS) -> list[tuple[int, int]]:
    """The spans of ``text`` offered for quoting: its sentences in order while they total at most
    ``max_chars`` characters (so the call budget holds), skipping sentences too long to quote, a
    first sentence that is a heading, and a last fragment without closing punctuation (a truncated
    passage)."""
    spans = sentence_spans(text)
    if spans and not re.search(r"[.!?][\"'\u201d\u2019)\]]*$", text[spans[-1][0] : spans[-1][1]]):
        spans = spans[:-1]
    out, total = [], 0
    for k, (a, b) in enumerate(spans):
        n = word_count(text[a:b])
        if n > MAX_SENTENCE_WORDS or (k == 0 and len(spans) > 1 and n < HEADING_WORDS):
            continue  # too long to quote, or a heading ("Negligence: the elements.")
        if total + (b - a) > max_chars:
            break
        out.append((a, b))
        total += b - a
    return out


def _batches(passages: list[dict], spans: dict[str, list[tuple[int, int]]]) -> list[list[dict]]:
    """Passages packed whole into extraction calls of at most EXTRACT_BATCH_CHARS sentence
    characters (each passage offers at most PASSAGE_CHARS, so each call holds several)."""
    batches: list[list[dict]] = []
    size = 0
    for p in passages:
        n = sum(b - a for a, b in spans[p["id"]])
        if not n:
            continue
        if batches and size + n <= EXTRACT_BATCH_CHARS:
            batches[-1].append(p)
            size += n
        else:
            batches.append([p])
            size = n
    return batches


def _numbered(batch: list[dict], spans: dict[str, list[tuple[int, int]]]) -> tuple[str, list]:
    """The batch's passages with globally numbered sentences, and number -> (passage, index)."""
    blocks, index = [], []
    for k, p in enumerate(batch, 1):
        lines = [f'<passage n="{k}">', prompts.neutralize(str(p.get("title") or "")).strip()]
        for i, (a, b) in enumerate(spans[p["id"]]):
            index.append((p, i))
            sentence = " ".join(prompts.neutralize(p["text"][a:b]).split())
            lines.append(f"[{len(index)}] {sentence}")
        lines.append("</passage>")
        blocks.append("\n".join(line for line in lines if line))
    return "\n".join(blocks), index


def _runs(numbers: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return runs


def _fit(idxs: list[int], spans: list[tuple[int, int]], text: str) -> list[list[int]]:
    """Quotes (lists of sentence indexes) from one picked run of consecutive sentences: at most
    MAX_QUOTE_SENTENCES and MAX_QUOTE_WORDS each (a lone sentence up to MAX_SENTENCE_WORDS); a
    quote under MIN_QUOTE_WORDS takes in the next (else the previous) sentence when that fits."""

    def words(ix: list[int]) -> int:
        return word_count(text[spans[ix[0]][0] : spans[ix[-1]][1]])

    groups: list[list[int]] = []
    for i in idxs:
        if (
            groups
            and len(groups[-1]) < MAX_QUOTE_SENTENCES
            and words([*groups[-1], i]) <= MAX_QUOTE_WORDS
        ):
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for g in groups:
        if words(g) < MIN_QUOTE_WORDS:
            for extra in ([*g, g[-1] + 1], [g[0] - 1, *g]):
                if (
                    extra[0] >= 0
                    and extra[-1] < len(spans)
                    and len(extra) <= MAX_QUOTE_SENTENCES
                    and words(extra) <= MAX_QUOTE_WORDS
                ):
                    g = extra
                    break
        out.append(g)
    return out


def _snap_text(fragment: str, passages: list[dict], spans: dict) -> tuple[dict, list[int]] | None:
    """The passage and whole-sentence indexes holding ``fragment`` verbatim (whitespace-insensitive),
    or None: the programmatic verbatim check of a reply that returned text."""
    needle = " ".join(fragment.split())
    if word_count(needle) < 3:
        return None
    for p in passages:
        text = p["text"]
        flat, pos = [], []
        for i, ch in enumerate(text):  # map the whitespace-collapsed text back to offsets
            if ch.isspace():
                if flat and flat[-1] != " ":
                    flat.append(" ")
                    pos.append(i)
            else:
                flat.append(ch)
                pos.append(i)
        hay = "".join(flat)
        at = hay.find(needle)
        if at < 0:
            continue
        a, b = pos[at], pos[at + len(needle) - 1] + 1
        idxs = [i for i, (s, e) in enumerate(spans[p["id"]]) if s < b and e > a]
        if idxs:
            return p, idxs
    return None


_INT = re.compile(r"-?\d+")
_STRING = re.compile(r'"((?:[^"\\]|\\.){12,})"')


def _picks(result: Any) -> tuple[list[int], list[str], bool]:
    """Sentence numbers and any text strings of an extraction reply; parse failure flag."""
    if result is None:
        return [], [], True
    if result.parsed is not None:
        return list(result.parsed.sentences), [], False
    text = result.text or ""
    strings = [s for s in _STRING.findall(text) if not s.strip().startswith(("sentences",))]
    body = _STRING.sub(" ", text)
    numbers = [int(n) for n in _INT.findall(body)]
    return numbers, strings, True


@_stage("extract_quotes")
def extract_quotes(state: EvidenceState, client: Any) -> dict:
    """Numbered sentences per batch of passages -> the model's sentence numbers -> quotes cut from
    the passages by code (IDs Q1, Q2, … in passage and sentence order)."""
    question = state["question"]
    kept = state.get("kept") or []
    spans = {p["id"]: offered_sentences(p["text"]) for p in kept}
    counts = Counter()
    not_verbatim_examples: list[str] = []
    picked: list[tuple[dict, list[int], str]] = []  # (passage, sentence indexes, how)
    batches = _batches(kept, spans)
    for batch in batches:
        numbered, index = _numbered(batch, spans)
        counts["sentences_offered"] += len(index)
        result = _invoke(
            client,
            prompts.render(
                "extract_quotes", question=prompts.quote("question", question), passages=numbered
            ),
            "extract",
            SentencePicks,
        )
        numbers, strings, failed = _picks(result)
        counts["parse_failures"] += failed
        for s in strings:
            snapped = _snap_text(s, batch, spans)
            if snapped is None:
                counts["not_verbatim"] += 1
                if len(not_verbatim_examples) < 3:
                    not_verbatim_examples.append(_short(s, 20))
            else:
                picked.append((snapped[0], snapped[1], "text"))
        by_passage: dict[str, list[int]] = {}
        for n in numbers:
            if 1 <= n <= len(index):
                p, i = index[n - 1]
                by_passage.setdefault(p["id"], []).append(i)
            else:
                counts["invalid_numbers"] += 1
        counts["sentences_picked"] += sum(1 <= n <= len(index) for n in numbers)
        for p in batch:
            for run in _runs(by_passage.get(p["id"], [])):
                picked.append((p, run, "numbers"))

    quotes: list[dict] = []
    seen: dict[tuple[str, int, int], int] = {}
    per_passage: Counter = Counter()
    order = {p["id"]: k for k, p in enumerate(kept)}
    picked.sort(key=lambda x: (order.get(x[0]["id"], 0), x[1][0]))
    for p, idxs, _how in picked:
        sp = spans[p["id"]]
        for g in _fit(idxs, sp, p["text"]):
            a, b = sp[g[0]][0], sp[g[-1]][1]
            text = p["text"][a:b]
            n = word_count(text)
            if n < MIN_QUOTE_WORDS:
                counts["too_short"] += 1
                continue
            if n > (MAX_SENTENCE_WORDS if len(g) == 1 else MAX_QUOTE_WORDS):
                counts["too_long"] += 1
                continue
            key = (p["id"], a, b)
            overlapping = any(pid == p["id"] and s < b and e > a for (pid, s, e) in seen)
            if key in seen or overlapping:
                counts["duplicates"] += 1
                continue
            if per_passage[p["id"]] >= MAX_QUOTES_PER_PASSAGE or len(quotes) >= MAX_QUOTES:
                counts["over_cap"] += 1
                continue
            seen[key] = len(quotes)
            per_passage[p["id"]] += 1
            quotes.append(_quote(len(quotes) + 1, p, text, question))
    audit = {
        "extraction": {
            "calls": len(batches),
            **{
                k: counts.get(k, 0)
                for k in (
                    "sentences_offered",
                    "sentences_picked",
                    "invalid_numbers",
                    "parse_failures",
                    "not_verbatim",
                    "too_short",
                    "too_long",
                    "duplicates",
                    "over_cap",
                )
            },
            "quotes": len(quotes),
            "not_verbatim_examples": not_verbatim_examples,
        }
    }
    return {"quotes": quotes, "audit": audit}


def _quote(n: int, p: dict, text: str, question: str) -> dict:
    """A quote record.  extraction_confidence (0–1) is computed, not asked of the model: half the
    passage's cosine to the question (0.2→0, 0.7→1) and half the share of the question's content
    words the quote contains."""
    dense = _score(p.get("dense_score"))
    sim = 0.5 if dense is None else min(1.0, max(0.0, (dense - 0.2) / 0.5))
    q = content_words(question)
    overlap = len(q & content_words(text)) / len(q) if q else 0.0
    return {
        "id": f"Q{n}",
        "passage_id": p["id"],
        "title": str(p.get("title") or ""),
        "source_type": p.get("source_type") or source_type(p),
        "text": text,
        "extraction_confidence": round(0.5 * sim + 0.5 * overlap, 2),
        "verified": False,
        "reason": None,
    }


# ------------------------------------------------------------------------------------------------
# Stage 3: the grounding gate
# ------------------------------------------------------------------------------------------------

_VERDICT_TEXT = re.compile(
    r"Q?(\d+)\D{0,40}?\b(ok|does_not_address_question|requires_inference|incomplete_quote)\b",
    re.IGNORECASE,
)


def _verdicts(result: Any, batch: list[dict]) -> dict[str, str]:
    """Quote ID -> verdict from a gate reply (IDs outside the batch ignored; a reply without
    usable IDs but one verdict per quote is read in order); unusable reply -> {}."""
    ids = [q["id"] for q in batch]
    out: dict[str, str] = {}
    if result is None:
        return out
    if result.parsed is not None:
        verdicts = result.parsed.verdicts
        for v in verdicts:
            qid = normalize_qid(v.id)
            if qid in ids and qid not in out:
                out[qid] = v.verdict
        if not out and len(verdicts) == len(ids):
            out = {qid: v.verdict for qid, v in zip(ids, verdicts, strict=True)}
        return out
    for m in _VERDICT_TEXT.finditer(result.text or ""):
        qid = f"Q{int(m.group(1))}"
        if qid in ids and qid not in out:
            out[qid] = m.group(2).lower()
    return out


def _quotes_block(quotes: Sequence[dict]) -> str:
    return "\n".join(
        f'[{q["id"]}] "{" ".join(prompts.neutralize(q["text"]).split())}"' for q in quotes
    )


@_stage("verify_quotes")
def verify_quotes(state: EvidenceState, client: Any) -> dict:
    """One verdict per quote, VERIFY_BATCH quotes per call."""
    quotes = [dict(q) for q in state.get("quotes") or []]
    question = prompts.quote("question", state["question"])
    calls = 0
    for start in range(0, len(quotes), VERIFY_BATCH):
        batch = quotes[start : start + VERIFY_BATCH]
        calls += 1
        result = _invoke(
            client,
            prompts.render("verify_quotes", question=question, quotes=_quotes_block(batch)),
            "verify",
            GateVerdicts,
        )
        verdicts = _verdicts(result, batch)
        for q in batch:
            verdict = verdicts.get(q["id"])
            q["verified"] = verdict == "ok"
            q["reason"] = None if verdict == "ok" else (verdict or "not_judged")
    reasons = Counter(q["reason"] for q in quotes if not q["verified"])
    audit = {
        "verification": {
            "calls": calls,
            "judged": sum(q["reason"] != "not_judged" for q in quotes),
            "verified": sum(q["verified"] for q in quotes),
            "rejected": {r: reasons.get(r, 0) for r in (*REJECTION_REASONS, "not_judged")},
        }
    }
    return {"quotes": quotes, "audit": audit}


# ------------------------------------------------------------------------------------------------
# Stage 4: composition and its rendering
# ------------------------------------------------------------------------------------------------


def _clean_claim(text: str) -> str:
    text = strip_citations(" ".join(str(text).split()))
    text = re.sub(r"\[[^\]]*\]", " ", text)  # any other bracketed reference the model wrote
    return " ".join(text.split()).strip(" -*•")


def merge_claims(points: Sequence[dict]) -> tuple[list[dict], int]:
    """Points with identical or near-identical claims merged (the longer text kept, their quote IDs
    united, first position kept); the number merged away."""
    kept: list[dict] = []
    merged = 0
    for point in points:
        words = content_words(point["claim"])
        norm = " ".join(_TOKEN.findall(point["claim"].lower()))
        for other in kept:
            o_norm = " ".join(_TOKEN.findall(other["claim"].lower()))
            if (
                norm == o_norm
                or (norm and norm in o_norm)
                or (o_norm and o_norm in norm)
                or near_duplicate(words, content_words(other["claim"]))
            ):
                if len(point["claim"]) > len(other["claim"]):
                    other["claim"] = point["claim"]
                other["ids"] = list(dict.fromkeys([*other["ids"], *point["ids"]]))
                merged += 1
                break
        else:
            kept.append({"claim": point["claim"], "ids": list(point["ids"])})
    return kept, merged


def render_sentence(text: str, ids: Sequence[str]) -> str:
    """``text`` (one sentence) ending in its citations: ``Rule text [Q1, Q3].``"""
    body = text.strip().rstrip(" .;:,")
    return f"{body} [{', '.join(ids)}]." if ids else f"{body}."


def _sentences_of(points: Sequence[dict]) -> list[dict]:
    """Every sentence of every claim with the claim's IDs (a two-sentence claim cites twice)."""
    out = []
    for point in points:
        parts = [s.strip() for s in split_sentences(point["claim"]) if _TOKEN.search(s.lower())]
        full = [s for s in parts if word_count(s) >= MIN_SENTENCE_WORDS]
        out.extend({"text": s, "ids": list(point["ids"])} for s in (full or parts))
    return out


def _conflict_sentence(a: dict, b: dict) -> dict:
    text = (
        f'The sources differ: "{" ".join(a["text"].split()).rstrip(".")}" [{a["id"]}] versus '
        f'"{" ".join(b["text"].split()).rstrip(".")}" [{b["id"]}]'
    )
    return {"text": text, "ids": [a["id"], b["id"]], "conflict": True}


def extractive_draft(verified: Sequence[dict]) -> dict:
    """The fail-safe answer: the first EXTRACTIVE_QUOTES verified quotes, one cited line each."""
    points = [{"claim": " ".join(q["text"].split()), "ids": [q["id"]]} for q in verified]
    points, merged = merge_claims(points[:EXTRACTIVE_QUOTES])
    return {"sentences": _sentences_of(points), "method": "extractive", "merged": merged}


_POINT_JSON = re.compile(
    r'"claim"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"quotes"\s*:\s*\[([^\]]*)\]', re.DOTALL
)


def salvage_composition(text: str) -> Composition | None:
    """The complete ``{"claim": …, "quotes": […]}`` points of a reply whose JSON is unusable (cut
    off by the token budget, say); None when there are none."""
    import json

    points = []
    for m in _POINT_JSON.finditer(text or ""):
        try:
            claim = json.loads(f'"{m.group(1)}"')
        except ValueError:
            claim = m.group(1)
        ids = re.findall(r"Q?\d+", m.group(2))
        if claim.strip() and ids:
            points.append(ComposedPoint(claim=claim, quotes=ids[:4]))
    return Composition(points=points[:8]) if points else None


def draft_from_composition(parsed: Composition | None, verified: Sequence[dict]) -> dict:
    """Sentences from the model's points: only verified IDs survive, a point left with none is
    dropped, identical claims merge, valid conflict pairs render side by side.  No usable point ->
    the extractive draft."""
    by_id = {q["id"]: q for q in verified}
    points, dropped_ids, dropped_points = [], 0, 0
    for point in parsed.points if parsed is not None else []:
        ids = [normalize_qid(x) for x in point.quotes]
        good = list(dict.fromkeys(i for i in ids if i in by_id))
        dropped_ids += len(ids) - len(good)
        claim = _clean_claim(point.claim)
        if not good or not _TOKEN.search(claim.lower()):
            dropped_points += 1
            continue
        points.append({"claim": claim, "ids": good})
    if not points:
        draft = extractive_draft(verified)
        draft.update(dropped_ids=dropped_ids, dropped_points=dropped_points)
        return draft
    points, merged = merge_claims(points)
    sentences = _sentences_of(points)
    conflicts = 0
    seen_pairs: set[frozenset[str]] = set()
    for pair in parsed.conflicts if parsed is not None else []:
        ids = [i for i in (normalize_qid(x) for x in pair) if i in by_id]
        ids = list(dict.fromkeys(ids))
        if len(ids) >= 2 and frozenset(ids[:2]) not in seen_pairs:
            seen_pairs.add(frozenset(ids[:2]))
            sentences.append(_conflict_sentence(by_id[ids[0]], by_id[ids[1]]))
            conflicts += 1
    return {
        "sentences": sentences,
        "method": "model",
        "merged": merged,
        "conflicts": conflicts,
        "dropped_ids": dropped_ids,
        "dropped_points": dropped_points,
    }


def render_answer(sentences: Sequence[dict]) -> str:
    """One cited sentence per line; a sentence identical to an earlier one (after normalising case,
    spacing and punctuation) is not repeated."""
    lines, seen = [], set()
    for s in sentences:
        line = render_sentence(s["text"], s["ids"])
        key = " ".join(_TOKEN.findall(line.lower()))
        if key not in seen:
            seen.add(key)
            lines.append(line)
    return "\n".join(lines)


def _compose(state: EvidenceState, client: Any, feedback: str) -> dict:
    verified = [q for q in state.get("quotes") or [] if q["verified"]]
    result = _invoke(
        client,
        prompts.render(
            "compose_from_quotes",
            question=prompts.quote("question", state["question"]),
            quotes=_quotes_block(verified),
            feedback=feedback,
        ),
        "compose",
        Composition,
    )
    parsed = None
    if result is not None:
        parsed = result.parsed or salvage_composition(result.text)
    draft = draft_from_composition(parsed, verified)
    draft["parse_failed"] = result is None or result.parsed is None
    draft["salvaged"] = result is not None and result.parsed is None and parsed is not None
    return draft


@_stage("compose_answer")
def compose_answer(state: EvidenceState, client: Any) -> dict:
    """The first draft from the verified quotes."""
    draft = _compose(state, client, "None.")
    return {"draft": draft, "revisions": 0, "audit": {"composition": _composition_audit(draft)}}


@_stage("revise_answer")
def revise_answer(state: EvidenceState, client: Any) -> dict:
    """A new draft with the review's problems as feedback."""
    draft = _compose(state, client, (state.get("review") or {}).get("feedback") or "None.")
    return {
        "draft": draft,
        "revisions": int(state.get("revisions", 0)) + 1,
        "audit": {"composition": _composition_audit(draft)},
    }


def _composition_audit(draft: dict) -> dict:
    return {
        "method": draft["method"],
        "sentences": len(draft["sentences"]),
        "merged_duplicates": draft.get("merged", 0),
        "conflicts": draft.get("conflicts", 0),
        "dropped_unverified_ids": draft.get("dropped_ids", 0),
        "dropped_points": draft.get("dropped_points", 0),
        "parse_failed": draft.get("parse_failed", False),
        "salvaged_points": draft.get("salvaged", False),
    }


# ------------------------------------------------------------------------------------------------
# Stage 5: review
# ------------------------------------------------------------------------------------------------


def check_sentence(sentence: dict, quotes_by_id: Mapping[str, dict]) -> dict:
    """The programmatic checks of one draft sentence: cites IDs, every ID verified, and
    MIN_SUPPORT_OVERLAP of its content words occur in the quotes it cites."""
    ids = list(sentence.get("ids") or [])
    verified = [i for i in ids if (quotes_by_id.get(i) or {}).get("verified")]
    words = content_words(sentence["text"])
    support = (
        set().union(*(content_words(quotes_by_id[i]["text"]) for i in verified))
        if verified
        else set()
    )
    overlap = len(words & support) / len(words) if words else 0.0
    return {
        "cited": bool(ids),
        "ids_verified": bool(ids) and len(verified) == len(ids),
        "overlap": round(overlap, 3),
        "supported": bool(ids) and len(verified) == len(ids) and overlap >= MIN_SUPPORT_OVERLAP,
    }


def restates_a_quote_sentence(sentence: dict, quotes_by_id: Mapping[str, dict]) -> bool:
    """Whether one sentence of the cited quotes holds at least OVERRULE_OVERLAP of the sentence's
    content words and no negation the sentence lacks: the sentence restates that quote sentence,
    so an LLM "unsupported" flag on it is overruled."""
    words = content_words(sentence["text"])
    if not words:
        return False
    negations = _negations(sentence["text"])
    for qid in sentence.get("ids") or []:
        quote = quotes_by_id.get(qid)
        if not quote or not quote.get("verified"):
            continue
        for part in split_sentences(quote["text"]):
            covered = len(words & content_words(part)) / len(words)
            if covered >= OVERRULE_OVERLAP and _negations(part) <= negations:
                return True
    return False


def quality_score(
    checks: Sequence[dict], llm_flagged: set[int], n_used: int, n_verified: int
) -> float:
    """0–10: 3 × share of sentences whose citations are all verified + 5 × share supported (content
    overlap and not flagged by the LLM check) + 2 × use of the evidence (quotes cited out of
    min(verified, 3)).  An empty answer scores 0."""
    if not checks:
        return 0.0
    n = len(checks)
    cite = sum(c["ids_verified"] for c in checks) / n
    support = sum(c["supported"] and i not in llm_flagged for i, c in enumerate(checks)) / n
    use = min(1.0, n_used / min(n_verified, 3)) if n_verified else 0.0
    return round(3 * cite + 5 * support + 2 * use, 1)


def _feedback(sentences: Sequence[dict], checks: Sequence[dict], flagged: set[int]) -> str:
    lines = []
    for i, (s, c) in enumerate(zip(sentences, checks, strict=True)):
        claim = _short(s["text"], 20)
        if not c["cited"]:
            lines.append(f'- "{claim}" cites no quote: name the quote IDs that state it.')
        elif not c["ids_verified"]:
            lines.append(f'- "{claim}" cites an unknown quote: use only the IDs listed.')
        elif not c["supported"] or i in flagged:
            ids = ", ".join(s["ids"])
            lines.append(f'- "{claim}" says more than [{ids}]: restate only what the quote says.')
    return "\n".join(lines) or "None."


@_stage("review_answer")
def review_answer(state: EvidenceState, client: Any) -> dict:
    """Programmatic checks + one LLM check for claims beyond the quotes -> score and feedback."""
    quotes = state.get("quotes") or []
    by_id = {q["id"]: q for q in quotes}
    sentences = (state.get("draft") or {}).get("sentences") or []
    checks = [check_sentence(s, by_id) for s in sentences]
    flagged: set[int] = set()
    overruled: set[int] = set()
    llm_ok = True
    if sentences:
        claims = "\n".join(
            f"{i}. {' '.join(s['text'].split())}\n   quotes: "
            + " ".join(
                f'[{q}] "{" ".join(by_id[q]["text"].split())}"' for q in s["ids"] if q in by_id
            )
            for i, s in enumerate(sentences, 1)
        )
        result = _invoke(
            client, prompts.render("review_answer", claims=claims), "review", ClaimReview
        )
        if result is not None and result.parsed is not None:
            raw = {n - 1 for n in result.parsed.unsupported if 1 <= n <= len(sentences)}
            overruled = {i for i in raw if restates_a_quote_sentence(sentences[i], by_id)}
            flagged = raw - overruled
        else:
            llm_ok = False
    used = {i for s in sentences for i in s["ids"] if (by_id.get(i) or {}).get("verified")}
    n_verified = sum(q["verified"] for q in quotes)
    score = quality_score(checks, flagged, len(used), n_verified)
    review = {
        "score": score,
        "checks": checks,
        "llm_flagged": sorted(i + 1 for i in flagged),
        "llm_overruled": sorted(i + 1 for i in overruled),
        "llm_check_ok": llm_ok,
        "feedback": _feedback(sentences, checks, flagged),
    }
    history = list((state.get("audit") or {}).get("review", {}).get("history") or [])
    history.append(
        {
            "score": score,
            "sentences": len(sentences),
            "uncited": sum(not c["cited"] for c in checks),
            "unverified_ids": sum(c["cited"] and not c["ids_verified"] for c in checks),
            "low_overlap": sum(c["ids_verified"] and not c["supported"] for c in checks),
            "llm_flagged": len(flagged),
            "llm_overruled": len(overruled),
            "llm_check_ok": llm_ok,
        }
    )
    return {"review": review, "audit": {"review": {"history": history}}}


# ------------------------------------------------------------------------------------------------
# Stage 6/7: finalize or abstain
# ------------------------------------------------------------------------------------------------


def composition_confidence(n_verified: int, n_used: int) -> str:
    """high: ≥5 verified and most of them used; medium: 2–4 verified (or ≥5, fewer used); low: 1."""
    if n_verified >= 5 and n_used * 2 > n_verified:
        return "high"
    if n_verified >= 2:
        return "medium"
    return "low" if n_verified == 1 else "none"


@_stage("finalize")
def finalize(state: EvidenceState, client: Any) -> dict:
    """Drop sentences that fail the programmatic checks or that the last review's LLM check
    flagged (and was not overruled), render, and assemble the result."""
    quotes = state.get("quotes") or []
    by_id = {q["id"]: q for q in quotes}
    verified = [q for q in quotes if q["verified"]]
    review = state.get("review") or {}
    sentences = (state.get("draft") or {}).get("sentences") or []
    flagged = {n - 1 for n in review.get("llm_flagged") or []}
    kept = [
        s
        for i, s in enumerate(sentences)
        if check_sentence(s, by_id)["supported"] and i not in flagged
    ]
    dropped = len(sentences) - len(kept)
    method = (state.get("draft") or {}).get("method", "model")
    if not kept:
        fallback = extractive_draft(verified)
        kept, method = fallback["sentences"], "extractive"
    answer = render_answer(kept)
    used = list(dict.fromkeys(i for s in kept for i in s["ids"]))
    references = [{"claim": render_sentence(s["text"], []), "quote_ids": s["ids"]} for s in kept]
    audit = {
        "composition": {"method": method, "quotes_used": used, "quotes_used_count": len(used)},
        "review": {
            "score": review.get("score"),
            "revisions": int(state.get("revisions", 0)),
            "dropped_sentences": dropped,
            "final_sentences": len(kept),
        },
    }
    result = _result(state, answer, abstained=False, references=references, used=used)
    result["quality_score"] = review.get("score")
    result["audit_trail"] = _audit_summary(merge_audit(state.get("audit"), audit))
    return {"result": result, "audit": audit}


def _missing(state: EvidenceState) -> list[str]:
    audit = state.get("audit") or {}
    passages = audit.get("passages") or {}
    quotes = state.get("quotes") or []
    need = f"a source that states the rule for: {_short(state['question'], 25)}"
    out = [need]
    if not passages.get("received"):
        out.append("no passages were retrieved")
    elif state.get("declined"):
        out.append(f"the research declined the question ({state['declined']})")
    elif not state.get("kept"):
        best = passages.get("best_score")
        parts = []
        if passages.get("below_floor"):
            best_txt = f", best {best:.2f}" if best is not None else ""
            parts.append(
                f"{passages['below_floor']} passage(s) below the similarity floor "
                f"{float(state.get('floor', 0)):.2f}{best_txt}"
            )
        if passages.get("flagged"):
            parts.append(f"{passages['flagged']} passage(s) flagged as containing instructions")
        out.append("no passage reached extraction: " + "; ".join(parts or ["none usable"]))
    elif not quotes:
        out.append(
            f"none of the {len(state['kept'])} passage(s) above the floor has a sentence "
            "the extractor picked as stating a rule on the question"
        )
    else:
        out.append(f"none of the {len(quotes)} extracted quote(s) passed the grounding gate")
    return out


@_stage("abstain")
def abstain(state: EvidenceState, client: Any) -> dict:
    """The abstention: the fixed sentence, what is missing, and why quotes were rejected."""
    missing = _missing(state)
    reasons = Counter(q["reason"] for q in state.get("quotes") or [] if not q["verified"])
    extraction = (state.get("audit") or {}).get("extraction") or {}
    if extraction.get("not_verbatim"):
        reasons["not_verbatim"] += extraction["not_verbatim"]
    rejected = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())) or "no quotes to judge"
    answer = f"{ABSTAIN_TEXT}\nMissing: {'; '.join(missing)}.\nRejected quotes: {rejected}."
    result = _result(state, answer, abstained=True, references=[], used=[])
    result["missing_evidence"] = missing
    result["quality_score"] = None
    audit = {"review": {"score": None, "revisions": 0}}
    result["audit_trail"] = _audit_summary(merge_audit(state.get("audit"), audit))
    return {"result": result, "audit": audit}


def _result(
    state: EvidenceState, answer: str, *, abstained: bool, references: list, used: list
) -> dict:
    quotes = state.get("quotes") or []
    n_verified = sum(q["verified"] for q in quotes)
    return {
        "answer": answer,
        "abstained": abstained,
        "grounded": not abstained,
        "multiple_choice": bool(state.get("choices")),
        "quotes": [dict(q) for q in quotes],
        "requirement_references": references,
        "quotes_used": used,
        "composition_confidence": "none"
        if abstained
        else composition_confidence(n_verified, len(used)),
        "quality_score": None,
        "revisions": int(state.get("revisions", 0)),
        "missing_evidence": [],
    }


# ------------------------------------------------------------------------------------------------
# Routers and the graph
# ------------------------------------------------------------------------------------------------


def route_after_floor(state: EvidenceState) -> Literal["extract_quotes", "abstain"]:
    return "extract_quotes" if state.get("kept") else "abstain"


def route_after_extraction(state: EvidenceState) -> Literal["verify_quotes", "abstain"]:
    return "verify_quotes" if state.get("quotes") else "abstain"


def route_after_verification(state: EvidenceState) -> Literal["compose_answer", "abstain"]:
    return "compose_answer" if any(q["verified"] for q in state.get("quotes") or []) else "abstain"


def route_after_review(state: EvidenceState) -> Literal["revise_answer", "finalize"]:
    score = float((state.get("review") or {}).get("score") or 0.0)
    if score < QUALITY_THRESHOLD and int(state.get("revisions", 0)) < MAX_REVISIONS:
        return "revise_answer"
    return "finalize"


def build_evidence_graph() -> Any:
    """The compiled evidence subgraph.  Input: ``question``, ``candidates`` (passages), ``floor``,
    optional ``choices``; the result is in ``result``.  Context: anything with ``client``."""
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(EvidenceState, context_schema=EvidenceContext)
    for fn in (
        apply_retrieval_floor,
        extract_quotes,
        verify_quotes,
        compose_answer,
        review_answer,
        revise_answer,
        finalize,
        abstain,
    ):
        g.add_node(fn.__name__, fn)
    g.add_edge(START, "apply_retrieval_floor")
    g.add_conditional_edges("apply_retrieval_floor", route_after_floor)
    g.add_conditional_edges("extract_quotes", route_after_extraction)
    g.add_conditional_edges("verify_quotes", route_after_verification)
    g.add_edge("compose_answer", "review_answer")
    g.add_conditional_edges("review_answer", route_after_review)
    g.add_edge("revise_answer", "review_answer")
    g.add_edge("finalize", END)
    g.add_edge("abstain", END)
    return g.compile()


RECURSION_LIMIT = 8 + 2 * MAX_REVISIONS + 5
"""Supersteps: floor, extract, verify, compose, review, (revise, review) × MAX_REVISIONS, finalize."""


def _audit_summary(audit: dict) -> dict:
    """The audit trail with its totals (the result of the subgraph carries one without the last
    stage's own timing; :func:`answer_from_evidence` recomputes it from the final state)."""
    audit = dict(audit)
    stages = audit.get("stages") or {}
    audit["llm_calls"] = sum(s.get("llm_calls", 0) for s in stages.values())
    audit["seconds"] = round(sum(s.get("seconds", 0.0) for s in stages.values()), 3)
    audit["call_budget"] = max_llm_calls()
    return audit


def answer_from_evidence(
    client: Any,
    question: str,
    passages: Sequence[Mapping[str, Any]],
    *,
    choices: Mapping[str, str] | None = None,
    floor: float | None = None,
    settings: Any = None,
    graph: Any = None,
    declined: str | None = None,
) -> dict:
    """Answer ``question`` from ``passages`` with verified quotes only, or abstain.

    ``passages``: dicts ``{id, title, source, text, dense_score (cosine to the question),
    rerank_score, injection_flags}``.  ``floor`` defaults to ``settings.evidence_floor``.
    ``choices`` only marks the result as multiple choice (the letter is chosen elsewhere).
    ``declined``: why the research declined the question; then the answer abstains without an LLM
    call (an open question the research found no confident evidence for is not answered from it).
    Returns ``answer, abstained, grounded, quotes, requirement_references, quotes_used,
    composition_confidence, quality_score, revisions, missing_evidence, audit_trail``."""
    if floor is None:
        if settings is None:
            raise ValueError("answer_from_evidence needs floor= or settings= (EVIDENCE_FLOOR)")
        floor = float(settings.evidence_floor)
    graph = graph or build_evidence_graph()
    state = graph.invoke(
        {
            "question": question,
            "choices": dict(choices) if choices else None,
            "candidates": [dict(p) for p in passages],
            "floor": float(floor),
            "declined": declined,
        },
        context=EvidenceContext(client=client),
        config={"recursion_limit": RECURSION_LIMIT},
    )
    result = dict(state["result"])
    result["audit_trail"] = _audit_summary(dict(state.get("audit") or {}))
    return result


def format_audit_block(result: Mapping[str, Any]) -> str:
    """The compact audit block the CLI prints under an evidence answer."""
    a = result.get("audit_trail") or {}
    p = a.get("passages") or {}
    x = a.get("extraction") or {}
    v = a.get("verification") or {}
    r = a.get("review") or {}
    types = ", ".join(f"{n} {t}" for t, n in (p.get("by_source_type") or {}).items() if n)
    rejected = ", ".join(f"{n} {k}" for k, n in (v.get("rejected") or {}).items() if n) or "none"
    lines = [
        f"passages: {p.get('received', 0)} ({types or 'none'}); {p.get('below_floor', 0)} below "
        f"floor {a.get('floor', 0):.2f}, {p.get('flagged', 0)} flagged, "
        f"{p.get('to_extraction', 0)} to extraction",
        f"quotes: {x.get('quotes', 0)} extracted, {x.get('not_verbatim', 0)} not verbatim; "
        f"{v.get('verified', 0)} verified, rejected: {rejected}",
        f"answer: {'abstained' if result.get('abstained') else 'grounded'}; "
        f"{len(result.get('quotes_used') or [])} quotes used; confidence "
        f"{result.get('composition_confidence')}; score {r.get('score')}; "
        f"revisions {r.get('revisions', 0)}",
        f"llm: {a.get('llm_calls', 0)} calls (budget {a.get('call_budget')}), "
        f"{a.get('seconds', 0):.1f} s: "
        + ", ".join(
            f"{name} {s.get('llm_calls', 0)}/{s.get('seconds', 0):.1f}s"
            for name, s in (a.get("stages") or {}).items()
        ),
    ]
    return "\n".join(lines)
