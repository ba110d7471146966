"""The user's own legal documents (PDF, HTML, DOCX, Markdown, text) read into passages that keep
their pin cites (``load_corpus.py docs``); see docs/ARCHITECTURE.md, "Your own documents".

Every failure is a :class:`DocumentError` whose one-line message names the file and the reason.
"""

from __future__ import annotations

import bisect
import calendar
import contextlib
import hashlib
import io
import itertools
import json
import logging
import math
import re
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import filters
from filters import AUTHORITY_TYPES, normalize_jurisdiction  # also read as documents.<name>

logger = logging.getLogger(__name__)
# pypdf warns of each quirk of a malformed file before it raises; the loader's one line says it.
logging.getLogger("pypdf").setLevel(logging.ERROR)

MAX_FILE_BYTES = 50 * 2**20
MAX_PDF_PAGES = 3000
MAX_DOCX_BYTES = 200 * 2**20  # the most a DOCX may expand to when unzipped
MAX_ZIP_RATIO = 100  # of a DOCX member over 1 MB, unpacked over packed (Word's XML packs ~10x)
MIN_FONT_PT = 1.0  # PDF or DOCX text smaller than this is invisible
WHITE = 0.95  # a PDF fill this light (gray, or every RGB component) is white on white paper
DEFAULT_MAX_TOKENS = 240
DEFAULT_OVERLAP_TOKENS = 40
SMALL_SHARE = 8  # a chunk under max_tokens // SMALL_SHARE takes in the next unit of its section
HEAD_CHARS = 3000  # a document's start, searched for its caption, court, citation and dates
SUFFIXES = {
    ".pdf": "pdf", ".html": "html", ".htm": "html", ".docx": "docx", ".md": "markdown",
    ".markdown": "markdown", ".txt": "text",
}  # fmt: skip
OVERRIDE_KEYS = ("title", "citation", "court", "jurisdiction", "date", "authority_type", "source")


class DocumentError(ValueError):
    """A document that cannot be read; the one-line message names the file and why."""


def _fail(path: Path, why: str) -> DocumentError:
    return DocumentError(f"{path}: {' '.join(str(why).split())}")


@dataclass(frozen=True, slots=True)
class Block:
    """A paragraph or heading of visible text."""

    text: str
    page: int | None = None
    # the headings above it, outermost first (a heading's own path ends with itself)
    heading: tuple[str, ...] = ()
    is_heading: bool = False


@dataclass
class Document:
    path: Path
    doc_id: str
    sha256: str
    title: str
    kind: str  # one of filters.DOCUMENT_KINDS (_guess_kind)
    blocks: list[Block]
    meta: dict[str, str] = field(default_factory=dict)  # citation, court, date... (those known)
    hidden_text: str = ""
    hidden_flags: list[str] = field(default_factory=list)  # injection.screen_passage's names
    pages: int | None = None


# --- Files --------------------------------------------------------------------------------------
def find_files(paths: Iterable[str | Path]) -> list[Path]:
    """The documents under ``paths``: supported files of folders (recursive, sorted, hidden files
    and folders skipped), and every file named directly (an unsupported or missing one is kept,
    so that reading it says why); a file named twice ("f.txt", "sub/../f.txt") once."""
    out: dict[Path, Path] = {}
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.is_dir():
            out.setdefault(p.resolve(), p)
            continue
        for f in sorted(p.rglob("*")):
            hidden = any(part.startswith((".", "~$")) for part in f.relative_to(p).parts)
            if f.is_file() and f.suffix.lower() in SUFFIXES and not hidden:
                out.setdefault(f.resolve(), f)
    return list(out.values())


def document_id(path: str | Path) -> str:
    """A slug of the file name and a short hash of the full path (``Terry v. Ohio.pdf`` ->
    ``terry-v-ohio-pdf-3fa81c``): kept when the content changes, unique per folder."""
    p = Path(path)
    slug = re.sub(r"[^a-z0-9]+", "-", p.name.lower()).strip("-")[:60] or "document"
    return f"{slug}-{hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:6]}"


def _size(n: float) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{int(n)} bytes"


def read_document(path: str | Path, overrides: dict[str, str] | None = None) -> Document:
    """One file as a :class:`Document`: visible text, hidden text screened, authority metadata
    with the sidecar and ``overrides`` applied.  Raises :class:`DocumentError`."""
    p = Path(path)
    fmt = SUFFIXES.get(p.suffix.lower())
    if not p.is_file():
        raise _fail(p, "is a folder, not a file" if p.is_dir() else "file not found")
    if fmt is None:
        kinds = "PDF, HTML, DOCX, Markdown or .txt"
        raise _fail(p, f"unknown type {p.suffix.lower() or '(none)'!r}: use {kinds}")
    if (size := p.stat().st_size) > MAX_FILE_BYTES:
        raise _fail(p, f"too large: {_size(size)} > {_size(MAX_FILE_BYTES)} limit")
    data = p.read_bytes()
    reader = {"pdf": _read_pdf, "html": _read_html, "docx": _read_docx}.get(fmt, _read_plain)
    title, blocks, hidden, pages = reader(p, data)
    if all(b.is_heading for b in blocks):
        raise _fail(p, "no text (a scanned PDF? run OCR first)" if fmt == "pdf" else "no text")
    kind = _guess_kind(blocks)
    guessed = title or _guess_title([b.text for b in blocks[:40]])  # a text file has no title
    meta = _authority(guessed, blocks, kind)
    extra = _overrides(p, overrides)
    if "court" in extra and "jurisdiction" not in extra:  # the court given brings its own
        meta.pop("jurisdiction", None)
        if place := _court_jurisdiction(extra["court"]):
            extra["jurisdiction"] = place
    meta.update(extra)
    title = meta.pop("title", "") or guessed or p.stem
    hidden_text = "\n".join(h.strip() for h in hidden if h and h.strip())
    import injection  # its patterns (and prompts) load when a document is read, not on import

    flags = injection.screen_passage(hidden_text) if hidden_text else []
    if flags:
        logger.info("%s: hidden text reads as instructions (%s)", p, ", ".join(flags))
    sha = hashlib.sha256(data).hexdigest()
    logger.info("%s: %s, %d blocks, %s", p, kind, len(blocks), meta.get("authority_type"))
    return Document(p, document_id(p), sha, title, kind, blocks, meta, hidden_text, flags, pages)


# --- The structure of legal text ----------------------------------------------------------------

_NUMBER = r"(\d+[A-Za-z]?(?:[.\-–]\d+[A-Za-z]?)*)"
_CODE = r"(?:\d+\s+[A-Z][\w.&]*(?:\s+[A-Z][\w.&]*){0,3}\s+)?"  # "28 U.S.C. ", "29 C.F.R. "
_CODE_SECTION = r"(?<=U\.S\.C\. )|(?<=C\.F\.R\. )"  # a section with no "§": "28 U.S.C. 1441"
_SECTION_LINE = re.compile(
    rf"^{_CODE}(?:§§?|Sec\.|SEC\.|Section|SECTION|{_CODE_SECTION})\s*{_NUMBER}\.?(?:\s+(?=[A-Z])|$)"
)
_RULE_LINE = re.compile(r"^Rule\s+(\d+(?:\.\d+)*)\.?(?:\s+(?=[A-Z])|$)")
_OUTER_LINE = re.compile(
    rf"^{_CODE}(?:Article|ARTICLE|Amendment|AMENDMENT|Title|TITLE|Chapter|CHAPTER|Part|PART)"
    r"\s+(?:[IVXLC]+|\d+)\b"
)
_OUTLINE_LINE = re.compile(r"^(?:([IVX]+)|([A-H])|\d+)\.\s+[A-Z]")
_ARTICLE = re.compile(r"\b(Article|Amendment|ARTICLE|AMENDMENT)\s+([IVXLC]+|\d+)\b")
_SECTION = re.compile(rf"(?:§§?|\bSec\.|\bSECTION|\bSection|{_CODE_SECTION})\s*{_NUMBER}")
_RULE = re.compile(r"\bRule\s+(\d+(?:\.\d+)*)")
_HEADING_LABELS = re.compile(r"(?:\([a-zA-Z0-9]{1,4}\))*")
_LABEL = re.compile(r"\(([a-z]{1,4}|\d{1,3}|[A-Z]{1,3})\)\s*")
_LABELS = re.compile(rf"(?:{_LABEL.pattern})*")
_LIST_LABEL = re.compile(r"(?:[-•*]\s+)?(?=\()|(\d{1,3})\.\s+(?=[A-Z])")  # "- (A)", "1. Title"
_STRUCTURE = re.compile(
    rf"^{_CODE}(?:§|Sec\.|SEC\.|Section|SECTION|Rule|RULE|Article|ARTICLE|Amendment|AMENDMENT"
    rf"|Part|PART|Chapter|CHAPTER|Title|TITLE|{_CODE_SECTION})\s*(?:\d|[IVXLC]+\b)"
)
_ROMAN = re.compile(r"(?=[ivxl])l?x{0,3}(?:ix|iv|v?i{0,3})")
_STAR = re.compile(r"(?<![\w*])\*(\d{1,5})\b(?!\*)")
_CAPTION = re.compile(r"^\S.{0,120}\sv\.\s.{1,120}$")
_LEAD_IN = (":", "—", "–", "-", ";", ",", " or", " and")
_JUSTICE = r"^(?:MR\.|MADAM)?.{0,40}?JUSTICE\s+[A-Z'\-]+(?:,.{0,200}?)?,\s+"
_JUDGE = r"|^[A-Z][A-Za-z'\-]+,\s+(?:Chief\s+|Circuit\s+|District\s+)?Judge,\s+"
_PARTS = (
    ("syllabus", re.compile(r"^Syllabus\b")),
    ("dissent", re.compile(f"{_JUSTICE}dissenting{_JUDGE}dissenting")),
    ("concurrence", re.compile(f"{_JUSTICE}concurring{_JUDGE}concurring")),
    ("majority", re.compile(r"delivered the opinion of the Court|^PER CURIAM\b|^OPINION\b")),
)
_OPINION_SIGNS = re.compile(
    r"Opinion of the Court|delivered the opinion|\bJUSTICE\b|\bdissenting\b|\bconcurring\b"
    r"|\bSyllabus\b|\bPER CURIAM\b|\bDecided\b|\bArgued\b|\bJudge\b.{0,40}\bopinion\b"
)
# a brief or motion's heading ("BRIEF FOR PETITIONER", "MEMORANDUM OF LAW", "Appellant's Reply
# Brief"), not an opinion's words ("a brief pat-down", "motion to suppress", "MEMORANDUM OPINION")
_BRIEF_SIGNS = re.compile(
    r"\b(?:BRIEF|MOTION)\b|\bMEMORANDUM\b(?!\s+(?:OPINION|AND\s+ORDER|DECISION))"
    r"|(?i:\bbrief\s+(?:for|of|in\s+support\s+of)\s+(?:the\s+)?(?:petitioner|respondent|appellant|"
    r"appellee|plaintiff|defendant|amicus|amici)|\b(?:petitioner|respondent|appellant|appellee)'?s\s+"
    r"(?:opening\s+|reply\s+|answering\s+)?brief)"
)


def _part_marker(text: str) -> str | None:
    return next((name for name, rx in _PARTS if rx.search(text[:300])), None)


def _line_heading_level(line: str) -> int | None:
    """The heading level of a line of a PDF or text file (None: body text)."""
    if len(line) > 120:
        return None
    if _OUTER_LINE.match(line):
        return 1
    if _SECTION_LINE.match(line) or _RULE_LINE.match(line):
        return 2
    if re.fullmatch(r"[IVX]+\.?", line):
        return 1
    if len(line) > 80 or line.endswith((",", ";", ".")):
        return None
    if line.isupper() and sum(map(str.isalpha, line)) >= 3:
        return 1
    m = _OUTLINE_LINE.match(line)
    return None if m is None else 1 if m[1] else 2 if m[2] else 3


def _labels(text: str) -> list[str]:
    """The subsection labels ``text`` opens with ("(b)(2)" -> b, 2); a list's "1." is (1)."""
    lead = _LIST_LABEL.match(text)
    if lead and lead.group(1):
        return [lead.group(1)]
    return _LABEL.findall(_LABELS.match(text, lead.end() if lead else 0).group(0))


def _push_labels(text: str, stack: dict[int, str]) -> None:
    """Move the subsection ``stack`` (depth -> label) to the labels ``text`` opens with: (a) is
    depth 1, (1) 2, (A) 3, (i) 4, (I) 5, as in the US Code."""
    for label in _labels(text):
        if label.isdigit():
            level = 2
        elif label.isupper():
            level = 5 if 4 in stack and _ROMAN.fullmatch(label.lower()) else 3
        else:
            level = 4 if 3 in stack and _ROMAN.fullmatch(label) else 1
        for deeper in [k for k in stack if k >= level]:
            del stack[deeper]
        stack[level] = label


def _statute_pin(heading: Sequence[str], stack: dict[int, str]) -> str:
    outer = sec = ""
    for h in heading:
        if m := _ARTICLE.search(h):
            outer, sec = f"{'Art.' if m[1].lower() == 'article' else 'Amend.'} {m[2]}", ""
        if m := _RULE.search(h):
            sec = f"Rule {m[1]}"
        elif m := _SECTION.search(h):  # "§ 4622(b) Prohibited surveillance": § 4622(b)
            sec = f"§ {m[1]}{_HEADING_LABELS.match(h, m.end()).group(0)}"
    return ", ".join(p for p in (outer, sec) if p) + "".join(f"({stack[k]})" for k in sorted(stack))


def _advance_star(text: str, star: int | None) -> int | None:
    """The star page after ``text``: a ``*N`` marker moves it when N is ahead (by up to 100)."""
    for m in _STAR.finditer(text):
        if star is None or star <= int(m.group(1)) <= star + 100:
            star = int(m.group(1))
    return star


def _guess_kind(blocks: Sequence[Block]) -> str:
    head = "\n".join(b.text for b in blocks[:60])[:HEAD_CHARS]
    caption = any(_CAPTION.match(b.text[:250]) for b in blocks[:25])
    signs = {m.group(0).lower() for m in _OPINION_SIGNS.finditer(head)}
    if (caption and signs or len(signs) >= 3) and not _BRIEF_SIGNS.search(head[:600]):
        return "opinion"
    headings = [b.text for b in blocks if b.is_heading]
    # "§ 1441.", "Rule 803.", "Colorado Revised Statutes § 38-12-1503."
    sections = sum(bool(_STRUCTURE.match(h) or _OWN_CITATION.match(h)) for h in headings)
    if sections:  # a section's subsections as headings ("(1) Prohibited conduct") count too
        sections += sum(bool(_labels(h)) for h in headings)
    labelled = sum(bool(_labels(b.text)) for b in blocks if not b.is_heading)
    body = len(blocks) - len(headings)
    if sections >= 2 and 2 * sections >= len(headings) or sections and labelled >= max(2, body / 3):
        return "statute"
    return "brief"


_CAPTION_END = re.compile(r",\s*\d|\s+(?:Nos?\.\s*\d|Docket\b|(?:Argued|Decided|Filed)\s+[A-Z])")


def _guess_title(texts: Sequence[str]) -> str:
    texts = [" ".join(t.split()) for t in texts if t.strip()]
    caption = next((t for t in texts if len(t) <= 150 and _CAPTION.match(t)), None)
    # the case name ends at its citation ("Smith v. Jones, 392 U.S. 1") or a caption line the
    # reader joined to it ("KELLER v. BRANDT No. 2021-0456. Decided May 4, 2022.")
    title = _CAPTION_END.split(caption)[0] if caption else texts[0] if texts else ""
    return title if len(title) <= 200 else title[:200].rsplit(" ", 1)[0] + "…"


# --- Lines to paragraphs (PDF and text files) ---------------------------------------------------
@dataclass(slots=True)
class _Line:
    text: str
    page: int | None = None
    x: float | None = None
    y: float | None = None


_PAGE_NUMBER = re.compile(r"(?:page\s+)?[-–—\s]*\d{1,4}(?:\s+of\s+\d+)?[-–—\s]*", re.I)
_TERMINAL = (".", "?", "!", ":", '"', "”", ")")


def _drop_furniture(pages: list[list[_Line]]) -> list[_Line]:
    """The lines of all pages but page numbers and running heads and feet (a first or last line
    that recurs, digits aside, on half the pages or more)."""

    def key(line: _Line) -> str:
        return re.sub(r"\d+", "#", " ".join(line.text.lower().split()))

    seen = Counter(k for lines in pages for k in {key(ln) for ln in lines[:2] + lines[-2:]})
    repeated = {k for k, n in seen.items() if n >= max(3, len(pages) / 2)}
    furniture = {id(ln) for lines in pages for ln in lines[:2] + lines[-2:] if key(ln) in repeated}
    return [
        ln
        for lines in pages
        for ln in lines
        if id(ln) not in furniture and not _PAGE_NUMBER.fullmatch(ln.text.strip())
    ]


def _blocks_from_lines(lines: list[_Line]) -> list[Block]:
    """Paragraphs of laid-out lines: one ends at a blank line, a heading, a structural line (a
    subsection label, a part of an opinion), a wide gap, an indent or a short last line."""
    body = [ln for ln in lines if ln.text.strip()]
    lengths = sorted(len(ln.text.strip()) for ln in body) or [0]
    full = lengths[int(0.9 * (len(lengths) - 1))]
    unwrapped = full > 200 and all(ln.y is None for ln in body)  # a text file, a line a paragraph
    gaps = sorted(
        a.y - b.y
        for a, b in itertools.pairwise(body)
        if a.y is not None and b.y is not None and a.page == b.page and a.y > b.y
    )
    gap = gaps[len(gaps) // 4] if gaps else None  # the line spacing
    left = min((ln.x for ln in body if ln.x is not None), default=None)

    def breaks(prev: _Line, line: _Line, t: str) -> bool:
        p = prev.text.strip()
        ends = p.endswith(_TERMINAL)
        spaced = gap and prev.y is not None and line.y is not None and prev.page == line.page
        indented = left is not None and line.x is not None and line.x > left + 8
        return bool(
            unwrapped
            or (prev.page != line.page and ends)
            or _part_marker(t)
            or (len(p) < 100 and _part_marker(p))
            or (_labels(t) and p.endswith((".", ";", ":", "—", "–", " or", " and")))
            or (spaced and (prev.y - line.y > 1.5 * gap or ends and indented))
            or (ends and len(p) < 0.7 * full)
        )

    events: list[tuple[str, Any]] = []
    prev: _Line | None = None  # the last line of the paragraph being read
    for line in lines:
        t = " ".join(line.text.split())
        level = _line_heading_level(t) if t else None
        if not t or level:
            events += [("br", ""), ("page", line.page), (f"h{level}", t)] if level else [("br", "")]
            prev = None
            continue
        if prev is not None and breaks(prev, line, t):
            prev = None
        if prev is not None and re.search(r"[a-z]-$", events[-1][1]) and t[:1].islower():
            events[-1] = ("t", events[-1][1][:-1] + t)  # a word hyphenated across lines
        else:
            events += [("t", " " + t)] if prev else [("br", ""), ("page", line.page), ("t", t)]
        prev = line
    return _blocks_from_events(events)


# --- Readers: each returns (title, blocks, hidden texts, pages) ---------------------------------

_Read = tuple[str, list[Block], list[str], int | None]
_SHOW = {b"Tj", b"TJ", b"'", b'"'}


class _PdfSink:
    """pypdf's text visitors for one page: text drawn white, invisibly (render mode 3 or 7), under
    1 pt or off the page goes to ``hidden``, the rest to ``lines``.  pypdf hands text over when it
    flushes its buffer: a flush is hidden when any text operator since the last one was."""

    def __init__(self, page: int, box: tuple[float, ...]) -> None:
        self.page, self.box = page, box
        self.white, self.mode, self.size = False, 0, 12.0
        self.stack: list[tuple[bool, int, float]] = []
        self.pending: list[bool] = []
        self.op = b""
        self.lines = [_Line("", page)]
        self.hidden: list[str] = []

    def before(self, op: bytes, args: list, cm: list[float], tm: list[float]) -> None:
        self.op = op
        with contextlib.suppress(TypeError, ValueError):  # malformed operands change nothing
            if op == b"q":
                self.stack.append((self.white, self.mode, self.size))
            elif op == b"Q" and self.stack:
                self.white, self.mode, self.size = self.stack.pop()
            elif op in (b"g", b"rg", b"k", b"sc", b"scn", b"cs"):
                v = [float(a) for a in args if isinstance(a, int | float)]
                self.white = op != b"cs" and (
                    len(v) in (1, 3) and min(v) >= WHITE or len(v) == 4 and max(v) <= 1 - WHITE
                )
            elif op == b"Tr" and args:
                self.mode = int(args[0])
            elif op == b"Tf" and len(args) > 1:
                self.size = float(args[1])
            elif op in _SHOW:
                self.pending.append(self._invisible(cm, tm))

    def _invisible(self, cm: list[float], tm: list[float]) -> bool:
        scale = (tm[0] * tm[3] - tm[1] * tm[2]) * (cm[0] * cm[3] - cm[1] * cm[2])  # det(tm @ cm)
        x, y = self._position(cm, tm)
        x0, y0, x1, y1 = self.box
        off_page = not (x0 - 20 <= x <= x1 + 20 and y0 - 20 <= y <= y1 + 20)
        tiny = abs(self.size) * math.sqrt(abs(scale)) < MIN_FONT_PT
        return self.white or self.mode in (3, 7) or tiny or off_page

    @staticmethod
    def _position(cm: list[float], tm: list[float]) -> tuple[float, float]:
        return tm[4] * cm[0] + tm[5] * cm[2] + cm[4], tm[4] * cm[1] + tm[5] * cm[3] + cm[5]

    def text(self, text: str, cm: list[float], tm: list[float], font: Any, size: float) -> None:
        hidden = any(self.pending)
        self.pending = self.pending[-1:] if self.op in _SHOW else []
        if hidden and text.strip():
            self.hidden.append(text)
            text = "\n" * text.count("\n")  # keep the line breaks
        for i, part in enumerate(text.split("\n")):
            if i and self.lines[-1].text.strip():
                self.lines.append(_Line("", self.page))
            if part:
                line = self.lines[-1]
                if not line.text.strip():
                    line.x, line.y = self._position(cm, tm)
                line.text += part


def _read_pdf(path: Path, data: bytes) -> _Read:
    from pypdf import PdfReader

    if b"%PDF-" not in data[:1024]:
        raise _fail(path, "not a readable PDF (no PDF header)")
    try:
        reader = PdfReader(io.BytesIO(data))
        locked = reader.is_encrypted and not reader.decrypt("")  # no password: the empty one
        n = 0 if locked else len(reader.pages)
    except Exception as exc:
        raise _fail(path, f"not a readable PDF (corrupt: {exc})") from None
    if locked:
        raise _fail(path, "encrypted PDF (a password is needed)")
    if n > MAX_PDF_PAGES:
        raise _fail(path, f"too many pages: {n} > {MAX_PDF_PAGES} limit")
    hidden: list[str] = []
    pages: list[list[_Line]] = []
    try:
        info = reader.metadata or {}
        hidden += [str(v) for v in info.values() if isinstance(v, str)]
        title = " ".join(str(info.get("/Title") or "").split())
        for i, page in enumerate(reader.pages, start=1):
            sink = _PdfSink(i, tuple(float(v) for v in page.mediabox))
            page.extract_text(visitor_operand_before=sink.before, visitor_text=sink.text)
            pages.append([ln for ln in sink.lines if ln.text.strip()])
            hidden += sink.hidden
            for annot in page.get("/Annots") or []:
                hidden.append(str(annot.get_object().get("/Contents") or ""))
    except Exception as exc:
        raise _fail(path, f"not a readable PDF (page {len(pages) + 1}: {exc})") from None
    if re.fullmatch(r"(?i)untitled.*|microsoft word - .*|.*\.(docx?|pdf)", title):
        title = ""
    return title, _blocks_from_lines(_drop_furniture(pages)), hidden, n


_BLOCK_NAMES = (
    "address article aside blockquote body br caption dd div dl dt figcaption figure footer form "
    "header hr li main nav ol p pre section table tbody td tfoot th thead tr ul"
)
_BLOCK_TAGS = frozenset(_BLOCK_NAMES.split())
_CSS_HIDDEN = re.compile(
    r"display\s*:\s*none|visibility\s*:\s*(?:hidden|collapse)|opacity\s*:\s*0*\.?0*\s*(?:;|$)"
    r"|(?:left|top|text-indent)\s*:\s*-\d{3,}",
    re.I,
)
_CSS_FONT = re.compile(r"font-size\s*:\s*(\d*\.?\d+)\s*(px|pt|em|rem|%)?", re.I)
_CSS_WHITE = re.compile(
    r"(?<![-\w])color\s*:\s*(?:white|#fff(?:fff)?\b|rgba?\(\s*255\s*,\s*255\s*,\s*255)", re.I
)


def _html_hidden(el: Any, background: bool) -> bool:
    """Whether a reader does not see ``el``: ``hidden``, ``aria-hidden``, or an inline style that
    hides it, shrinks it under 1px or paints it white with no background set."""
    if el.get("hidden") is not None or (el.get("aria-hidden") or "").lower() == "true":
        return True
    style = el.get("style") or ""
    font = _CSS_FONT.search(style)
    if _CSS_HIDDEN.search(style) or font and float(font[1]) < (10 if font[2] == "%" else 1):
        return True
    return bool(_CSS_WHITE.search(style)) and not background and "background" not in style.lower()


def _html_events(el: Any, hidden: list[str], background: bool = False) -> Iterator[tuple[str, str]]:
    """("t", text), ("br", "") and ("h1".."h6", heading) events of what a reader sees of ``el``;
    what they do not see is appended to ``hidden`` (script and style code is dropped)."""
    if el.text:
        yield "t", el.text
    for child in el:
        tag = child.tag.lower() if isinstance(child.tag, str) else None
        if tag is None:  # a comment or processing instruction
            hidden.append(child.text or "")
        elif tag in ("noscript", "template", "title", "meta") or _html_hidden(child, background):
            hidden.append(child.text_content())
        elif tag in ("script", "style", "head", "link"):
            pass
        elif re.fullmatch(r"h[1-6]", tag):
            inner = "".join(t for kind, t in _html_events(child, hidden, background) if kind == "t")
            yield tag, " ".join(inner.split())
        else:
            block = tag in _BLOCK_TAGS
            yield ("br", "") if block else ("t", "")
            yield from _html_events(
                child, hidden, background or "background" in (child.get("style") or "").lower()
            )
            yield ("br", "") if block else ("t", "")
        if child.tail:
            yield "t", child.tail


def _blocks_from_events(events: Iterable[tuple[str, Any]]) -> list[Block]:
    """The blocks of ("t", text), ("br", "") and ("h0".."h6", heading) events; ("page", n) sets
    the page of the blocks after it (PDF and text files)."""
    blocks: list[Block] = []
    heading: dict[int, str] = {}  # level -> heading, outermost first
    buf: list[str] = []
    page = None
    for kind, text in [*events, ("br", "")]:
        if kind == "page":
            page = text
            continue
        if kind == "t":
            buf.append(text)
            continue
        if para := " ".join("".join(buf).split()):
            blocks.append(Block(para, page, tuple(heading.values())))
        buf.clear()
        if kind != "br" and text:
            level = int(kind[1:])
            heading = {k: h for k, h in heading.items() if k < level} | {level: text}
            blocks.append(Block(text, page, tuple(heading.values()), True))
    return blocks


def _read_html(path: Path, data: bytes) -> _Read:
    import lxml.html
    from lxml.etree import ParserError

    encoding = None  # lxml reads undeclared bytes as Latin-1; most HTML today is UTF-8
    if not re.search(rb"<meta[^>]+charset", data[:4096], re.I):
        try:
            data.decode("utf-8")
            encoding = "utf-8"
        except UnicodeDecodeError:
            encoding = "cp1252"
    try:
        root = lxml.html.document_fromstring(data, parser=lxml.html.HTMLParser(encoding=encoding))
    except (ParserError, ValueError) as exc:
        raise _fail(path, f"no text ({exc})") from None
    hidden = [m.get("content") or "" for m in root.iter("meta")]
    title = " ".join((root.findtext(".//title") or "").split())
    body = root.find("body")
    blocks = _blocks_from_events(_html_events(body if body is not None else root, hidden))
    return title or next((b.text for b in blocks if b.is_heading), ""), blocks, hidden, None


def _check_zip(path: Path, data: bytes) -> None:
    try:
        infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except zipfile.BadZipFile:
        raise _fail(path, "not a readable DOCX (corrupt, or an old .doc renamed)") from None
    total = sum(i.file_size for i in infos)
    big = [i for i in infos if i.file_size > 2**20]  # a small member packed tight is no bomb
    worst = max(big, key=lambda i: i.file_size / max(i.compress_size, 1), default=None)
    ratio = worst.file_size // max(worst.compress_size, 1) if worst else 0
    if total > MAX_DOCX_BYTES:
        raise _fail(path, f"expands to {_size(total)} (zip bomb?) > {_size(MAX_DOCX_BYTES)} limit")
    if worst and ratio > MAX_ZIP_RATIO:
        why = f"{worst.filename} packed {ratio}x > {MAX_ZIP_RATIO}x limit"
        raise _fail(path, f"expands to {_size(total)} (zip bomb?): {why}")


def _docx_text(paragraph: Any, hidden: list[str]) -> str:
    """The visible text of a DOCX paragraph; hidden, white or sub-1pt runs go to ``hidden``."""
    from docx.enum.dml import MSO_THEME_COLOR
    from docx.shared import Pt, RGBColor

    style = paragraph.style.font if paragraph.style is not None else None
    out = []
    for item in paragraph.iter_inner_content():
        for run in getattr(item, "runs", [item]):  # a hyperlink holds runs
            f, color = run.font, run.font.color
            white = color.type is not None and (
                color.rgb == RGBColor(0xFF, 0xFF, 0xFF)
                or color.theme_color in (MSO_THEME_COLOR.BACKGROUND_1, MSO_THEME_COLOR.LIGHT_1)
            )
            tiny = f.size is not None and f.size < Pt(MIN_FONT_PT)
            invisible = f.hidden or f.hidden is None and style is not None and style.hidden
            (hidden if invisible or white or tiny else out).append(run.text)
    return " ".join("".join(out).split())


def _read_docx(path: Path, data: bytes) -> _Read:
    _check_zip(path, data)
    import docx
    from docx.table import Table

    try:
        d = docx.Document(io.BytesIO(data))
    except Exception as exc:
        raise _fail(path, f"not a readable DOCX (corrupt: {exc})") from None
    props = d.core_properties
    hidden = [props.title, props.subject, props.keywords, props.comments]
    hidden += [c.text for c in getattr(d, "comments", [])]
    events: list[tuple[str, str]] = []
    title = " ".join((props.title or "").split())
    for item in d.iter_inner_content():
        if isinstance(item, Table):
            for row in item.rows:  # a merged cell repeats: keep it once
                cells = dict.fromkeys(
                    " ".join(_docx_text(p, hidden) for p in c.paragraphs).strip() for c in row.cells
                )
                events += [("t", " | ".join(c for c in cells if c)), ("br", "")]
            continue
        text = _docx_text(item, hidden)
        style = item.style.name if item.style is not None else ""
        m = re.fullmatch(r"Heading (\d)", style)
        heading = "h0" if style == "Title" else f"h{m[1]}" if m else None
        events += [(heading, text)] if heading else [("t", text), ("br", "")]
    blocks = _blocks_from_events(events)
    return title or next((b.text for b in blocks if b.is_heading), ""), blocks, hidden, None


def _decode(path: Path, data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    if b"\x00" in data[:4096]:
        raise _fail(path, "not a text file (binary content)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")


_TAG = (
    r"!--|/?(?:a|abbr|b|blockquote|br|center|code|del|details|div|em|font|h[1-6]|hr|i|iframe|"
    r"img|ins|li|mark|ol|p|pre|s|script|small|span|strong|style|sub|summary|sup|table|tbody|td|th|"
    r"thead|tr|u|ul)\b"
)
# where raw HTML starts in Markdown; any other "<" is text ("<Landlord Name>", "if x<y")
_HTML_TAG, _TEXT_LT = re.compile(rf"<(?={_TAG})", re.I), re.compile(rf"<(?!{_TAG})", re.I)


def _read_plain(path: Path, data: bytes) -> _Read:
    """Text files (a form feed starts a page) and Markdown (``#`` headings; raw HTML in it is
    read as HTML, so its comments and hidden elements stay out)."""
    text = _decode(path, data)
    hidden: list[str] = []
    if SUFFIXES[path.suffix.lower()] == "text":
        paged = "\f" in text
        lines = [
            _Line(t, i if paged else None)
            for i, page in enumerate(text.split("\f"), start=1)
            for t in page.splitlines()
        ]
        return "", _blocks_from_lines(lines), hidden, None
    if _HTML_TAG.search(text):
        text = _TEXT_LT.sub("&lt;", text)
        import lxml.html
        from lxml.etree import ParserError

        with contextlib.suppress(ParserError, ValueError):  # not HTML after all: the text as is
            root = lxml.html.fragment_fromstring(text, create_parent="div")
            text = "".join(
                t if k == "t" else f"\n{'#' * int(k[1:])} {t}\n" if k != "br" else "\n"
                for k, t in _html_events(root, hidden)
            )
    events: list[tuple[str, str]] = []
    for raw in text.splitlines():
        t = " ".join(re.sub(r"\*\*|__|`", "", raw).split())
        if m := re.fullmatch(r"(#{1,6})\s+(.*?)\s*#*", t):
            events.append((f"h{len(m[1])}", m[2]))
        elif not t or re.match(r"(?:[-*+]|\d+[.)])\s|>|\(\w{1,4}\)\s", t):  # a list item
            events += [("br", ""), ("t", re.sub(r"^(?:[-*+]|>)\s*", "", t))]
        else:
            events.append(("t", " " + t))
    blocks = _blocks_from_events(events)
    title = next((b.text for b in blocks if b.is_heading and len(b.heading) == 1), "")
    return title, blocks, hidden, None


# --- Authority metadata -------------------------------------------------------------------------

_FEDERAL = re.compile(
    r"U\.S\.C\.|C\.F\.R\.|United States Code|Code of Federal Regulations|Federal Rules? of"
    r"|Fed\. R\.|Constitution of the United States|United States Constitution|U\.?S\.? Const"
)
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_name) if m}
_MONTHS |= {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m} | {"sept": 9}
_DATE = re.compile(
    r"\b(Decided|Filed|Effective|Enacted|Dated|Argued|Submitted)\b[:\s]+(?:on\s+|as of\s+)?"
    r"(?:([A-Za-z]{3,9})\.?\s+(\d{1,2}),?\s+(\d{4})|(\d{4})-(\d{2})-(\d{2})|(\d{4})\b)",
    re.I,
)
_RULES = r"\bRules? of (?:Evidence|Civil|Criminal|Appellate|Bankruptcy)|Federal Rules|^Rule\s+\d"
_CONSTITUTION = r"^(?:Article|ARTICLE|Amendment|AMENDMENT)\s"
_DATE_RANK = ("decided", "filed", "effective", "enacted", "dated", "argued", "submitted")


def _court_jurisdiction(court: str) -> str | None:
    import courts_db

    if not (found := courts_db.find_court_by_id(court)):
        return None
    place = found[0].get("location") or ""
    return "US" if found[0].get("system") == "federal" else filters.jurisdiction_of(place)


def _find_court(texts: Iterable[str]) -> str | None:
    import courts_db

    for text in texts:
        if "court" in text.lower() and len(text) <= 150:
            name = re.sub(r"^(?:in|for)\s+the\s+", "", text.strip(" .,:"), flags=re.I)
            if found := courts_db.find_court(name, bankruptcy=False):
                return found[0]
    return None


def _find_date(text: str) -> str | None:
    """ISO date of "Decided June 10, 1968", "Effective December 1, 2011", "Enacted 1948"…; a
    decision date wins over a filing, effective, enactment or argument date."""
    found: list[tuple[int, str]] = []  # (rank, ISO date)
    for m in _DATE.finditer(text):
        if m[2]:
            y, mo, d = int(m[4]), _MONTHS.get(m[2].lower(), 0), int(m[3])
        else:
            y, mo, d = (int(m[5]), int(m[6]), int(m[7])) if m[5] else (int(m[8]), 0, 0)
        try:
            value = date(y, mo, d).isoformat() if mo else str(y)
        except ValueError:
            continue
        if (mo or not m[2]) and 1600 <= y <= 2200:
            found.append((_DATE_RANK.index(m[1].lower()), value))
    return min(found, key=lambda f: f[0])[1] if found else None  # the first of the best rank


# a title citing its statute in words eyecite misses ("Colorado Revised Statutes § 38-12-1503")
_OWN_CITATION = re.compile(rf"\b([A-Z][\w.]*(?:\s+[A-Z][\w.]*){{0,5}})\s+§\s*{_NUMBER}")


def _authority(title: str, blocks: Sequence[Block], kind: str) -> dict[str, str]:
    """citation, court, jurisdiction, date and authority_type, as far as the text tells."""
    from eyecite import get_citations
    from eyecite.models import FullCaseCitation, FullLawCitation

    texts = [b.text for b in blocks[:60]]
    head = "\n".join(texts)[:HEAD_CHARS]
    # eyecite reads a code's section only after "§": "28 U.S.C. 1441" is written without it too
    cites = get_citations(re.sub(rf"({_CODE_SECTION})(?=\d)", "§ ", head[:2000]))
    case = next((c for c in cites if isinstance(c, FullCaseCitation)), None)
    law = next((c for c in cites if isinstance(c, FullLawCitation)), None)
    meta: dict[str, str] = {"authority_type": "secondary"}
    place = None
    if kind == "opinion":
        meta["authority_type"] = "case"
        if case:
            meta["citation"] = case.corrected_citation()
        if court := _find_court(texts[:40]) or (case.metadata.court if case else None):
            meta["court"] = court
            place = _court_jurisdiction(court)
    elif kind == "statute":
        both = f"{title}\n{head}"
        kinds = {
            "regulation": re.search(r"C\.F\.R\.|Code of Federal Regulations", both),
            "court_rule": re.search(_RULES, both, re.M),
            "constitution": "constitution" in both.lower() and re.search(_CONSTITUTION, both, re.M),
        }
        meta["authority_type"] = next((k for k, found in kinds.items() if found), "statute")
        if law:
            g = law.groups
            # the standard name ("United States Code" -> "U.S.C."), but a state code keeps its
            # subject ("Cal. Civ. Proc. Code", which eyecite shortens to "Cal. Code")
            reporter = g.get("reporter") if g.get("subject") else law.corrected_reporter()
            parts = (g.get("title") or g.get("chapter"), reporter, "§", g.get("section"))
            meta["citation"] = " ".join(p for p in parts if p)
        elif own := _OWN_CITATION.search(title):  # as the title names it, if eyecite cannot
            meta["citation"] = f"{own[1]} § {own[2]}"
        # the code's reporter ("Colo. Rev. Stat."), a state named in full ("Vermont Drone Privacy
        # Act, 20 V.S.A. § 4622", "COLORADO REVISED STATUTES"), else an abbreviation ("Cal. Civ.")
        words = [(law.groups.get("reporter") or " ").split()[0]] if law else []
        states = [filters.jurisdiction_of(w) for w in words if len(re.sub(r"[^A-Za-z]", "", w)) > 2]
        states.append(filters.state_named(title))
        states += [filters.jurisdiction_of(w) for w in re.findall(r"[A-Z][a-z]{2,}", title)]
        place = "US" if _FEDERAL.search(both) else next((s for s in states if s), None)
    when = _find_date(head) or (case.metadata.year if case and kind == "opinion" else None)
    meta |= {k: v for k, v in (("jurisdiction", place), ("date", when)) if v}
    return meta


def _overrides(path: Path, flags: dict[str, str] | None) -> dict[str, str]:
    """The validated metadata of the sidecar ``<file>.meta.json``, then of ``flags`` (which win)."""
    layers: list[tuple[str, dict[str, Any]]] = []
    side = path.with_name(path.name + ".meta.json")
    if side.exists():
        try:
            data = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _fail(path, f"bad sidecar {side.name}: {exc}") from None
        if not isinstance(data, dict):
            raise _fail(path, f"bad sidecar {side.name}: expected a JSON object")
        layers.append((side.name, data))
    layers.append(("overrides", flags or {}))
    out: dict[str, str] = {}
    for where, values in layers:
        try:
            out |= validated_metadata(values)
        except ValueError as exc:
            raise _fail(path, f"{where}: {exc}") from None
    return out


def validated_metadata(values: dict[str, Any]) -> dict[str, str]:
    """Metadata given for a document (a sidecar's or the ``docs`` flags), normalised; ValueError
    names the first bad key or value."""
    out: dict[str, str] = {}
    for key, raw in values.items():
        key = "authority_type" if key in ("source_type", "source-type") else key
        if key not in OVERRIDE_KEYS:
            raise ValueError(f"unknown key {key!r} (use {', '.join(OVERRIDE_KEYS)})")
        if raw is not None and not isinstance(raw, str | int | float):
            raise ValueError(f"{key}: expected text, not {type(raw).__name__} {raw!r}")
        value = " ".join(str(raw if raw is not None else "").split())
        if not value:
            continue
        if key == "authority_type":
            value = value.lower().replace("-", "_").replace(" ", "_")
            if value not in AUTHORITY_TYPES:
                raise ValueError(f"authority type {raw!r}: use {', '.join(AUTHORITY_TYPES)}")
        elif key == "jurisdiction":
            value = normalize_jurisdiction(value)
        elif key == "date":
            filters.parse_date(value)
        elif key == "court":
            value = filters.normalize_court(value)
        out[key] = value
    return out


# --- Chunking -----------------------------------------------------------------------------------
def estimate_tokens(text: str) -> int:
    """Word pieces of ``text`` without a tokenizer: 1.35 a word (all-MiniLM-L6-v2's WordPiece
    averages ~1.3 on legal English)."""
    return math.ceil(len(text.split()) * 1.35)


@dataclass(slots=True)
class _Unit:
    text: str
    pin: str
    block: Block
    key: tuple  # units with different keys are never in one chunk
    part: str = ""
    star: int | None = None
    tokens: int = 0


def _units(doc: Document) -> Iterator[_Unit]:
    """The document's blocks, each with the pin, part and star page at its start."""
    stack: dict[int, str] = {}
    last: tuple[str, ...] | None = None
    part, n = "", 0
    first = re.search(r"\s(\d+)$", doc.meta.get("citation", ""))  # "392 U.S. 1": page *1
    starred = doc.kind == "opinion" and any(_STAR.search(b.text) for b in doc.blocks)
    star = int(first.group(1)) if first and starred else None
    for b in doc.blocks:
        text = " ".join(b.text.split())
        n += not b.is_heading  # paragraph number
        page_pin = f"p. {b.page}" if b.page else ""
        if doc.kind == "statute":
            if b.heading != last:
                stack, last = {}, b.heading
            _push_labels(text, stack)
            pin = _statute_pin(b.heading, stack) or page_pin
            yield _Unit(text, pin, b, (b.heading,))
        elif doc.kind == "opinion":
            part = _part_marker(text) or part
            if lead := _STAR.match(text):  # a paragraph opening on "*3" is on page 3
                star = _advance_star(lead.group(0), star)
            pin = f"*{star}" if star else page_pin or f"¶ {n}"
            key = (b.heading, part, star if star is not None else b.page)
            yield _Unit(text, pin, b, key, part, star)
            star = _advance_star(text, star)
        else:
            pin = page_pin or (b.heading[-1][:80] if b.heading else f"¶ {n}")
            yield _Unit(text, pin, b, (b.heading, b.page))  # a chunk cites one page


def _spans(text: str, limit: int, count: Callable[[str], int]) -> list[tuple[int, int, int]]:
    """(start, end, tokens) of the sentences of ``text``; one over ``limit`` is halved at the
    space nearest its middle (or, in a long word, at the middle) until each part fits."""
    from nupunkt import sent_spans

    def fit(s: int, e: int) -> list[tuple[int, int, int]]:
        n = count(text[s:e])
        if n <= limit or e - s < 2:
            return [(s, e, n)]
        mid = text.rfind(" ", s + 1, (s + e) // 2 + 1)
        mid = mid if mid > s else (s + e) // 2
        return fit(s, mid) + fit(mid, e)

    return [span for s, e in sent_spans(text) for span in fit(s, e)]


def _pieces(
    text: str, limit: int, overlap: int, count: Callable[[str], int]
) -> list[tuple[int, str]]:
    """(start offset, piece) of ``text`` cut at sentence boundaries into pieces of at most
    ``limit`` tokens, each after the first opening with up to ``overlap`` tokens of the last."""
    spans = _spans(text, limit, count)
    out: list[tuple[int, str]] = []
    i = 0
    while spans:
        j, total = i, 0
        while j < len(spans) and total + spans[j][2] + (j > i) <= limit:
            total += spans[j][2] + (j > i)
            j += 1
        j = max(j, i + 1)
        while j > i + 1 and count(text[spans[i][0] : spans[j - 1][1]]) > limit:
            j -= 1  # a tokenizer that counts the joined text higher than its sentences
        out.append((spans[i][0], text[spans[i][0] : spans[j - 1][1]].strip()))
        if j >= len(spans):
            break
        k, back = j, 0
        while k - 1 > i and back + spans[k - 1][2] <= overlap:
            back += spans[k - 1][2]
            k -= 1
        i = k if back + (j - k) + spans[j][2] + 1 <= limit else j  # the next piece moves on
    return out


def chunk_document(
    doc: Document,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
    count_tokens: Callable[[str], int] | None = None,
) -> list[dict[str, Any]]:
    """The passages of ``doc`` in the loader's shape: ``idx, text, source, title`` and flat
    metadata (doc_id, file, sha256, kind, heading, pin, page, part, citation, court,
    jurisdiction, date, date_int, authority_type, hidden_injection); each is at most
    ``max_tokens`` by ``count_tokens`` (default :func:`estimate_tokens`)."""
    if max_tokens < 8 or overlap_tokens < 0:
        raise ValueError(f"max_tokens {max_tokens} < 8 or overlap_tokens {overlap_tokens} < 0")
    overlap_tokens = min(overlap_tokens, max_tokens // 4)  # a smaller window keeps some overlap
    count = count_tokens or estimate_tokens
    small = max_tokens // SMALL_SHARE
    base = {
        "source": doc.meta.get("source") or doc.path.name,
        "title": doc.title,
        "doc_id": doc.doc_id,
        "file": doc.path.name,
        "sha256": doc.sha256,
        "kind": doc.kind,
        **{k: v for k, v in doc.meta.items() if k != "source"},
        "hidden_injection": ",".join(doc.hidden_flags),
    }
    if doc.meta.get("date"):
        base["date_int"] = filters.parse_date(doc.meta["date"])
    out: list[dict[str, Any]] = []

    def emit(text: str, unit: _Unit, pin: str, pins: Sequence[str] = ()) -> None:
        b = unit.block
        meta = {"heading": " > ".join(b.heading), "pin": pin, "page": b.page, "part": unit.part}
        if len(set(pins)) > 1:  # each line's own pin: a quote from its (b) is pinned to (b)
            meta["line_pins"] = "\n".join(pins)
        out.append({"idx": f"{doc.doc_id}#{len(out) + 1}", "text": text, **base})
        out[-1].update({k: v for k, v in meta.items() if v not in (None, "")})

    group: list[_Unit] = []  # headings first, then body units of one key

    def flush() -> None:
        body = [u for u in group if not u.block.is_heading]
        if not body:
            return  # headings wait for the text they open
        text = "\n".join(u.text for u in group)
        if sum(u.tokens + 1 for u in group) <= max_tokens and count(text) <= max_tokens:
            emit(text, body[0], body[0].pin, [u.pin for u in group])
        else:  # each piece is pinned where it starts: its unit, and a star page passed in it
            starts = [0, *itertools.accumulate(len(u.text) + 1 for u in group)]
            for start, piece in _pieces(text, max_tokens, overlap_tokens, count):
                k = max(bisect.bisect_right(starts, start) - 1, len(group) - len(body))
                unit, lead = group[k], _STAR.match(piece)  # a piece opening on "*3" is on *3
                at = text[starts[k] : start] + (lead.group(0) if lead else "")
                star = _advance_star(at, unit.star) if unit.star is not None else None
                pin = f"*{star}" if star else unit.pin
                emit(piece, unit, pin, [pin, *(u.pin for u in group[k + 1 :][: piece.count("\n")])])
        group.clear()

    for u in _units(doc):
        u.tokens = count(u.text)
        body = [g for g in group if not g.block.is_heading]
        tiny = sum(g.tokens for g in body) < small  # e.g. "Syllabus": it opens what follows
        fits = sum(g.tokens + 1 for g in group) + u.tokens <= max_tokens
        lead_in = body and body[-1].text.endswith(_LEAD_IN)
        if body and (
            u.block.is_heading
            or u.key != body[0].key
            or not (fits or tiny)
            or not (tiny or lead_in or doc.kind == "brief")
        ):
            flush()
        group.append(u)
    flush()
    _attach_definitions(out)
    return out


_DEFINITION = re.compile(
    r'^\s*(?:\(?[0-9A-Za-z]{1,4}(?:\.[0-9]+)*[.)]?\s+)?["\u201c]([^"\u201d]{2,60})["\u201d]\s+'
    r"(?:means|shall mean|includes|refers to|is defined as)\b"
)
"""A line that defines a term: '(a) "Dangerous dog" means …', '5.1 "Cause" means …'."""


def term_used(term: str, text: str) -> bool:
    """Whether ``text`` uses a defined ``term`` as a word ("a dangerous dog" uses "Dangerous
    dog"; "because" does not use "Cause"): its first letter in either case, the rest as defined."""
    head, rest = term[0], re.escape(term[1:])
    return re.search(rf"\b[{re.escape(head.upper() + head.lower())}]{rest}\b", text) is not None


def _attach_definitions(chunks: list[dict[str, Any]]) -> None:
    """Give each chunk the definitions (metadata ``definitions``, JSON: term, the defining
    sentence, its chunk and pin) of the terms the document defines and the chunk uses outside the
    definition: a rule quoted from it is read with them (``answer`` guard ``defined_term``)."""
    from question import split_sentences

    found, said = [], {}
    for c in chunks:
        lines = c["text"].split("\n")
        pins = str(c.get("line_pins") or "").split("\n")
        pins = pins if c.get("line_pins") else [c.get("pin") or ""] * len(lines)
        pinned = [
            (s, pin) for line, pin in zip(lines, pins, strict=True) for s in split_sentences(line)
        ]
        said[c["idx"]] = [s for s, _ in pinned]
        for sentence, pin in pinned:
            if m := _DEFINITION.match(sentence):
                found.append({"term": m[1], "text": sentence, "id": c["idx"], "pin": pin})
    for c in chunks:
        used = [
            d for d in found
            if any(term_used(d["term"], s) for s in said[c["idx"]] if s != d["text"])
        ]  # fmt: skip
        if used:
            c["definitions"] = json.dumps(used)
