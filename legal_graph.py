"""A legal knowledge graph over the passage corpus: doctrines, authorities and the passages that
mention or cite them, queried with Cypher (docs/ARCHITECTURE.md, "The legal knowledge graph").

Why a graph: dense and BM25 retrieval see words, not the structure of the law. A question about an
excited utterance should reach passages on the hearsay exceptions even when they share few words
with the fact pattern, and a multi-issue question should be split into the doctrines it raises
(free speech, free exercise, procedural due process), not researched as one blurred topic.

* **Taxonomy** (``datasets/legal_taxonomy.jsonl``, written by the team): the doctrines of the MBE
  subjects with aliases (the phrasings a question or passage uses), a one-line description (for
  embedding similarity) and relations ``element_of`` / ``exception_to`` / ``related_to``.
* **Extraction** is deterministic, so a corpus loads at about the vector load's speed: doctrine
  mentions by alias (whole words, longest match) and authorities by eyecite (case and statute
  citations, short forms resolved) plus patterns for what eyecite does not know (court rules, the
  Constitution, U.C.C. sections, case names without a reporter). docs/CITATIONS.md measures it.
* **Graph**: nodes Passage, Doctrine, Authority, Subject; edges MENTIONS (passage → doctrine),
  CITES (passage → authority), TEXT_OF (passage → the authority it is part of: a user's document
  whose metadata carries its own ``citation``, so "a case cites a case" is a path), PART_OF
  (doctrine → subject), ELEMENT_OF / EXCEPTION_TO / RELATED_TO (doctrine → doctrine). The engine
  is an embedded Kùzu-lineage database (LadybugDB, no server) or Neo4j when ``NEO4J_URI`` is set;
  both run the same Cypher. Loading is idempotent and resumable like the vector load.
* **Search** (:func:`search_graph`, :func:`graph_search`) in the modes ``keyword``,
  ``principles``, ``semantic``, ``graph`` (the three fused) and ``combined`` (graph fused with the
  hybrid dense + BM25 retrieval).
* **Issue spotting**: :func:`link_doctrines` links a question to doctrines; :func:`merge_agenda`
  merges them with the model's issue list, one item per claim.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import math
import re
import threading
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rag_utils
from rag_utils import short_error
from settings import Settings

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

TAXONOMY_PATH = Path(__file__).resolve().parent / "datasets" / "legal_taxonomy.jsonl"
NODE_TYPES = ("Passage", "Doctrine", "Authority", "Subject")
EDGE_TYPES = (
    "MENTIONS", "CITES", "TEXT_OF", "PART_OF", "ELEMENT_OF", "EXCEPTION_TO", "RELATED_TO",
)  # fmt: skip
EXTRACTOR_VERSION = "eyecite-1"
"""Recorded in the graph beside the taxonomy's version: a graph built by another version of the
citation extraction (or without the TEXT_OF edges) is re-linked by ``load_corpus.py graph``."""
RELATIONS = {"element_of": "ELEMENT_OF", "exception_to": "EXCEPTION_TO", "related_to": "RELATED_TO"}
MODES = ("keyword", "principles", "semantic", "graph", "combined")
ENGINE = "ladybug"
"""The embedded graph database (Kùzu is archived; the GRAPH_ENGINE setting was removed)."""
EMBEDDED_THREADS = 1
"""Threads per embedded query. Graph queries are tiny: one thread answers in ~2 ms, while the
engine's default (every core) waits on scheduling on a busy 2-core machine (p50 24 ms measured)."""
BATCH = 500
SEMANTIC_TOP = 1
"""Doctrines the semantic mode expands from (on barexam_dev, more doctrines only added noise)."""
PRINCIPLE_DECAY = 0.5
"""Weight of a doctrine reached through one relation, relative to the doctrine it came from."""
CANDIDATES = 100
"""Passages per mode, by graph score, that the text similarity then orders."""
GRAPH_WEIGHT = 0.1
"""Share of the normalised graph score in a mode's ordering score (the rest: cosine to the query)."""
COMBINED_GRAPH_WEIGHT = 0.5
"""Weight of the graph ranking against the hybrid ranking in ``combined`` (RRF)."""
COMBINED_POOL = 100
"""Depth of each ranking fused in ``combined``."""


EMBEDDED_BUFFER_POOL = 512 * 1024 * 1024
"""Bytes of the embedded engine's buffer pool.  Its default (80% of RAM) beside the in-process LLM
server and the embedder ended the multi_hop demo with std::bad_alloc; the shared corpus's graph
needs a few MB."""
EMBEDDED_MAX_DB_SIZE = 1 << 34
"""Largest database file (16 GiB): the default reserves 8 TiB of address space per process."""


def _load_llama_first() -> None:
    """Import the embedded LLM's native library (when installed) before the first graph database
    opens: importing xllamacpp after a LadybugDB database is open aborts the process with
    std::bad_alloc (seen with ladybug 0.22 and xllamacpp in one process, in either load order of
    the Python modules; only opening the database first matters)."""
    if importlib.util.find_spec("xllamacpp") is not None:
        importlib.import_module("xllamacpp")


class GraphError(RuntimeError):
    """The graph database cannot be opened or used; the message says what to do."""


# ------------------------------------------------------------------------------------------------
# Taxonomy
# ------------------------------------------------------------------------------------------------


_TOKEN = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    """Lower-case word tokens; punctuation and hyphens separate words ("res ipsa", "2-207")."""
    return _TOKEN.findall(text.lower())


def normalize(text: str) -> str:
    """Tokens joined by single spaces and padded with one space on each side, so that
    ``" due process " in normalize(text)`` is a whole-word test (used in Cypher CONTAINS)."""
    return " " + " ".join(tokens(text)) + " "


@dataclass(frozen=True)
class Doctrine:
    """One doctrine of the taxonomy."""

    id: str
    name: str
    subject: str
    description: str
    aliases: tuple[str, ...] = ()
    element_of: tuple[str, ...] = ()
    exception_to: tuple[str, ...] = ()
    related_to: tuple[str, ...] = ()

    def text_for_embedding(self) -> str:
        """Name, description and the first aliases: the aliases carry the words fact patterns use."""
        return f"{self.name}: {self.description} ({'; '.join(self.aliases[:8])})"


@dataclass(frozen=True)
class Match:
    """A doctrine alias found in a text: token span [start, end)."""

    doctrine_ids: tuple[str, ...]
    alias: str
    start: int
    end: int


class AliasIndex:
    """Alias token sequences -> the ids they name (doctrines, or case authorities by name),
    matched greedily left to right."""

    def __init__(self, pairs: Iterable[tuple[Sequence[str], str]]) -> None:
        """``pairs``: (an alias's tokens, an id it names); an id is kept once per alias, in the
        order given."""
        index: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for words, target in pairs:
            if words and target not in index[tuple(words)]:
                index[tuple(words)].append(target)
        self._index = {k: tuple(v) for k, v in index.items()}
        self._max_len = max((len(k) for k in index), default=0)
        self._first = {k[0] for k in index}

    def find(self, text: str | Sequence[str]) -> list[Match]:
        """Alias matches in ``text`` (or its tokens): at each position the longest alias wins and
        matches never overlap, so "procedural due process" is not also "due process"."""
        toks = tokens(text) if isinstance(text, str) else list(text)
        out: list[Match] = []
        i, n = 0, len(toks)
        while i < n:
            longest = min(self._max_len, n - i) if toks[i] in self._first else 0
            for length in range(longest, 0, -1):
                ids = self._index.get(tuple(toks[i : i + length]))
                if ids:
                    out.append(Match(ids, " ".join(toks[i : i + length]), i, i + length))
                    i += length
                    break
            else:
                i += 1
        return out


class Taxonomy:
    """The doctrines with an alias index for longest-match linking."""

    def __init__(self, doctrines: Sequence[Doctrine], fingerprint: str = "") -> None:
        self.doctrines: dict[str, Doctrine] = {d.id: d for d in doctrines}
        self.fingerprint = fingerprint
        self.subjects: list[str] = sorted({d.subject for d in doctrines})
        self._aliases = AliasIndex(
            (tokens(alias), d.id) for d in doctrines for alias in (d.name, *d.aliases)
        )

    def __len__(self) -> int:
        return len(self.doctrines)

    def __getitem__(self, doctrine_id: str) -> Doctrine:
        return self.doctrines[doctrine_id]

    def aliases_of(self, doctrine_id: str) -> list[str]:
        """Normalized aliases (name included) of a doctrine, as stored on its graph node."""
        d = self.doctrines[doctrine_id]
        return list(dict.fromkeys(normalize(a) for a in (d.name, *d.aliases) if tokens(a)))

    def find(self, text: str | Sequence[str]) -> list[Match]:
        """Alias matches in ``text`` (or its tokens), longest match first (see AliasIndex)."""
        return self._aliases.find(text)

    def resolve(self, matches: Sequence[Match]) -> Counter[str]:
        """Mention counts per doctrine. An alias shared by doctrines of several subjects goes to
        the subject the text's unambiguous mentions favour (all of them on a tie)."""
        counts: Counter[str] = Counter()
        subjects: Counter[str] = Counter()
        for m in matches:
            if len(m.doctrine_ids) == 1:
                counts[m.doctrine_ids[0]] += 1
                subjects[self.doctrines[m.doctrine_ids[0]].subject] += 1
        for m in matches:
            if len(m.doctrine_ids) > 1:
                best = max(subjects[self.doctrines[i].subject] for i in m.doctrine_ids)
                for i in m.doctrine_ids:
                    if subjects[self.doctrines[i].subject] == best:
                        counts[i] += 1
        return counts

    def root(self, doctrine_id: str) -> str:
        """The claim a doctrine belongs to: follow ``element_of`` / ``exception_to`` upward
        (first parent each time) to a doctrine that has neither."""
        seen = {doctrine_id}
        cur = self.doctrines[doctrine_id]
        while True:
            nxt = next((p for p in (*cur.element_of, *cur.exception_to) if p not in seen), None)
            if nxt is None:
                return cur.id
            seen.add(nxt)
            cur = self.doctrines[nxt]


_lock = threading.RLock()


def load_taxonomy(path: str | Path | None = None) -> Taxonomy:
    """The doctrine taxonomy (JSONL, one doctrine a line), validated: unique ids, a name, a
    subject and relations that name existing ids. Cached per file and modification time."""
    p = Path(path) if path is not None else TAXONOMY_PATH
    try:
        return _read_taxonomy(p, p.stat().st_mtime_ns)
    except OSError as exc:
        raise GraphError(f"cannot read the doctrine taxonomy {p}: {exc.strerror}") from None


@functools.lru_cache(maxsize=16)
def _read_taxonomy(p: Path, mtime_ns: int) -> Taxonomy:
    raw = p.read_bytes()
    doctrines: list[Doctrine] = []
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            doctrines.append(
                Doctrine(
                    id=str(rec["id"]),
                    name=str(rec["name"]),
                    subject=str(rec["subject"]),
                    description=str(rec.get("description", "")),
                    aliases=tuple(str(a) for a in rec.get("aliases", ())),
                    element_of=tuple(rec.get("element_of", ())),
                    exception_to=tuple(rec.get("exception_to", ())),
                    related_to=tuple(rec.get("related_to", ())),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise GraphError(f"{p}: line {lineno}: not a doctrine record ({exc})") from None
    ids = [d.id for d in doctrines]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise GraphError(f"{p}: duplicate doctrine id {dup!r}")
    known = set(ids)
    for d in doctrines:
        for field_name in RELATIONS:
            for other in getattr(d, field_name):
                if other not in known:
                    raise GraphError(f"{p}: {d.id}.{field_name} names unknown doctrine {other!r}")
    return Taxonomy(doctrines, fingerprint=hashlib.sha1(raw).hexdigest()[:12])


# ------------------------------------------------------------------------------------------------
# Authority extraction: eyecite for case and statute citations, patterns for the rest
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Authority:
    """A cited source of law: ``kind`` is statute, rule, constitution or case (``document`` for a
    user's document whose own citation names no reporter or code).

    Cases and statutes that eyecite recognises are keyed by their normalised citation
    (``392 U.S. 1``, ``28 U.S.C. § 1441``) and a case is named by its parties when eyecite finds
    them; court rules, the Constitution, U.C.C. sections and case names cited without a reporter
    keep pattern keys (``fre:803``, ``const:amend:14``, ``ucc:2-207``, ``case:goss v lopez``)."""

    id: str
    name: str
    kind: str


_Found = tuple[int, int, Authority, str]
"""An authority found in a text: its span, the authority and the citation as written."""

_ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100}
_ORDINALS = [
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
    "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth",
    "eighteenth", "nineteenth", "twentieth", "twenty-first", "twenty-second", "twenty-third",
    "twenty-fourth", "twenty-fifth", "twenty-sixth", "twenty-seventh",
]  # fmt: skip
_RULE_FAMILIES = {
    "frcp": "Fed. R. Civ. P.",
    "fre": "Fed. R. Evid.",
    "frcrp": "Fed. R. Crim. P.",
    "frap": "Fed. R. App. P.",
}
_SUB = r"((?:\([A-Za-z0-9]{1,4}\))*)"

# What eyecite 2.7 does not recognise (checked on this corpus): court rules, the Constitution,
# U.C.C. sections and case names cited without a reporter ("See Goss v. Lopez.").
FED_RULE_RE = re.compile(
    r"\bFed(?:eral|\.)?\s*R(?:ules?|\.)?\s*(?:of\s+)?"
    r"(Civ(?:il|\.)?\s*P(?:roc(?:edure|\.)?|\.)?|Evid(?:ence|\.)?|Crim(?:inal|\.)?\s*P(?:roc(?:edure|\.)?|\.)?"
    r"|App(?:ellate|\.)?\s*P(?:roc(?:edure|\.)?|\.)?)\s*(?:Rule\s*)?(\d{1,4}(?:\.\d)?)" + _SUB,
    re.IGNORECASE,
)
ABBR_RULE_RE = re.compile(
    r"\b(FRCP|FRE|FRCrP|FRAP|F\.\s?R\.\s?C\.\s?P\.|F\.\s?R\.\s?E\.|F\.\s?R\.\s?Crim\.\s?P\.)\s*(?:Rule\s*)?"
    r"(\d{1,4}(?:\.\d)?)" + _SUB
)
BARE_RULE_RE = re.compile(r"\bRule\s+(\d{1,4}(?:\.\d)?)" + _SUB)
CONST_RE = re.compile(
    r"\bU\.?\s?S\.?\s+Const(?:itution|\.)?\s*,?\s*(amend(?:ment|\.)?|art(?:icle|\.)?)\s*"
    r"([IVXLC]+|\d{1,2})\b(?:\s*,\s*(?:§|sec(?:tion|\.)?)\s*(\d+))?",
    re.IGNORECASE,
)
ORDINAL_AMEND_RE = re.compile(r"\b(" + "|".join(_ORDINALS) + r")\s+Amendments?\b", re.IGNORECASE)
ROMAN_AMEND_RE = re.compile(r"\bAmendment\s+([IVX]{1,6})\b")
ARTICLE_RE = re.compile(r"\bArticle\s+(I{1,3}|IV|V|VI|VII)\b(?:\s*,?\s*(?:§|Section)\s*(\d+))?")
UCC_RE = re.compile(
    r"(?:\b(?:U\.?\s?C\.?\s?C\.?|Uniform Commercial Code)\s*(?:§+|[Ss]ection)?\s*(\d{1,2}A?-\d{3})"
    r"|§\s*([1-9]A?-\d{3}))\b"
)
_CAP = r"(?:[A-Z][A-Za-z0-9'’&.\-]*|\d+[A-Za-z.]*)"
_JOIN = r"(?:of|the|and|de|la|du|von|van|for|in|ex rel\.|&)"
CASE_NAME_RE = re.compile(
    rf"\b({_CAP}(?:,? (?:{_CAP}|{_JOIN})){{0,7}}) vs?\. ({_CAP}(?: (?:{_CAP}|{_JOIN})){{0,7}})"
)
_CASE_LEAD = {
    "in", "see", "under", "the", "cf", "cf.", "but", "also", "accord", "compare", "and", "citing",
    "quoting", "e.g.", "id.", "although", "when", "while", "because", "as", "thus", "here", "then",
    "however", "following", "after", "before", "since", "unlike", "like", "per", "applying",
    "relying", "with", "from", "on", "by", "at", "to", "a", "an", "this", "that", "it", "where",
    "held", "holding", "court", "supreme", "decided", "overruling", "overruled", "affirming",
}  # fmt: skip
_NOT_A_PARTY = {"federal", "plaintiff", "defendant", "rule", "section", "article", "court", "law"}
_CASE_STOP = {
    "the", "in", "a", "an", "this", "that", "it", "he", "she", "they", "we", "under", "see",
    "but", "however", "here", "there", "thus", "when", "because", "as", "court", "held",
}  # fmt: skip

# eyecite logs a warning for every pair of overlapping citations it cannot order (parallel
# citations, "Terry, 392 U.S. at 21"): noise for a corpus load, not an error of ours.
logging.getLogger("eyecite.helpers").setLevel(logging.ERROR)


def _roman(s: str) -> int:
    s = s.upper()
    if s.isdigit():
        return int(s)
    total = 0
    for i, ch in enumerate(s):
        v = _ROMAN.get(ch, 0)
        total += -v if i + 1 < len(s) and _ROMAN.get(s[i + 1], 0) > v else v
    return total


def _to_roman(n: int) -> str:
    out = ""
    for v, sym in ((100, "C"), (90, "XC"), (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"),
                   (4, "IV"), (1, "I")):  # fmt: skip
        while n >= v:
            out += sym
            n -= v
    return out


def _written(text: str, start: int, end: int) -> str:
    return " ".join(text[start:end].split())


def _eyecite_authority(cite: Any, text: str) -> Authority | None:
    """The Authority of an eyecite full citation: a case by its normalised reporter citation
    (named "Plaintiff v. Defendant" when eyecite finds both), a statute by title, code and
    section (``28 U.S.C. § 1441``; eyecite's corrected form drops a state code's subject)."""
    from eyecite.models import FullCaseCitation, FullLawCitation

    if isinstance(cite, FullCaseCitation):
        key = cite.corrected_citation()
        meta = cite.metadata
        name = f"{meta.plaintiff} v. {meta.defendant}" if meta.plaintiff and meta.defendant else key
        return Authority(key, name, "case")
    if isinstance(cite, FullLawCitation):
        groups = cite.groups
        if groups.get("title"):
            key = f"{groups['title']} {cite.corrected_reporter()} § {groups['section']}"
        else:
            key = _written(text, *cite.span())
        return Authority(key, key, "statute")
    return None


def _eyecite_citations(text: str) -> list[_Found]:
    """Case and statute citations eyecite finds, with short forms, "id." and "supra" resolved to
    the full citation they refer to (in this text; an unresolved short form is dropped)."""
    from eyecite import get_citations, resolve_citations
    from eyecite.models import FullCaseCitation

    out: list[_Found] = []
    for resource, refs in resolve_citations(get_citations(text)).items():
        auth = _eyecite_authority(getattr(resource, "citation", None), text)
        if auth is None:
            continue
        for c in refs:
            start, end = _cite_span(c, text)
            shown = c.span() if isinstance(c, FullCaseCitation) else (start, end)
            out.append((start, end, auth, _written(text, *shown)))
    return out


def _cite_span(cite: Any, text: str) -> tuple[int, int]:
    """Where a citation is: a full case citation from its case name (which is then not found
    again as a bare name), a statute with its subsection ("§ 1441(b)"), neither with the
    parenthetical after it (a "Fourteenth Amendment" there is a citation of its own)."""
    from eyecite.models import FullCaseCitation, FullLawCitation

    start, end = cite.span()
    if isinstance(cite, FullCaseCitation):
        start = cite.full_span()[0]
    pin = getattr(cite.metadata, "pin_cite", None)
    if isinstance(cite, FullLawCitation) and pin and text.startswith(pin, end):
        end += len(pin)
    return start, end


def _rule(family: str, number: str) -> Authority:
    return Authority(f"{family}:{number}", f"{_RULE_FAMILIES[family]} {number}", "rule")


def _family_of(raw: str) -> str:
    low = re.sub(r"[\s.]", "", raw.lower())
    if "crim" in low or low.startswith("frcrp"):
        return "frcrp"
    if low.startswith(("frap", "app")):
        return "frap"
    if low.startswith("fre") or "evid" in low:
        return "fre"
    return "frcp"


def _context_family(context: str, explicit: Counter[str]) -> str | None:
    """The rule family a bare "Rule N" refers to: the passage's source/title first, then the
    family its explicit citations use most."""
    low = context.lower()
    if "evidence" in low:
        return "fre"
    if "criminal procedure" in low:
        return "frcrp"
    if "civil procedure" in low or "civ pro" in low:
        return "frcp"
    if explicit:
        return explicit.most_common(1)[0][0]
    return None


def _rule_citations(text: str, context: str) -> list[_Found]:
    """Federal rules of procedure and evidence: explicit ("Fed. R. Civ. P. 12(b)(6)", "FRE 803")
    and bare ("Rule 803(2)": the family from ``context`` or the explicit citations; without
    either, rules 101-1103 are Evidence and others are skipped)."""
    found: list[_Found] = []
    explicit: Counter[str] = Counter()
    for m in (*FED_RULE_RE.finditer(text), *ABBR_RULE_RE.finditer(text)):
        fam = _family_of(m.group(1))
        explicit[fam] += 1
        found.append((m.start(), m.end(), _rule(fam, m.group(2)), _written(text, *m.span())))
    hint = _context_family(context, explicit)
    for m in BARE_RULE_RE.finditer(text):
        number = m.group(1)
        fam = hint or ("fre" if len(number) >= 3 and 101 <= float(number) <= 1103 else None)
        if fam is not None:
            found.append((m.start(), m.end(), _rule(fam, number), _written(text, *m.span())))
    return found


def _amendment(n: int) -> Authority | None:
    if not 1 <= n <= 27:
        return None
    return Authority(f"const:amend:{n}", f"U.S. Const. amend. {_to_roman(n)}", "constitution")


def _article(n: int, section: str | None) -> Authority:
    key = f"const:art:{n}" + (f":{section}" if section else "")
    name = f"U.S. Const. art. {_to_roman(n)}" + (f", § {section}" if section else "")
    return Authority(key, name, "constitution")


def _constitution(m: re.Match[str]) -> Authority | None:
    """ "U.S. Const. amend. XIV, § 1" and "U.S. Const. art. III, § 2"."""
    n = _roman(m.group(2))
    return _amendment(n) if m.group(1).lower().startswith("amend") else _article(n, m.group(3))


def _ucc(m: re.Match[str]) -> Authority:
    section = m.group(1) or m.group(2)
    return Authority(f"ucc:{section}", f"U.C.C. § {section}", "statute")


def _plaintiff(words: list[str]) -> list[str]:
    """The last few capitalised words before "v.", without a leading signal or "In"."""
    while words and (
        words[0].lower().rstrip(",") in _CASE_LEAD or re.fullmatch(r"\d+\.?", words[0])
    ):
        words = words[1:]
    return words[-5:]


def _defendant(words: list[str]) -> list[str]:
    """The words after "v." up to a sentence's next word or its end ("Tompkins." ends a sentence;
    "Co." and "Fin." do not)."""
    kept: list[str] = []
    for i, w in enumerate(words):
        if i > 0 and (w.lower() in _CASE_STOP or w[:1].isdigit()):
            break
        kept.append(w)
        if i > 0 and w.endswith(".") and len(w.rstrip(".")) > 4:
            break
    return kept


def _strip_joins(words: list[str]) -> list[str]:
    while words and re.fullmatch(_JOIN, words[-1]):
        words = words[:-1]
    return words


def _case_name(m: re.Match[str]) -> Authority | None:
    """A case cited by name only ("See Palsgraf v. Long Island R. Co."), keyed by its words."""
    left = _strip_joins(_plaintiff(m.group(1).replace(",", "").split()))
    right = _strip_joins(_defendant(m.group(2).split()))
    if not left or not right or len(" ".join(left)) < 2:
        return None
    if len(left) == 1 and left[0].lower() in _NOT_A_PARTY:
        return None  # "federal v. state law", "plaintiff v. defendant"
    name = f"{' '.join(left)} v. {' '.join(right).rstrip('.,')}"
    if not re.search(r"[A-Za-z]{2}", name.split(" v. ")[1]):
        return None
    return Authority("case:" + " ".join(tokens(name)), name, "case")


_PATTERNS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], Authority | None]], ...] = (
    (CONST_RE, _constitution),
    (ORDINAL_AMEND_RE, lambda m: _amendment(_ORDINALS.index(m.group(1).lower()) + 1)),
    (ROMAN_AMEND_RE, lambda m: _amendment(_roman(m.group(1)))),
    (ARTICLE_RE, lambda m: _article(_roman(m.group(1)), m.group(2))),
    (UCC_RE, _ucc),
    (CASE_NAME_RE, _case_name),
)
"""The patterns after the rules, in order of precedence (an earlier match wins an overlap)."""


def _pattern_citations(text: str, context: str) -> Iterator[_Found]:
    yield from _rule_citations(text, context)
    for regex, build in _PATTERNS:
        for m in regex.finditer(text):
            auth = build(m)
            if auth is not None:
                yield m.start(), m.end(), auth, _written(text, *m.span())


def extract_authorities(text: str, context: str = "") -> list[tuple[Authority, str]]:
    """Authorities cited in ``text`` as ``(authority, the citation as written)``, in order
    (:func:`locate_authorities` without the spans)."""
    return [(auth, cite) for _, _, auth, cite in locate_authorities(text, context)]


def locate_authorities(text: str, context: str = "") -> list[tuple[int, int, Authority, str]]:
    """Authorities cited in ``text`` as ``(start, end, authority, the citation as written)``, in
    order of their start (a full case citation's span begins at its case name).

    eyecite finds the case and statute citations and resolves their short forms ("392 U.S. at
    21", "Id. at 5", "supra") to the full citation; patterns find what eyecite does not know:
    court rules, constitutional provisions, U.C.C. sections and case names without a reporter,
    unless the text is part of a citation eyecite found. ``context`` (the passage's source and
    title) decides which rule family a bare "Rule 803(2)" belongs to. Subdivisions ("(b)(6)")
    stay in the citation, not in the authority's identity."""
    found = _eyecite_citations(text)
    taken = [(s, e) for s, e, _, _ in found]
    for start, end, auth, cite in _pattern_citations(text, context):
        if not any(s < end and start < e for s, e in taken):
            taken.append((start, end))
            found.append((start, end, auth, cite))
    found.sort(key=lambda f: f[0])
    return found


def extract_doctrines(text: str, taxonomy: Taxonomy | None = None) -> Counter[str]:
    """Doctrine ids mentioned in ``text`` with their mention counts (alias matching)."""
    tax = taxonomy or load_taxonomy()
    return tax.resolve(tax.find(text))


@dataclass
class PassageFacts:
    """What the graph records about one passage."""

    id: str
    source: str
    title: str
    doctrines: Counter[str] = field(default_factory=Counter)
    authorities: dict[str, tuple[Authority, list[str]]] = field(default_factory=dict)
    document: Authority | None = None
    """The authority this passage is part of: a user's document carries its own citation."""


def passage_id(p: dict[str, Any]) -> str:
    """Id of a passage as load_corpus (``idx``) or the vector store (``id``) spells it."""
    return str(p.get("idx", p.get("id", "")))


def document_authority(citation: str, title: str = "") -> Authority | None:
    """The authority a document's own ``citation`` names ("Terry v. Ohio, 392 U.S. 1 (1968)"
    or "392 U.S. 1"): the first one found, named by ``title`` when that names the parties and
    the citation does not; a citation nothing recognises is kept as written (kind document)."""
    citation = " ".join(citation.split())
    if not citation:
        return None
    found = extract_authorities(citation)
    if not found:
        return Authority(citation, title or citation, "document")
    auth = found[0][0]
    if auth.kind == "case" and auth.name == auth.id and " v. " in title:
        auth = replace(auth, name=title)
    return auth


def extract(passage: dict[str, Any], taxonomy: Taxonomy | None = None) -> PassageFacts:
    """Doctrine mentions and citations of one passage (its title and text), and the authority
    it is part of when its metadata has a ``citation`` (it does not cite itself)."""
    tax = taxonomy or load_taxonomy()
    meta = passage.get("metadata") or {}
    source = str(passage.get("source") or meta.get("source") or "")
    title = str(passage.get("title") or meta.get("title") or "")
    body = f"{title}\n{passage.get('text') or ''}" if title else str(passage.get("text") or "")
    doc = document_authority(str(passage.get("citation") or meta.get("citation") or ""), title)
    facts = PassageFacts(
        passage_id(passage), source, title, extract_doctrines(body, tax), document=doc
    )
    own = {doc.id, "case:" + " ".join(tokens(doc.name))} if doc else set()  # its cite, its name
    for auth, cite in extract_authorities(body, context=f"{source} {title}"):
        if auth.id not in own:
            facts.authorities.setdefault(auth.id, (auth, []))[1].append(cite)
    return facts


# ------------------------------------------------------------------------------------------------
# Backends: embedded (Kùzu lineage) and Neo4j, the same Cypher
# ------------------------------------------------------------------------------------------------


class GraphBackend:
    """What the graph code needs from a database: run Cypher with parameters. Every backend runs
    the same queries; only its ``schema`` statements differ."""

    name: str
    where: str
    schema: tuple[str, ...] = ()

    def run(self, cypher: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        raise NotImplementedError

    def ensure_schema(self) -> None:
        for stmt in self.schema:
            self.run(stmt)

    def drop_all(self) -> None:
        """Delete every node and edge (the schema stays)."""
        for label in (*NODE_TYPES, "Meta"):
            self.run(f"MATCH (n:{label}) DETACH DELETE n")

    def close(self) -> None:
        raise NotImplementedError


EMBEDDED_SCHEMA = (
    "CREATE NODE TABLE IF NOT EXISTS Passage(id STRING, source STRING, title STRING, "
    "done BOOLEAN, PRIMARY KEY(id))",
    "CREATE NODE TABLE IF NOT EXISTS Doctrine(id STRING, name STRING, subject STRING, "
    "description STRING, aliases STRING[], PRIMARY KEY(id))",
    "CREATE NODE TABLE IF NOT EXISTS Authority(id STRING, name STRING, kind STRING, "
    "PRIMARY KEY(id))",
    "CREATE NODE TABLE IF NOT EXISTS Subject(id STRING, name STRING, PRIMARY KEY(id))",
    "CREATE NODE TABLE IF NOT EXISTS Meta(key STRING, value STRING, PRIMARY KEY(key))",
    "CREATE REL TABLE IF NOT EXISTS MENTIONS(FROM Passage TO Doctrine, count INT64)",
    "CREATE REL TABLE IF NOT EXISTS CITES(FROM Passage TO Authority, count INT64, cite STRING)",
    "CREATE REL TABLE IF NOT EXISTS TEXT_OF(FROM Passage TO Authority)",
    "CREATE REL TABLE IF NOT EXISTS PART_OF(FROM Doctrine TO Subject)",
    "CREATE REL TABLE IF NOT EXISTS ELEMENT_OF(FROM Doctrine TO Doctrine)",
    "CREATE REL TABLE IF NOT EXISTS EXCEPTION_TO(FROM Doctrine TO Doctrine)",
    "CREATE REL TABLE IF NOT EXISTS RELATED_TO(FROM Doctrine TO Doctrine)",
)
NEO4J_SCHEMA = tuple(
    f"CREATE CONSTRAINT {label.lower()}_{key} IF NOT EXISTS FOR (n:{label}) REQUIRE n.{key} IS UNIQUE"
    for label, key in (
        ("Passage", "id"),
        ("Doctrine", "id"),
        ("Authority", "id"),
        ("Subject", "id"),
        ("Meta", "key"),
    )
)


class EmbeddedBackend(GraphBackend):
    """The embedded database (:data:`ENGINE`) in one file.

    One read-write ``Database`` per file per process (the engine locks the file); calls are
    serialised by a lock because a connection is not meant for concurrent queries."""

    schema = EMBEDDED_SCHEMA

    def __init__(self, path: Path, read_only: bool = False) -> None:
        try:
            self._mod = importlib.import_module(ENGINE)
        except ImportError as exc:
            raise GraphError(
                f"the graph engine package {ENGINE!r} is not installed: pip install {ENGINE}"
            ) from exc
        self.name = ENGINE
        self.path = Path(path)
        self.where = str(self.path)
        self.read_only = read_only
        self._lock = threading.RLock()
        _load_llama_first()
        try:
            if not read_only:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._mod.Database(
                str(self.path),
                read_only=read_only,
                max_num_threads=EMBEDDED_THREADS,
                buffer_pool_size=EMBEDDED_BUFFER_POOL,
                max_db_size=EMBEDDED_MAX_DB_SIZE,
            )
            self._conn = self._mod.Connection(self._db)
        except Exception as exc:
            raise GraphError(
                f"cannot open the graph database {self.path}: {short_error(exc)} — is another process "
                "writing it? (the embedded engine allows one writer)"
            ) from None

    def run(self, cypher: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self._lock, self._conn.execute(cypher, params or {}) as result:
            return result.rows_as_dict().get_all()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._db.close()


class Neo4jBackend(GraphBackend):
    """Neo4j through the official ``neo4j`` driver (``NEO4J_URI``, ``NEO4J_USER``,
    ``NEO4J_PASSWORD``, ``NEO4J_DATABASE``). ``driver`` may be given (tests pass a fake)."""

    schema = NEO4J_SCHEMA

    def __init__(
        self,
        uri: str,
        user: str = "neo4j",
        password: str | None = None,
        database: str | None = None,
        driver: Any = None,
    ) -> None:
        self.name = "neo4j"
        self.where = uri
        self.database = database
        if driver is None:
            try:
                from neo4j import GraphDatabase
            except ImportError as exc:
                raise GraphError(
                    "NEO4J_URI is set but the driver is missing: pip install neo4j"
                ) from exc
            try:
                driver = GraphDatabase.driver(uri, auth=(user, password or ""))
                driver.verify_connectivity()
            except Exception as exc:
                raise GraphError(
                    f"cannot reach Neo4j at {uri}: {short_error(exc)} — is it running? Check NEO4J_URI, "
                    "NEO4J_USER and NEO4J_PASSWORD"
                ) from None
        self._driver = driver

    def run(self, cypher: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        kwargs = {"database": self.database} if self.database else {}
        with self._driver.session(**kwargs) as session:
            result = session.run(cypher, params or {})
            return [record.data() for record in result]

    def close(self) -> None:
        self._driver.close()


def graph_path(settings: Settings) -> Path:
    """File of the embedded graph: ``<GRAPH_DIR or CHROMA_DIR/graph>/<passage collection>.<engine>``
    (one graph per passage collection, like the BM25 index)."""

    folder = (
        Path(settings.graph.dir).expanduser()
        if settings.graph.dir
        else Path(settings.retrieval.chroma_dir).expanduser() / "graph"
    )
    return folder.resolve() / f"{rag_utils.collection_name(settings)}.{ENGINE}"


_graphs: dict[tuple, GraphBackend] = {}


def _graph_key(s: Settings) -> tuple:
    if s.graph.neo4j_uri:
        return ("neo4j", s.graph.neo4j_uri, s.graph.neo4j_user, s.graph.neo4j_database)
    return ("embedded", ENGINE, str(graph_path(s)))


def _open_embedded(s: Settings, write: bool) -> EmbeddedBackend:
    """The embedded file, read-only when it exists and no write is asked, unless it was built by
    another version (its schema and taxonomy are then brought up to date)."""
    path = graph_path(s)
    try:
        backend = EmbeddedBackend(path, read_only=not write and path.exists())
    except GraphError:
        if write or not path.exists():
            raise
        # a read-only open fails on a file left with a write-ahead log to replay
        return EmbeddedBackend(path, read_only=False)
    if backend.read_only and _built_version(backend) != _version(load_taxonomy()):
        backend.close()
        backend = EmbeddedBackend(path, read_only=False)
    return backend


def get_graph(settings: Settings, *, write: bool = False) -> GraphBackend:
    """The configured graph with its schema and taxonomy in place: Neo4j when NEO4J_URI is set,
    else the embedded database file (created on first use). One handle per process; a handle
    opened read-only is reopened for writing when ``write`` is asked."""
    key = _graph_key(settings)
    with _lock:
        backend = _graphs.get(key)
        if backend is not None and not (write and getattr(backend, "read_only", False)):
            return backend
        if backend is not None:
            backend.close()
            del _graphs[key]
        if key[0] == "neo4j":
            backend = Neo4jBackend(
                settings.graph.neo4j_uri or "",
                settings.graph.neo4j_user,
                settings.graph.neo4j_password,
                settings.graph.neo4j_database,
            )
        else:
            backend = _open_embedded(settings, write)
        if not getattr(backend, "read_only", False):
            backend.ensure_schema()
            sync_taxonomy(backend)
        _graphs[key] = backend
        return backend


def close_graphs() -> None:
    """Close every open graph handle and forget the in-memory caches (tests; a process that
    rebuilds a graph file)."""
    with _lock:
        for backend in _graphs.values():
            try:
                backend.close()
            except Exception as exc:  # closing is best effort
                logger.debug("closing graph %s: %s", backend.where, exc)
        _graphs.clear()
    reset_caches()


# ------------------------------------------------------------------------------------------------
# Writing: taxonomy and passages (the same Cypher on every backend)
# ------------------------------------------------------------------------------------------------

Q_META_GET = "MATCH (m:Meta) WHERE m.key = $key RETURN m.value AS value"
Q_META_SET = "MERGE (m:Meta {key: $key}) SET m.value = $value"
Q_SUBJECTS = "UNWIND $rows AS r MERGE (s:Subject {id: r.id}) SET s.name = r.name"
Q_DOCTRINES = (
    "UNWIND $rows AS r MERGE (d:Doctrine {id: r.id}) "
    "SET d.name = r.name, d.subject = r.subject, d.description = r.description, d.aliases = r.aliases"
)
Q_PART_OF = (
    "UNWIND $rows AS r MATCH (d:Doctrine {id: r.id}), (s:Subject {id: r.subject}) "
    "MERGE (d)-[:PART_OF]->(s)"
)
Q_RELATION = "UNWIND $rows AS r MATCH (a:Doctrine {id: r.src}), (b:Doctrine {id: r.dst}) MERGE (a)-[:{rel}]->(b)"
Q_DONE = "UNWIND $ids AS i MATCH (p:Passage {id: i}) WHERE p.done = true RETURN p.id AS id"
Q_PASSAGES = (
    "UNWIND $rows AS r MERGE (p:Passage {id: r.id}) "
    "SET p.source = r.source, p.title = r.title, p.done = false"
)
Q_AUTHORITIES = (
    "UNWIND $rows AS r MERGE (a:Authority {id: r.id}) "
    "SET a.name = CASE WHEN r.name = r.id AND a.name IS NOT NULL THEN a.name ELSE r.name END, "
    "a.kind = r.kind"
)
"""An authority keeps the case name an earlier passage gave it when this one cites it bare."""
Q_MENTIONS = (
    "UNWIND $rows AS r MATCH (p:Passage {id: r.pid}), (d:Doctrine {id: r.did}) "
    "MERGE (p)-[m:MENTIONS]->(d) SET m.count = r.count"
)
Q_CITES = (
    "UNWIND $rows AS r MATCH (p:Passage {id: r.pid}), (a:Authority {id: r.aid}) "
    "MERGE (p)-[c:CITES]->(a) SET c.count = r.count, c.cite = r.cite"
)
Q_TEXT_OF = (
    "UNWIND $rows AS r MATCH (p:Passage {id: r.pid}), (a:Authority {id: r.aid}) "
    "MERGE (p)-[:TEXT_OF]->(a)"
)
Q_MARK_DONE = "UNWIND $ids AS i MATCH (p:Passage {id: i}) SET p.done = true"
Q_COUNT_NODES = "MATCH (n:{label}) RETURN count(n) AS n"
Q_COUNT_EDGES = "MATCH ()-[e:{rel}]->() RETURN count(e) AS n"


def _subject_id(name: str) -> str:
    return "-".join(tokens(name))


def _version(tax: Taxonomy) -> str:
    return f"{tax.fingerprint}+{EXTRACTOR_VERSION}"


def _built_version(backend: GraphBackend) -> str | None:
    """The taxonomy and citation extraction the graph was built with (None: not built)."""
    got = backend.run(Q_META_GET, {"key": "taxonomy"})
    return got[0]["value"] if got else None


def sync_taxonomy(backend: GraphBackend) -> None:
    """Write the taxonomy's subjects, doctrines and relations unless the graph already has this
    version of them and of the citation extraction (recorded in a Meta node). A change leaves old
    MENTIONS and CITES edges in place: ``python load_corpus.py graph`` rebuilds them."""
    tax = load_taxonomy()
    built = _built_version(backend)
    if built == _version(tax):
        return
    if built is not None:
        logger.warning(
            "the doctrine taxonomy or the citation extraction changed since the graph was built: "
            "run `python load_corpus.py graph` to re-link the passages"
        )
    backend.run(Q_SUBJECTS, {"rows": [{"id": _subject_id(n), "name": n} for n in tax.subjects]})
    rows = [
        {
            "id": d.id,
            "name": d.name,
            "subject": d.subject,
            "description": d.description,
            "aliases": tax.aliases_of(d.id),
        }
        for d in tax.doctrines.values()
    ]
    backend.run(Q_DOCTRINES, {"rows": rows})
    backend.run(
        Q_PART_OF,
        {"rows": [{"id": d.id, "subject": _subject_id(d.subject)} for d in tax.doctrines.values()]},
    )
    for field_name, rel in RELATIONS.items():
        pairs = [
            {"src": d.id, "dst": other}
            for d in tax.doctrines.values()
            for other in getattr(d, field_name)
        ]
        if pairs:
            backend.run(Q_RELATION.replace("{rel}", rel), {"rows": pairs})
    backend.run(Q_META_SET, {"key": "taxonomy", "value": _version(tax)})


def done_ids(backend: GraphBackend, ids: Sequence[str]) -> set[str]:
    """Passages already complete in the graph (their edges written)."""
    out: set[str] = set()
    for i in range(0, len(ids), 5000):
        out.update(r["id"] for r in backend.run(Q_DONE, {"ids": list(ids[i : i + 5000])}))
    return out


def write_facts(backend: GraphBackend, facts: Sequence[PassageFacts]) -> None:
    """Write passages with their edges, then mark them done: an interrupted batch is redone
    (every write is a MERGE) on the next load."""
    if not facts:
        return
    backend.run(
        Q_PASSAGES, {"rows": [{"id": f.id, "source": f.source, "title": f.title} for f in facts]}
    )
    auths: dict[str, Authority] = {}
    for a in (a for f in facts for a in (f.document, *(a for a, _ in f.authorities.values()))):
        if a is not None and (a.id not in auths or a.name != a.id):
            auths[a.id] = a  # a case name wins over its bare citation
    if auths:
        backend.run(
            Q_AUTHORITIES,
            {"rows": [{"id": a.id, "name": a.name, "kind": a.kind} for a in auths.values()]},
        )
    mentions = [
        {"pid": f.id, "did": did, "count": int(n)} for f in facts for did, n in f.doctrines.items()
    ]
    if mentions:
        backend.run(Q_MENTIONS, {"rows": mentions})
    cites = [
        {"pid": f.id, "aid": aid, "count": len(c), "cite": c[0]}
        for f in facts
        for aid, (_, c) in f.authorities.items()
    ]
    if cites:
        backend.run(Q_CITES, {"rows": cites})
    texts = [{"pid": f.id, "aid": f.document.id} for f in facts if f.document is not None]
    if texts:
        backend.run(Q_TEXT_OF, {"rows": texts})
    backend.run(Q_MARK_DONE, {"ids": [f.id for f in facts]})


def add_passages(
    passages: Sequence[dict[str, Any]],
    settings: Settings,
    *,
    backend: GraphBackend | None = None,
    progress: bool = False,
) -> int:
    """Extract and write the passages not yet complete in the graph; returns how many were added.

    Passages are dicts as load_corpus reads them (``idx, text, source, title``) or as the vector
    store returns them (``id, text, metadata``). Safe to interrupt and rerun."""
    if not passages:
        return 0
    g = backend or get_graph(settings, write=True)
    tax = load_taxonomy()
    ids = [passage_id(p) for p in passages]
    present = done_ids(g, ids)
    todo = [p for p, pid in zip(passages, ids, strict=True) if pid not in present]
    if not todo:
        return 0
    from tqdm import tqdm

    with tqdm(
        total=len(todo), unit="passage", desc="graph", disable=not progress, leave=False
    ) as bar:
        for i in range(0, len(todo), BATCH):
            batch = todo[i : i + BATCH]
            write_facts(g, [extract(p, tax) for p in batch])
            bar.update(len(batch))
    _cache.clear()
    return len(todo)


def on_passages_loaded(passages: Sequence[dict[str, Any]], settings: Settings) -> None:
    """The vector load's hook: add ``passages`` to the graph unless GRAPH_BUILD is off (those
    already in it are skipped, so the graph catches up with the vector store on every load). A
    graph failure is logged, never raised: the vector load stays usable, and ``python
    load_corpus.py graph`` builds the graph later."""
    if not settings.graph.build:
        return
    try:
        added = add_passages(passages, settings)
    except Exception as exc:
        logger.warning(
            "the knowledge graph was not updated (%s); run `python load_corpus.py graph` to build it",
            short_error(exc),
        )
        return
    if added:
        logger.info("knowledge graph: %d passages added", added)


def rebuild(settings: Settings, *, progress: bool = True) -> dict[str, Any]:
    """Rebuild the graph from every passage of the vector store; returns the build's numbers
    (passages, seconds, nodes and edges by type)."""

    start = time.perf_counter()
    if settings.graph.neo4j_uri:
        g = get_graph(settings, write=True)
        g.drop_all()
    else:
        close_graphs()
        path = graph_path(settings)
        for p in (path, path.with_name(path.name + ".wal")):
            p.unlink(missing_ok=True)
        g = get_graph(settings, write=True)
    sync_taxonomy(g)
    passages = list(rag_utils.get_store(settings).iter_all())
    added = add_passages(passages, settings, backend=g, progress=progress)
    seconds = time.perf_counter() - start
    return {"passages": added, "seconds": round(seconds, 2), **graph_counts(g)}


def graph_counts(backend: GraphBackend) -> dict[str, dict[str, int]]:
    """``{"nodes": {type: n}, "edges": {type: n}}``."""
    nodes = {
        label: int(backend.run(Q_COUNT_NODES.replace("{label}", label))[0]["n"])
        for label in NODE_TYPES
    }
    edges = {
        rel: int(backend.run(Q_COUNT_EDGES.replace("{rel}", rel))[0]["n"]) for rel in EDGE_TYPES
    }
    return {"nodes": nodes, "edges": edges}


def graph_status(settings: Settings) -> dict[str, Any]:
    """Engine, location and node/edge counts by type, for ``load_corpus.py status``. Never
    creates a graph: an absent embedded file reports zero counts."""
    engine = "neo4j" if settings.graph.neo4j_uri else ENGINE
    empty = {"nodes": dict.fromkeys(NODE_TYPES, 0), "edges": dict.fromkeys(EDGE_TYPES, 0)}
    if (
        not settings.graph.neo4j_uri
        and not graph_path(settings).exists()
        and _graph_key(settings) not in _graphs
    ):
        return {"engine": engine, "where": str(graph_path(settings)), "state": "absent", **empty}
    try:
        g = get_graph(settings)
        counts = graph_counts(g)
    except Exception as exc:
        return {"engine": engine, "state": f"error: {short_error(exc)}", **empty}
    return {"engine": engine, "where": g.where, "state": "ready", **counts}


# ------------------------------------------------------------------------------------------------
# Search
# ------------------------------------------------------------------------------------------------

Q_ALIAS_MATCH = (
    "MATCH (d:Doctrine) UNWIND d.aliases AS a WITH d, a WHERE $q CONTAINS a "
    "RETURN d.id AS id, a AS alias"
)
Q_AUTHORITY_BY_ID = "MATCH (a:Authority) WHERE a.id IN $ids RETURN a.id AS id, a.name AS name"
Q_DOCTRINE_PASSAGES = (
    "MATCH (p:Passage)-[m:MENTIONS]->(d:Doctrine) WHERE d.id IN $ids AND NOT p.id IN $exclude "
    "RETURN p.id AS pid, d.id AS did, m.count AS n"
)
Q_AUTHORITY_PASSAGES = (
    "MATCH (p:Passage)-[c:CITES]->(a:Authority) WHERE a.id IN $ids AND NOT p.id IN $exclude "
    "RETURN p.id AS pid, a.id AS aid, c.count AS n"
)
Q_DOCTRINE_DF = "MATCH (p:Passage)-[:MENTIONS]->(d:Doctrine) WHERE d.id IN $ids RETURN d.id AS id, count(p) AS df"
Q_AUTHORITY_TEXTS = (
    "MATCH (p:Passage)-[:TEXT_OF]->(a:Authority) WHERE a.id IN $ids AND NOT p.id IN $exclude "
    "RETURN p.id AS pid, a.id AS aid, 1 AS n"
)
Q_CASE_NAMES = (
    "MATCH (a:Authority) WHERE a.kind IN ['case', 'document'] AND a.name <> a.id "
    "RETURN a.id AS id, a.name AS name"
)
Q_CITED_BY_TEXTS = (
    "MATCH (x:Authority)<-[:TEXT_OF]-(:Passage)-[:CITES]->(y:Authority) WHERE x.id IN $ids "
    "RETURN DISTINCT x.id AS src, y.id AS dst, y.name AS name"
)
Q_CITING_TEXTS = (
    "MATCH (x:Authority)<-[:CITES]-(:Passage)-[:TEXT_OF]->(y:Authority) WHERE x.id IN $ids "
    "RETURN DISTINCT x.id AS src, y.id AS dst, y.name AS name"
)
Q_AUTHORITY_DF = (
    "MATCH (p:Passage)-[:CITES]->(a:Authority) WHERE a.id IN $ids RETURN a.id AS id, count(p) AS df"
)
Q_NEIGHBOURS = (
    "MATCH (d:Doctrine)-[:{rel}]-(e:Doctrine) WHERE d.id IN $ids RETURN d.id AS src, e.id AS dst"
)
Q_PASSAGE_COUNT = "MATCH (p:Passage) RETURN count(p) AS n"

_cache: dict[tuple, Any] = {}
"""Per-graph memo of the passage count (cleared when passages are added)."""


@dataclass
class GraphHit:
    """A passage the graph reached: its score and the path that led there."""

    id: str
    score: float
    path: list[str] = field(default_factory=list)


@dataclass
class _Seed:
    weight: float
    why: str
    name: str = ""
    """Display name of the node (authorities; doctrines are named by the taxonomy)."""


def _passage_count(g: GraphBackend) -> int:
    key = ("count", g.where)
    if key not in _cache:
        _cache[key] = int(g.run(Q_PASSAGE_COUNT)[0]["n"])
    return _cache[key]


def alias_doctrines(g: GraphBackend, query: str) -> dict[str, _Seed]:
    """Doctrines whose aliases occur in ``query`` — found by Cypher over the Doctrine nodes'
    aliases, then reduced to the longest non-overlapping matches (so "procedural due process"
    does not also count as "due process")."""
    q = normalize(query)
    rows = g.run(Q_ALIAS_MATCH, {"q": q})
    if not rows:
        return {}
    hits = AliasIndex((str(r["alias"]).split(), str(r["id"])) for r in rows)
    seeds: dict[str, _Seed] = {}
    for m in hits.find(q.split()):
        share = 1.0 / len(m.doctrine_ids)  # an alias naming several doctrines counts less for each
        for did in m.doctrine_ids:
            seeds.setdefault(did, _Seed(0.0, f"alias '{m.alias}'")).weight += share
    return seeds


def _case_names(g: GraphBackend) -> AliasIndex:
    """The graph's case and document authorities by the words of their names ("terry v ohio"
    -> "392 U.S. 1"), memoised per graph like the passage count."""
    key = ("cases", g.where)
    if key not in _cache:
        names = ((tokens(str(r["name"] or "")), str(r["id"])) for r in g.run(Q_CASE_NAMES))
        _cache[key] = AliasIndex((w, i) for w, i in names if len(w) >= 3)  # "a v b" at least
    return _cache[key]


def query_authorities(g: GraphBackend, query: str) -> dict[str, _Seed]:
    """Authorities of the graph that the query cites ("392 U.S. 1", "28 U.S.C. § 1441", "FRE
    803") or names ("Terry v. Ohio": the name of a case some passage cites or is part of)."""
    ids = [a.id for a, _ in extract_authorities(query)]
    ids += [i for m in _case_names(g).find(query) for i in m.doctrine_ids]
    if not ids:
        return {}
    rows = g.run(Q_AUTHORITY_BY_ID, {"ids": list(dict.fromkeys(ids))})
    return {str(r["id"]): _Seed(1.0, f"cites {r['name']}", str(r["name"])) for r in rows}


def _authority_neighbours(g: GraphBackend, seeds: dict[str, _Seed]) -> dict[str, _Seed]:
    """One citation hop from the seed authorities, weight x PRINCIPLE_DECAY: what the passages
    of a seed document cite, and the documents whose passages cite a seed."""
    out: dict[str, _Seed] = {}
    for verb, cypher in (("cites", Q_CITED_BY_TEXTS), ("is cited by", Q_CITING_TEXTS)):
        for r in g.run(cypher, {"ids": list(seeds)}):
            src, dst, name = str(r["src"]), str(r["dst"]), str(r["name"] or r["dst"])
            weight = seeds[src].weight * PRINCIPLE_DECAY
            if dst not in seeds and (dst not in out or out[dst].weight < weight):
                out[dst] = _Seed(weight, f"{seeds[src].why} -> {verb} {name}", name)
    return out


_doctrine_vectors: dict[tuple, tuple[list[str], Any]] = {}


def doctrine_vectors(settings: Settings) -> tuple[list[str], np.ndarray]:
    """Embeddings of every doctrine's name and description, computed once per embedder and
    taxonomy version and cached on disk beside the graph (``doctrines-<model>-<version>.npy``)."""
    import numpy as np

    tax = load_taxonomy()
    model = rag_utils.embedder_name(settings)
    folder = graph_path(settings).parent
    key = (model, tax.fingerprint, str(folder))
    with _lock:
        if key in _doctrine_vectors:
            return _doctrine_vectors[key]
    ids = list(tax.doctrines)
    cache = folder / f"doctrines-{rag_utils.sanitize_model_name(model)}-{tax.fingerprint}.npy"
    try:
        vecs = np.load(cache)
    except (OSError, ValueError):
        vecs = None
    if vecs is None or vecs.shape[0] != len(ids):
        embedder = rag_utils.get_embedder(settings)
        vecs = np.asarray(
            embedder.embed_documents([tax[i].text_for_embedding() for i in ids]), dtype=np.float32
        )
        try:
            folder.mkdir(parents=True, exist_ok=True)
            np.save(cache, vecs)
        except OSError as exc:
            logger.debug("cannot cache doctrine embeddings at %s: %s", cache, exc)
    with _lock:
        _doctrine_vectors[key] = (ids, vecs)
    return ids, vecs


def reset_caches() -> None:
    """Forget every in-memory cache (passage counts, doctrine, query and passage vectors)."""
    with _lock:
        _cache.clear()
        _doctrine_vectors.clear()
        _embed_query.cache_clear()
        _passage_cache.clear()


def embed_query(query: str, settings: Settings) -> np.ndarray:
    """The query's embedding, remembered for the last 64 queries (graph_search, its graph
    modes and link_doctrines embed the same question)."""
    return _embed_query(rag_utils.get_embedder(settings), query)


@functools.lru_cache(maxsize=64)
def _embed_query(embedder: Any, query: str) -> np.ndarray:
    return embedder.embed_query(query)


def _expand(
    g: GraphBackend, seeds: dict[str, _Seed], exclude: list[str], kind: str = "doctrine"
) -> dict[str, GraphHit]:
    """Passages of the seed doctrines (or authorities), scored
    sum(seed weight x idf x (1 + log mentions)); each keeps the path of its best contribution."""
    if not seeds:
        return {}
    ids = list(seeds)
    if kind == "doctrine":
        q_pass, q_df, edge = Q_DOCTRINE_PASSAGES, Q_DOCTRINE_DF, "MENTIONS"
    else:
        q_pass, q_df, edge = Q_AUTHORITY_PASSAGES, Q_AUTHORITY_DF, "CITES"
    df = {str(r["id"]): int(r["df"]) for r in g.run(q_df, {"ids": ids})}
    total = max(1, _passage_count(g))
    rows = [{**r, "edge": edge} for r in g.run(q_pass, {"ids": ids, "exclude": exclude})]
    if kind == "authority":  # the passages of the seed documents themselves
        rows += [
            {**r, "edge": "TEXT_OF"}
            for r in g.run(Q_AUTHORITY_TEXTS, {"ids": ids, "exclude": exclude})
        ]
    hits: dict[str, GraphHit] = {}
    best: dict[str, float] = {}
    tax = load_taxonomy()
    for r in rows:
        pid, nid, n = str(r["pid"]), str(r.get("did") or r.get("aid")), int(r["n"] or 1)
        idf = math.log(1.0 + total / max(1, df.get(nid, 1)))
        contrib = seeds[nid].weight * idf * (1.0 + math.log(n))
        hit = hits.setdefault(pid, GraphHit(pid, 0.0))
        hit.score += contrib
        if contrib > best.get(pid, -1.0):
            best[pid] = contrib
            target = (
                tax[nid].name
                if kind == "doctrine" and nid in tax.doctrines
                else seeds[nid].name or nid
            )
            hit.path = [
                f"query {seeds[nid].why}",
                f"{kind} {target}",
                f"{r['edge']} <- passage {pid}",
            ]
    return hits


def _rank(hits: dict[str, GraphHit], k: int) -> list[GraphHit]:
    return sorted(hits.values(), key=lambda h: (-h.score, h.id))[:k]


def _fuse(
    rankings: Sequence[Sequence[GraphHit]], k: int, weights: Sequence[float] | None = None
) -> list[GraphHit]:
    """The best ``k`` by weighted reciprocal rank fusion (:func:`rag_utils.rrf_scores`); each
    passage keeps the path from the list that ranks it best (the first on a tie)."""
    score = rag_utils.rrf_scores([[h.id for h in ranking] for ranking in rankings], weights)
    best: dict[str, tuple[int, list[str]]] = {}
    for ranking in rankings:
        for r, h in enumerate(ranking, start=1):
            if h.id not in best or r < best[h.id][0]:
                best[h.id] = (r, h.path)
    return _rank({pid: GraphHit(pid, total, best[pid][1]) for pid, total in score.items()}, k)


def _keyword(
    g: GraphBackend,
    query: str,
    exclude: list[str],
    seeds: dict[str, _Seed] | None = None,
    *,
    hop: bool = False,
) -> dict[str, GraphHit]:
    """Passages mentioning a doctrine the query names, citing an authority it cites or names,
    or part of that authority (a document whose own citation it is).

    ``hop`` (the principles mode) adds the doctrines' elements, exceptions and related doctrines
    and the authorities one citation away (what the cited document cites, the documents that
    cite it): one hop, weight x PRINCIPLE_DECAY."""
    seeds = alias_doctrines(g, query) if seeds is None else seeds
    cited = query_authorities(g, query)
    if hop and seeds:
        seeds = _doctrine_neighbours(g, seeds)
    if hop and cited:
        cited = {**_authority_neighbours(g, cited), **cited}
    return _merge(_expand(g, seeds, exclude), _expand(g, cited, exclude, kind="authority"))


def _merge(hits: dict[str, GraphHit], more: dict[str, GraphHit]) -> dict[str, GraphHit]:
    """``more`` added into ``hits``: scores summed, the path of the larger contribution kept."""
    for pid, h in more.items():
        cur = hits.get(pid)
        if cur is None:
            hits[pid] = h
            continue
        if h.score > cur.score:
            cur.path = h.path
        cur.score += h.score
    return hits


def _doctrine_neighbours(g: GraphBackend, seeds: dict[str, _Seed]) -> dict[str, _Seed]:
    """The seed doctrines and their neighbours by one relation, weight x PRINCIPLE_DECAY."""
    tax = load_taxonomy()
    expanded = {did: _Seed(s.weight, s.why) for did, s in seeds.items()}
    for rel in RELATIONS.values():
        for r in g.run(Q_NEIGHBOURS.replace("{rel}", rel), {"ids": list(seeds)}):
            src, dst = str(r["src"]), str(r["dst"])
            weight = seeds[src].weight * PRINCIPLE_DECAY
            if dst not in expanded or expanded[dst].weight < weight:
                why = f"{seeds[src].why} -> {tax[src].name} -[{rel}]- {tax[dst].name}"
                expanded[dst] = _Seed(weight, why)
    return expanded


def _semantic(
    g: GraphBackend, query: str, exclude: list[str], qvec: np.ndarray, settings: Settings
) -> dict[str, GraphHit]:
    """Passages of the doctrine(s) whose description is closest to the query."""
    tax = load_taxonomy()
    ids, vecs = doctrine_vectors(settings)
    sims = vecs @ qvec
    seeds = {
        ids[i]: _Seed(float(sims[i]), f"semantic {float(sims[i]):.2f} '{tax[ids[i]].name}'")
        for i in sims.argsort()[::-1][:SEMANTIC_TOP]
    }
    return _expand(g, seeds, exclude)


PASSAGE_VECTOR_CACHE = 20_000
"""Passage embeddings kept in memory (~30 MB for MiniLM): the passages of common doctrines come
back query after query, and reading them from the store was 40% of a graph search."""
_passage_cache: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
"""Keyed by the store's folder, collection and passage id (two stores never share vectors)."""


def _passage_vectors(store: Any, ids: Sequence[str]) -> dict[str, np.ndarray]:
    """Embeddings of ``ids`` from the store (missing ids are left out), through an LRU cache."""
    import numpy as np

    where = (str(store.bm25_dir), store.name)
    out: dict[str, np.ndarray] = {}
    missing = []
    with _lock:
        for pid in ids:
            vec = _passage_cache.get((*where, pid))
            if vec is None:
                missing.append(pid)
            else:
                _passage_cache.move_to_end((*where, pid))
                out[pid] = vec
    if missing:
        got = store.get(missing, with_embeddings=True)
        with _lock:
            for d in got:
                if d.get("embedding") is not None:
                    out[d["id"]] = np.asarray(d["embedding"], dtype=np.float32)
                    _passage_cache[(*where, d["id"])] = out[d["id"]]
            while len(_passage_cache) > PASSAGE_VECTOR_CACHE:
                _passage_cache.popitem(last=False)
    return out


def _order_by_text(
    candidates: Sequence[dict[str, GraphHit]], qvec: np.ndarray, settings: Settings
) -> list[list[GraphHit]]:
    """Each mode's top CANDIDATES passages by graph score, ordered by cosine to the query +
    GRAPH_WEIGHT x graph score / the mode's best graph score. The graph decides which passages
    are on topic; within that set the text decides the order (graph scores alone tie across the
    many passages that mention the same doctrine). One store read for all modes."""

    tops = [_rank(c, CANDIDATES) for c in candidates]
    wanted = list(dict.fromkeys(h.id for top in tops for h in top))
    if not wanted:
        return [[] for _ in tops]
    store = rag_utils.get_store(settings)
    vecs = _passage_vectors(store, wanted)
    cos = {pid: float(v @ qvec) for pid, v in vecs.items()}
    out = []
    for top in tops:
        best = max((h.score for h in top), default=0.0) or 1.0
        ordered = [
            GraphHit(h.id, cos.get(h.id, 0.0) + GRAPH_WEIGHT * h.score / best, h.path) for h in top
        ]
        out.append(sorted(ordered, key=lambda h: (-h.score, h.id)))
    return out


def search_graph(
    query: str,
    k: int = 10,
    exclude_ids: Iterable[str] = (),
    mode: str = "graph",
    *,
    settings: Settings,
) -> list[GraphHit]:
    """Passage ids the graph reaches for ``query`` with scores and paths, best first, without
    ``exclude_ids``. Modes: keyword, principles, semantic, graph (the three fused by RRF).
    ``combined`` needs the hybrid retrieval too and is served by :func:`graph_search`."""

    if mode not in MODES or mode == "combined":
        raise ValueError(f"unknown graph mode {mode!r}: use keyword, principles, semantic or graph")
    query = (query or "").strip()
    if not query or k <= 0:
        return []
    g = get_graph(settings)
    exclude = [str(i) for i in dict.fromkeys(exclude_ids)]
    qvec = embed_query(query, settings)
    modes = ("keyword", "principles", "semantic") if mode == "graph" else (mode,)
    seeds = alias_doctrines(g, query) if mode != "semantic" else {}
    search = {
        "keyword": lambda: _keyword(g, query, exclude, seeds),
        "principles": lambda: _keyword(g, query, exclude, seeds, hop=True),
        "semantic": lambda: _semantic(g, query, exclude, qvec, settings),
    }
    ordered = _order_by_text([search[m]() for m in modes], qvec, settings)
    if mode != "graph":
        return ordered[0][:k]
    return _fuse([o for o in ordered if o], k)


FILTER_HEADROOM = 4
"""A filtered graph search asks the graph for this many times ``k`` hits and keeps those the
passage filter admits (the graph holds no metadata to filter on)."""


def _admitted(hits: list[GraphHit], allowed: frozenset[str] | None) -> list[GraphHit]:
    """``hits`` inside the passage filter's ``allowed`` ids (all of them when None)."""
    return hits if allowed is None else [h for h in hits if h.id in allowed]


def graph_search(
    query: str,
    k: int = 5,
    exclude_ids: Iterable[str] = (),
    mode: str = "graph",
    *,
    settings: Settings,
    reranker: str = "hybrid",
) -> list[rag_utils.Passage]:
    """Graph retrieval for the agent: passages (:class:`rag_utils.Passage`) as
    :func:`rag_utils.retrieve_documents_multi_query` returns them (``id, text, source, title,
    metadata, dense_score, rerank_score, rank``), texts fetched from the vector store;
    ``metadata`` adds ``graph_mode`` and ``graph_path`` (how the graph reached the passage).

    ``mode="combined"`` fuses ``rag_utils`` retrieval (``reranker``: hybrid dense + BM25 by
    default) with the graph ranking by reciprocal rank fusion, the graph weighted
    COMBINED_GRAPH_WEIGHT."""
    import numpy as np

    excluded = [str(i) for i in dict.fromkeys(exclude_ids)]
    store = rag_utils.get_store(settings)
    allowed = rag_utils.allowed_ids(store, settings)
    headroom = 1 if allowed is None else FILTER_HEADROOM
    if mode == "combined":
        pool = max(k, COMBINED_POOL)
        graph_hits = _admitted(
            search_graph(query, pool * headroom, excluded, "graph", settings=settings), allowed
        )
        dense = rag_utils.retrieve_documents_multi_query(
            [query], k=pool, exclude_ids=excluded, reranker=reranker, settings=settings
        )
        dense_hits = [
            GraphHit(d["id"], float(d.get("rerank_score") or 0.0), [f"{reranker} retrieval"])
            for d in dense
        ]
        hits = _fuse([dense_hits, graph_hits], k, weights=[1.0, COMBINED_GRAPH_WEIGHT])
    else:
        hits = _admitted(
            search_graph(query, k * headroom, excluded, mode, settings=settings), allowed
        )[:k]
    if not hits:
        return []
    docs = {d["id"]: d for d in store.get([h.id for h in hits], with_embeddings=True)}
    q = embed_query(query, settings)
    out: list[rag_utils.Passage] = []
    for h in hits:
        d = docs.get(h.id)
        if d is None:  # in the graph but not in the store (a graph built from another corpus)
            continue
        emb = d.pop("embedding", None)
        d["dense_score"] = float(np.asarray(emb, dtype=np.float32) @ q) if emb is not None else None
        d["rerank_score"] = float(h.score)
        d["metadata"] = {
            **d["metadata"],
            "reranker": f"graph:{mode}",
            "graph_mode": mode,
            "graph_path": " | ".join(h.path),
        }
        d["rank"] = len(out) + 1
        out.append(d)
    return out


# ------------------------------------------------------------------------------------------------
# Issue spotting
# ------------------------------------------------------------------------------------------------

ALIAS_WEIGHT = 0.35
"""Score an alias hit adds to a doctrine's link score (cosine similarities are ~0.1-0.6)."""
MAX_PER_CLAIM = 2
"""Doctrines of one claim (same root) that link_doctrines returns at most."""


def link_doctrines(
    question: str,
    settings: Settings,
    k: int = 6,
    *,
    use_embeddings: bool = True,
) -> list[Doctrine]:
    """The doctrines a question raises, best first: alias matches in the question (longest
    match; an alias shared by n doctrines counts 1/n) plus the embedding cosine of the question
    to each doctrine's description. At most ``MAX_PER_CLAIM`` doctrines of one claim, so that
    one issue cannot crowd out the others. Needs no graph database."""
    tax = load_taxonomy()
    scores: dict[str, float] = defaultdict(float)
    picked: set[str] = set()  # an alias hit or among the top k by similarity
    for m in tax.find(question):
        for did in m.doctrine_ids:
            scores[did] += ALIAS_WEIGHT / len(m.doctrine_ids)
            picked.add(did)
    if use_embeddings:
        ids, vecs = doctrine_vectors(settings)
        sims = vecs @ embed_query(question, settings)
        for did, sim in zip(ids, sims.tolist(), strict=True):
            if sim > 0:
                scores[did] += sim
        picked.update(ids[i] for i in sims.argsort()[::-1][:k])
    ranked = sorted(scores, key=lambda d: (-scores[d], d))
    out: list[Doctrine] = []
    per_root: Counter[str] = Counter()
    for did in ranked:
        root = tax.root(did)
        if did not in picked or per_root[root] >= MAX_PER_CLAIM:
            continue
        per_root[root] += 1
        out.append(tax[did])
        if len(out) >= k:
            break
    return out


def issue_doctrine(issue: str, taxonomy: Taxonomy | None = None) -> str | None:
    """The doctrine an issue label names (its first, longest alias match), or None."""
    tax = taxonomy or load_taxonomy()
    matches = tax.find(issue)
    if not matches:
        return None
    best = max(matches, key=lambda m: (m.end - m.start, -m.start))
    return best.doctrine_ids[0]


def merge_agenda(
    model_issues: Sequence[str],
    linked_doctrines: Sequence[Doctrine],
    *,
    max_items: int | None = None,
) -> list[str]:
    """The research agenda: the model's issues, then the linked doctrines they miss, one item
    per claim. Issues and doctrines that belong to the same claim (a doctrine, its elements and
    exceptions: "First Amendment", "Right to Free Speech" and the public forum doctrine) collapse
    into the first of them, which names the others it absorbed in parentheses. Issues that name
    no doctrine are kept, deduplicated by their words."""
    tax = load_taxonomy()
    order: list[str] = []
    label: dict[str, str] = {}
    extra: dict[str, list[str]] = defaultdict(list)

    def add(key: str, text: str, doctrine_name: str | None) -> None:
        if key not in label:
            order.append(key)
            label[key] = text
        elif (
            doctrine_name
            and doctrine_name.lower() not in label[key].lower()
            and doctrine_name not in extra[key]
        ):
            extra[key].append(doctrine_name)

    for issue in model_issues:
        text = " ".join(str(issue).split())
        if not text:
            continue
        did = issue_doctrine(text, tax)
        key = f"doctrine:{tax.root(did)}" if did else f"text:{' '.join(tokens(text))}"
        add(key, text, tax[did].name if did else None)
    for d in linked_doctrines:
        if d.id not in tax.doctrines:
            continue
        add(f"doctrine:{tax.root(d.id)}", d.name, d.name)
    items = []
    for key in order:
        names = extra.get(key, [])[:3]
        items.append(f"{label[key]} ({'; '.join(names)})" if names else label[key])
    return items[:max_items] if max_items else items
