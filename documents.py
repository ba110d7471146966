"""The user's own legal documents: PDF, HTML, DOCX, Markdown and text files read into passages that
keep their pin cites (``load_corpus.py docs``).

Reading and chunking are two steps joined by one record, :class:`Document`:

* A reader per format turns a file into :class:`Block` s (paragraphs, each with its page and the
  path of headings above it) and the document's title.  PDF text comes from pypdf, HTML from lxml,
  DOCX from python-docx; Markdown headings are ``#`` lines.  PDF and text files have no markup, so
  their lines are joined into paragraphs by layout (a vertical gap, a short last line, a structural
  line such as ``§ 1441.`` or ``(b)``), and running heads and page numbers are dropped.
* Documents are untrusted.  Text a reader of the file does not see (HTML comments, scripts,
  ``hidden`` / ``aria-hidden`` / ``display:none`` elements, ``<meta>``; PDF text drawn white,
  invisible (render mode 3) or below 1 pt, PDF metadata and annotations; hidden or white DOCX runs
  and comments) never becomes passage text.  It is kept as ``Document.hidden_text`` and screened
  with :func:`injection.screen_passage`; every chunk of a document whose hidden text reads as
  instructions carries ``hidden_injection`` (the loader quarantines it).  Visible text is screened
  by the loader, like every passage.
* The layout (``kind``) decides how a document is cut: ``statute`` (codes, rules, regulations,
  constitutions) by section and subsection, the pin being the deepest subsection at the chunk's
  start (``§ 1441(b)(2)``, ``Rule 803(2)``); ``opinion`` by paragraph, with the part (syllabus,
  majority, concurrence, dissent) and the page, star paging (``*123``) moving the pin from the
  marker on; ``brief`` (briefs, outlines, notes) by heading.
* Chunks fit the embedder: ``count_tokens`` (the loader passes the embedder's tokenizer) measures
  them; a long paragraph is cut at sentence boundaries (nupunkt) with an overlap, and small
  neighbours in one section are merged.  Chunk ids are ``<doc_id>#<n>``; ``doc_id`` is a slug of
  the file name, so a changed file replaces its old chunks (``sha256`` of the bytes tells it changed).
* Authority metadata (citation, court, jurisdiction, date, authority type) comes from the text
  with eyecite and courts-db; a ``<file>.meta.json`` sidecar overrides it and the caller's
  ``overrides`` (CLI flags) override both.

Every failure is a :class:`DocumentError` whose one-line message names the file and the reason.
"""

from __future__ import annotations

import calendar
import functools
import hashlib
import io
import json
import logging
import math
import re
import statistics
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import injection
from filters import AUTHORITY_TYPES, parse_date

logger = logging.getLogger(__name__)

__all__ = ["AUTHORITY_TYPES", "Block", "Document", "DocumentError", "chunk_document"]

MAX_FILE_BYTES = 50 * 2**20
MAX_PDF_PAGES = 3000
MAX_DOCX_BYTES = 200 * 2**20
"""The most a DOCX may expand to when unzipped."""
MAX_ZIP_RATIO = 100
"""The most a DOCX member may expand over its compressed size (text XML compresses ~10x)."""
MIN_FONT_PT = 1.0
"""PDF text drawn smaller than this is invisible to a reader."""
WHITE = 0.95
"""A fill colour at least this light (gray or every RGB component) is white text on white paper."""
DEFAULT_MAX_TOKENS = 240
DEFAULT_OVERLAP_TOKENS = 40
HEAD_CHARS = 3000
"""Characters from the start of a document searched for its caption, court and dates."""
CITATION_CHARS = 2000
SUFFIXES = {
    ".pdf": "pdf",
    ".html": "html",
    ".htm": "html",
    ".docx": "docx",
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "text",
}
KINDS = ("statute", "opinion", "brief")
OVERRIDE_KEYS = ("title", "citation", "court", "jurisdiction", "date", "authority_type", "source")


class DocumentError(ValueError):
    """A document that cannot be read; the one-line message names the file and why."""


def _fail(path: Path, why: str) -> DocumentError:
    return DocumentError(f"{path}: {' '.join(str(why).split())}")


@dataclass(frozen=True, slots=True)
class Block:
    """A paragraph (or heading) of visible text."""

    text: str
    page: int | None = None
    heading: tuple[str, ...] = ()
    """The headings above it, outermost first (a heading block's path ends with itself)."""


@dataclass
class Document:
    path: Path
    doc_id: str
    sha256: str
    title: str
    kind: str
    """Layout: one of :data:`KINDS`."""
    blocks: list[Block]
    meta: dict[str, str] = field(default_factory=dict)
    """Authority metadata: citation, court, jurisdiction, date, authority_type, source."""
    hidden_text: str = ""
    hidden_flags: list[str] = field(default_factory=list)
    pages: int | None = None


# ------------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------------


def find_files(paths: Iterable[str | Path]) -> list[Path]:
    """The documents under ``paths``: supported files in folders (recursive, sorted, hidden files
    and folders skipped) and every file named directly (an unsupported or missing one is kept,
    so reading it reports why)."""
    out: dict[Path, None] = {}
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.is_dir():
            out[p] = None
            continue
        for f in sorted(p.rglob("*")):
            rel = f.relative_to(p).parts
            if f.is_file() and f.suffix.lower() in SUFFIXES and not any(
                part.startswith((".", "~$")) for part in rel
            ):
                out[f] = None
    return list(out)


def doc_id_for(path: str | Path) -> str:
    """The stable id of a document: a slug of its file name (``Terry v. Ohio.pdf`` ->
    ``terry-v-ohio-pdf``)."""
    return re.sub(r"[^a-z0-9]+", "-", Path(path).name.lower()).strip("-") or "document"


def _size(n: float) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"
    return f"{int(n)} bytes"


def read_document(path: str | Path, overrides: dict[str, str] | None = None) -> Document:
    """Read one file into a :class:`Document` (visible text, hidden text screened, authority
    metadata with the sidecar and ``overrides`` applied). Raises :class:`DocumentError`."""
    p = Path(path)
    fmt = SUFFIXES.get(p.suffix.lower())
    if not p.exists():
        raise _fail(p, "file not found")
    if fmt is None:
        raise _fail(p, f"unsupported file type {p.suffix or '(none)'}: use PDF, HTML, DOCX, "
                    "Markdown or .txt")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise _fail(p, f"too large: {_size(size)} > {_size(MAX_FILE_BYTES)} limit")
    data = p.read_bytes()
    reader = {"pdf": _read_pdf, "html": _read_html, "docx": _read_docx}.get(fmt, _read_plain)
    title, blocks, hidden, pages = reader(p, data)
    if not any(b.text.strip() for b in blocks):
        raise _fail(p, "no text (scanned PDF? run OCR first)" if fmt == "pdf" else "no text")
    kind = _guess_kind(blocks)
    title = title or _guess_title([b.text for b in blocks[:40]]) or p.stem
    meta = _authority(title, blocks, kind)
    meta.update(_overrides(p, meta, overrides))
    title = meta.pop("title", title)
    hidden_text = "\n".join(h.strip() for h in hidden if h and h.strip())
    flags = injection.screen_passage(hidden_text) if hidden_text else []
    if flags:
        logger.warning("%s: hidden text reads as instructions (%s)", p, ", ".join(flags))
    doc = Document(p, doc_id_for(p), hashlib.sha256(data).hexdigest(), title, kind, blocks, meta,
                   hidden_text, flags, pages)
    logger.info("%s: %s, %d blocks, %s", p, kind, len(blocks), meta.get("authority_type"))
    return doc


def read_and_chunk(
    path: str | Path,
    *,
    overrides: dict[str, str] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
    count_tokens: Callable[[str], int] | None = None,
) -> list[dict[str, Any]]:
    """The passages of one file (:func:`read_document` then :func:`chunk_document`); never empty."""
    doc = read_document(path, overrides)
    chunks = chunk_document(doc, max_tokens, overlap_tokens, count_tokens)
    if not chunks:
        raise _fail(Path(path), "no text")
    return chunks


# ------------------------------------------------------------------------------------------------
# Structure of legal text
# ------------------------------------------------------------------------------------------------

_SECTION_LINE = re.compile(
    r"^(?:§§?|Sec\.|SEC\.|Section|SECTION)\s*(\d+[A-Za-z]?(?:[.\-–]\d+[A-Za-z]?)*)\.?(?:\s+(?=[A-Z])|$)"
)
_RULE_LINE = re.compile(r"^Rule\s+(\d+(?:\.\d+)*)\.?(?:\s+(?=[A-Z])|$)")
_OUTER_LINE = re.compile(r"^(?:Article|ARTICLE|Amendment|AMENDMENT|Title|TITLE|Chapter|CHAPTER)"
                         r"\s+(?:[IVXLC]+|\d+)\b")
_OUTLINE_LINE = re.compile(r"^(?:([IVX]+)|([A-H])|\d+)\.\s+[A-Z]")
_ARTICLE = re.compile(r"\b(Article|Amendment|ARTICLE|AMENDMENT)\s+([IVXLC]+|\d+)\b")
_SECTION = re.compile(r"(?:§§?|\bSec\.|\bSECTION|\bSection)\s*(\d+[A-Za-z]?(?:[.\-–]\d+[A-Za-z]?)*)")
_RULE = re.compile(r"\bRule\s+(\d+(?:\.\d+)*)")
_LABEL = re.compile(r"\(([a-z]{1,4}|\d{1,3}|[A-Z]{1,3})\)\s*")
_ROMAN = re.compile(r"(?=[ivxl])l?x{0,3}(?:ix|iv|v?i{0,3})")
_STAR = re.compile(r"(?<![\w*])\*(\d{1,5})\b(?!\*)")
_CAPTION = re.compile(r"^\S.{0,120}\sv\.\s.{1,120}$")
_PARTS = (
    ("syllabus", re.compile(r"^Syllabus\b")),
    ("dissent", re.compile(r"^(?:MR\.|MADAM\s+)?.{0,40}?JUSTICE\s+[A-Z'\-]+(?:,.{0,200}?)?,\s+dissenting"
                           r"|^[A-Z][A-Za-z'\-]+,\s+(?:Chief\s+|Circuit\s+|District\s+)?Judge,\s+dissenting")),
    ("concurrence", re.compile(r"^(?:MR\.|MADAM\s+)?.{0,40}?JUSTICE\s+[A-Z'\-]+(?:,.{0,200}?)?,\s+concurring"
                               r"|^[A-Z][A-Za-z'\-]+,\s+(?:Chief\s+|Circuit\s+|District\s+)?Judge,\s+concurring")),
    ("majority", re.compile(r"delivered the opinion of the Court|^PER CURIAM\b|^Opinion of the Court"
                            r"|^OPINION\b")),
)
_OPINION_SIGNS = re.compile(
    r"Opinion of the Court|delivered the opinion|\bJUSTICE\b|\bdissenting\b|\bconcurring\b"
    r"|\bSyllabus\b|\bPER CURIAM\b|\b(?:Decided|Argued)\b|\bJudge\b.{0,40}\bopinion\b",
)
_BRIEF_SIGNS = re.compile(r"\bBRIEF\b|\bMEMORANDUM\b|\bPetitioner'?s\b|\bMOTION\b", re.I)


def _part_marker(text: str) -> str | None:
    head = text[:300]
    return next((name for name, rx in _PARTS if rx.search(head)), None)


def _line_heading_level(line: str) -> int | None:
    """Heading level of a line of a PDF or text file, or None for body text."""
    if len(line) > 120:
        return None
    if _OUTER_LINE.match(line):
        return 1
    if _SECTION_LINE.match(line) or _RULE_LINE.match(line):
        return 2
    if len(line) <= 80 and not line.endswith((",", ";", ".")) or re.fullmatch(r"[IVX]+\.?", line):
        if sum(c.isalpha() for c in line) >= 3 and line.isupper() or re.fullmatch(r"[IVX]+\.?", line):
            return 1
        if m := _OUTLINE_LINE.match(line):
            return 1 if m.group(1) else 2 if m.group(2) else 3
    return None


def _label_level(label: str, stack: dict[int, str]) -> int:
    """Depth of a subsection label: (a) 1, (1) 2, (A) 3, (i) 4, (I) 5 (US Code style)."""
    if label.isdigit():
        return 2
    if label.isupper():
        return 5 if 4 in stack and _ROMAN.fullmatch(label.lower()) else 3
    return 4 if 3 in stack and _ROMAN.fullmatch(label) else 1


def _push_labels(text: str, stack: dict[int, str]) -> None:
    pos = 0
    while m := _LABEL.match(text, pos):
        level = _label_level(m.group(1), stack)
        for deeper in [k for k in stack if k >= level]:
            del stack[deeper]
        stack[level] = m.group(1)
        pos = m.end()


def _statute_pin(heading: Sequence[str], stack: dict[int, str]) -> str:
    outer = sec = ""
    for h in heading:
        if m := _ARTICLE.search(h):
            outer, sec = f"{'Art.' if m[1].lower() == 'article' else 'Amend.'} {m[2]}", ""
        if m := _RULE.search(h):
            sec = f"Rule {m[1]}"
        elif m := _SECTION.search(h):
            sec = f"§ {m[1]}"
    base = ", ".join(p for p in (outer, sec) if p)
    return base + "".join(f"({stack[k]})" for k in sorted(stack))


def _advance_star(text: str, star: int | None) -> int | None:
    """The star page after ``text``: each ``*N`` marker that moves forward moves it."""
    for m in _STAR.finditer(text):
        n = int(m.group(1))
        if star is None or star <= n <= star + 100:
            star = n
    return star


def _guess_kind(blocks: Sequence[Block]) -> str:
    head = "\n".join(b.text for b in blocks[:60])[:HEAD_CHARS]
    caption = any(_CAPTION.match(b.text[:250]) or " v. " in b.text[:120] for b in blocks[:25])
    signs = {m.group(0).lower() for m in _OPINION_SIGNS.finditer(head)}
    if (caption and signs or len(signs) >= 3) and not _BRIEF_SIGNS.search(head[:600]):
        return "opinion"
    headings = {b.heading[-1] for b in blocks if b.heading}
    sections = sum(bool(_SECTION.search(h) or _RULE.search(h) or _ARTICLE.search(h))
                   for h in headings)
    labelled = sum(bool(_LABEL.match(b.text)) for b in blocks)
    if sections and (sections >= 2 or labelled >= 2) and (sections + labelled) >= 0.3 * len(blocks):
        return "statute"
    return "brief"


def _guess_title(lines: Sequence[str]) -> str:
    lines = [" ".join(t.split()) for t in lines if t.strip()]
    caption = next((t for t in lines if len(t) <= 150 and _CAPTION.match(t)), None)
    title = caption or (lines[0] if lines else "")
    return title if len(title) <= 200 else title[:200].rsplit(" ", 1)[0] + "…"


# ------------------------------------------------------------------------------------------------
# Lines to paragraphs (PDF and text files)
# ------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Line:
    text: str
    page: int | None = None
    x: float | None = None
    y: float | None = None


_PAGE_NUMBER = re.compile(r"(?:page\s+)?[-–—\s]*\d{1,4}(?:\s+of\s+\d+)?[-–—\s]*", re.I)
_TERMINAL = (".", "?", "!", ":", '"', "”", ")")


def _drop_furniture(pages: list[list[_Line]]) -> list[_Line]:
    """The lines of all pages without page numbers and running heads/feet (a top or bottom line
    repeated, digits aside, on at least half the pages)."""
    def key(line: _Line) -> str:
        return re.sub(r"\d+", "#", " ".join(line.text.lower().split()))

    seen: dict[str, int] = {}
    for lines in pages:
        for k in {key(ln) for ln in lines[:2] + lines[-2:]}:
            seen[k] = seen.get(k, 0) + 1
    repeated = {k for k, n in seen.items() if n >= max(3, len(pages) / 2)}
    out = []
    for lines in pages:
        edge = {id(ln) for ln in lines[:2] + lines[-2:]}
        out += [ln for ln in lines if not _PAGE_NUMBER.fullmatch(ln.text.strip())
                and not (id(ln) in edge and key(ln) in repeated)]
    return out


def _blocks_from_lines(lines: list[_Line]) -> list[Block]:
    """Paragraphs of laid-out lines: a paragraph ends at a blank line, a heading, a structural
    line (subsection label, part of an opinion), a vertical gap, an indent or a short last line."""
    text_lines = [ln for ln in lines if ln.text.strip()]
    lengths = sorted(len(ln.text.strip()) for ln in text_lines) or [0]
    full = lengths[int(0.9 * (len(lengths) - 1))]
    unwrapped = full > 200 and all(ln.y is None for ln in text_lines)
    gaps = [a.y - b.y for a, b in zip(text_lines, text_lines[1:], strict=False)
            if a.y is not None and b.y is not None and a.page == b.page and a.y > b.y]
    gap = statistics.median(gaps) if gaps else None
    left = min((ln.x for ln in text_lines if ln.x is not None), default=None)

    def breaks(prev: _Line, line: _Line, t: str) -> bool:
        p = prev.text.strip()
        ends = p.endswith(_TERMINAL)
        if unwrapped or prev.page != line.page and ends:
            return True
        if _LABEL.match(t) and (p.endswith((".", ";", ":", "—", "–")) or p.endswith((" or", " and"))):
            return True
        if _part_marker(t) or (len(p) < 100 and _part_marker(p)):
            return True
        if gap and prev.y is not None and line.y is not None and prev.page == line.page:
            if prev.y - line.y > 1.6 * gap:
                return True
            if ends and left is not None and line.x is not None and line.x > left + 8:
                return True
        return ends and len(p) < 0.7 * full

    blocks: list[Block] = []
    heading: list[tuple[int, str]] = []
    buf: list[str] = []
    start: _Line | None = None
    prev: _Line | None = None

    def flush() -> None:
        if buf:
            blocks.append(Block(" ".join(buf), start.page, tuple(h for _, h in heading)))
            buf.clear()

    for line in lines:
        t = " ".join(line.text.split())
        if not t:
            flush()
            prev = None
            continue
        level = _line_heading_level(t)
        if level:
            flush()
            heading = [h for h in heading if h[0] < level] + [(level, t)]
            blocks.append(Block(t, line.page, tuple(h for _, h in heading)))
            prev = None
            continue
        if prev is not None and breaks(prev, line, t):
            flush()
        if buf and re.search(r"[a-z]-$", buf[-1]) and t[:1].islower():
            buf[-1] = buf[-1][:-1] + t  # a word hyphenated across lines
        else:
            if not buf:
                start = line
            buf.append(t)
        prev = line
    flush()
    return blocks


# ------------------------------------------------------------------------------------------------
# Readers: each returns (title, blocks, hidden text, pages)
# ------------------------------------------------------------------------------------------------

_Read = tuple[str, list[Block], list[str], int | None]
_SHOW = {b"Tj", b"TJ", b"'", b'"'}


class _PdfSink:
    """pypdf's text visitors for one page: text drawn white, invisibly (render mode 3 or 7), under
    1 pt or off the page goes to ``hidden``, the rest to ``lines`` with its position.  pypdf hands
    over text when it flushes its buffer, so each flush is hidden when any text operator since the
    previous flush was (a flush that mixes both stays out of the passages)."""

    def __init__(self, page: int, box: tuple[float, float, float, float]) -> None:
        self.page, self.box = page, box
        self.white, self.mode, self.size = False, 0, 12.0
        self.stack: list[tuple[bool, int, float]] = []
        self.pending: list[bool] = []
        self.op = b""
        self.lines = [_Line("", page)]
        self.hidden: list[str] = []

    def before(self, op: bytes, args: list, cm: list[float], tm: list[float]) -> None:
        self.op = op
        try:
            if op == b"q":
                self.stack.append((self.white, self.mode, self.size))
            elif op == b"Q" and self.stack:
                self.white, self.mode, self.size = self.stack.pop()
            elif op in (b"g", b"rg", b"k", b"sc", b"scn", b"cs"):
                vals = [float(a) for a in args if isinstance(a, int | float)]
                self.white = op != b"cs" and (
                    len(vals) == 1 and vals[0] >= WHITE
                    or len(vals) == 3 and min(vals) >= WHITE
                    or len(vals) == 4 and max(vals) <= 1 - WHITE
                )
            elif op == b"Tr" and args:
                self.mode = int(args[0])
            elif op == b"Tf" and len(args) > 1:
                self.size = float(args[1])
            elif op in _SHOW:
                self.pending.append(self._invisible(cm, tm))
        except (TypeError, ValueError):  # malformed operands: keep the state
            pass

    def _invisible(self, cm: list[float], tm: list[float]) -> bool:
        a, b = tm[0] * cm[0] + tm[1] * cm[2], tm[0] * cm[1] + tm[1] * cm[3]
        c, d = tm[2] * cm[0] + tm[3] * cm[2], tm[2] * cm[1] + tm[3] * cm[3]
        x, y = self._position(cm, tm)
        x0, y0, x1, y1 = self.box
        off_page = not (x0 - 20 <= x <= x1 + 20 and y0 - 20 <= y <= y1 + 20)
        tiny = abs(self.size) * math.sqrt(abs(a * d - b * c)) < MIN_FONT_PT
        return self.white or self.mode in (3, 7) or tiny or off_page

    @staticmethod
    def _position(cm: list[float], tm: list[float]) -> tuple[float, float]:
        return (tm[4] * cm[0] + tm[5] * cm[2] + cm[4], tm[4] * cm[1] + tm[5] * cm[3] + cm[5])

    def text(self, text: str, cm: list[float], tm: list[float], font: Any, size: float) -> None:
        hidden = any(self.pending)
        self.pending = self.pending[-1:] if self.op in _SHOW else []
        if not text:
            return
        if hidden and text.strip():
            self.hidden.append(text)
            text = "\n" * text.count("\n")
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
        raise _fail(path, "not a PDF (corrupt)")
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")
            except Exception as exc:
                raise _fail(path, f"encrypted PDF (cannot decrypt: {exc})") from None
            if not opened:
                raise _fail(path, "encrypted PDF (password required)")
        n = len(reader.pages)
    except DocumentError:
        raise
    except Exception as exc:
        raise _fail(path, f"not a PDF (corrupt: {exc})") from None
    if n > MAX_PDF_PAGES:
        raise _fail(path, f"too many pages: {n} > {MAX_PDF_PAGES} limit")
    hidden: list[str] = []
    pages: list[list[_Line]] = []
    title = ""
    try:
        info = reader.metadata or {}
        hidden += [str(v) for v in info.values() if isinstance(v, str)]
        title = " ".join(str(info.get("/Title") or "").split())
        for i, page in enumerate(reader.pages, start=1):
            box = tuple(float(v) for v in page.mediabox)
            sink = _PdfSink(i, box)
            page.extract_text(visitor_operand_before=sink.before, visitor_text=sink.text)
            pages.append([ln for ln in sink.lines if ln.text.strip()])
            hidden += sink.hidden
            for annot in page.get("/Annots") or []:
                contents = annot.get_object().get("/Contents")
                if contents:
                    hidden.append(str(contents))
    except Exception as exc:
        raise _fail(path, f"corrupt PDF (page {len(pages) + 1}: {exc})") from None
    if re.fullmatch(r"(?i)(untitled|microsoft word - .*|.*\.(docx?|pdf))?", title):
        title = ""
    lines = _drop_furniture(pages)
    return title, _blocks_from_lines(lines), hidden, n


_BLOCK_TAGS = frozenset(
    "address article aside blockquote body caption dd div dl dt figcaption figure footer form "
    "header hr li main nav ol p pre section table tbody td tfoot th thead tr ul".split()
)
_CSS_HIDDEN = re.compile(
    r"display\s*:\s*none|visibility\s*:\s*(?:hidden|collapse)|opacity\s*:\s*0*(?:\.0*)?\s*(?:;|$)"
    r"|(?:left|top|text-indent)\s*:\s*-\d{3,}",
    re.I,
)
_CSS_FONT = re.compile(r"font-size\s*:\s*(\d*\.?\d+)\s*(px|pt|em|rem|%)?", re.I)
_CSS_WHITE = re.compile(r"(?<![-\w])color\s*:\s*(?:white|#fff(?:fff)?\b|rgba?\(\s*255\s*,\s*255\s*,"
                        r"\s*255)", re.I)


def _html_hidden(el: Any, background: bool) -> bool:
    if el.get("hidden") is not None or (el.get("aria-hidden") or "").lower() == "true":
        return True
    style = el.get("style") or ""
    if _CSS_HIDDEN.search(style):
        return True
    if (m := _CSS_FONT.search(style)) and float(m[1]) < (10 if m[2] == "%" else 1):
        return True
    return bool(_CSS_WHITE.search(style)) and not background and "background" not in style.lower()


def _html_events(el: Any, hidden: list[str], background: bool = False) -> Iterator[tuple[str, str]]:
    """("t", text), ("br", "") and ("h1".."h6", heading) events of the visible content of ``el``;
    hidden content is appended to ``hidden``."""
    if el.text:
        yield "t", el.text
    for child in el:
        tag = child.tag.lower() if isinstance(child.tag, str) else None
        if tag is None:  # a comment or processing instruction
            hidden.append(child.text or "")
        elif tag in ("script", "style", "head", "meta", "link"):
            pass
        elif tag in ("noscript", "template") or _html_hidden(child, background):
            hidden.append(child.text_content())
        elif re.fullmatch(r"h[1-6]", tag):
            inner = "".join(t for kind, t in _html_events(child, hidden, background) if kind == "t")
            yield tag, " ".join(inner.split())
        else:
            block = tag in _BLOCK_TAGS or tag == "br"
            if block:
                yield "br", ""
            yield from _html_events(
                child, hidden, background or "background" in (child.get("style") or "").lower()
            )
            if block:
                yield "br", ""
        if child.tail:
            yield "t", child.tail


def _read_html(path: Path, data: bytes) -> _Read:
    import lxml.html
    from lxml.etree import ParserError

    try:
        root = lxml.html.document_fromstring(data)
    except (ParserError, ValueError) as exc:
        raise _fail(path, f"no text ({exc})") from None
    hidden = [m.get("content") or "" for m in root.iter("meta")]
    title = " ".join((root.findtext(".//title") or "").split())
    blocks: list[Block] = []
    heading: list[tuple[int, str]] = []
    buf: list[str] = []

    def flush() -> None:
        text = " ".join("".join(buf).split())
        if text:
            blocks.append(Block(text, None, tuple(h for _, h in heading)))
        buf.clear()

    body = root.find("body")
    for kind, text in _html_events(body if body is not None else root, hidden):
        if kind == "t":
            buf.append(text)
        elif kind == "br":
            flush()
        elif text:
            flush()
            level = int(kind[1])
            heading = [h for h in heading if h[0] < level] + [(level, text)]
            blocks.append(Block(text, None, tuple(h for _, h in heading)))
    flush()
    if not title:
        title = next((b.text for b in blocks if b.heading and b.text == b.heading[-1]), "")
    return title, blocks, hidden, None


def _check_zip(path: Path, data: bytes) -> None:
    try:
        infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    except zipfile.BadZipFile:
        raise _fail(path, "not a DOCX (corrupt, or an old .doc renamed)") from None
    total = sum(i.file_size for i in infos)
    if total > MAX_DOCX_BYTES:
        raise _fail(path, f"DOCX expands to {_size(total)} (zip bomb?) > {_size(MAX_DOCX_BYTES)} limit")
    for i in infos:
        if i.file_size > 2**20 and i.file_size > MAX_ZIP_RATIO * max(i.compress_size, 1):
            raise _fail(path, f"DOCX member {i.filename} expands {i.file_size // max(i.compress_size, 1)}"
                        f"x (zip bomb?) > {MAX_ZIP_RATIO}x limit")


def _docx_run_hidden(run: Any) -> bool:
    from docx.enum.dml import MSO_THEME_COLOR
    from docx.shared import Pt, RGBColor

    font = run.font
    if font.hidden or font.size is not None and font.size < Pt(MIN_FONT_PT):
        return True
    color = font.color
    if color.type is None:
        return False
    return color.rgb == RGBColor(0xFF, 0xFF, 0xFF) or color.theme_color in (
        MSO_THEME_COLOR.BACKGROUND_1, MSO_THEME_COLOR.LIGHT_1)


def _docx_paragraph(paragraph: Any, hidden: list[str]) -> str:
    style_font = paragraph.style.font if paragraph.style is not None else None
    if style_font is not None and style_font.hidden:
        hidden.append(paragraph.text)
        return ""
    out = []
    for item in paragraph.iter_inner_content():
        for run in getattr(item, "runs", [item]):
            (hidden if _docx_run_hidden(run) else out).append(run.text)
    return "".join(out)


def _read_docx(path: Path, data: bytes) -> _Read:
    _check_zip(path, data)
    import docx
    from docx.table import Table

    try:
        d = docx.Document(io.BytesIO(data))
    except Exception as exc:
        raise _fail(path, f"not a DOCX (corrupt: {exc})") from None
    props = d.core_properties
    hidden = [props.title or "", props.subject or "", props.keywords or "", props.comments or ""]
    hidden += [c.text for c in getattr(d, "comments", [])]
    blocks: list[Block] = []
    heading: list[tuple[int, str]] = []
    title = " ".join((props.title or "").split())
    for item in d.iter_inner_content():
        if isinstance(item, Table):
            for row in item.rows:
                cells = dict.fromkeys(  # merged cells repeat
                    " ".join(_docx_paragraph(p, hidden) for p in c.paragraphs) for c in row.cells)
                text = " | ".join(" ".join(c.split()) for c in cells if c.strip())
                if text:
                    blocks.append(Block(text, None, tuple(h for _, h in heading)))
            continue
        text = " ".join(_docx_paragraph(item, hidden).split())
        style = item.style.name if item.style is not None else ""
        m = re.fullmatch(r"Heading (\d)", style)
        if text and (m or style == "Title"):
            level = int(m.group(1)) if m else 0
            heading = [h for h in heading if h[0] < level] + [(level, text)]
            title = title or text
            blocks.append(Block(text, None, tuple(h for _, h in heading)))
        elif text:
            blocks.append(Block(text, None, tuple(h for _, h in heading)))
    return title, blocks, hidden, None


def _decode(path: Path, data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    if b"\x00" in data[:4096]:
        raise _fail(path, "not a text file (binary content)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")


def _strip_markdown_html(text: str, hidden: list[str]) -> str:
    """Markdown with its raw HTML's hidden parts (comments, hidden elements) taken out."""
    if "<" not in text:
        return text
    import lxml.html

    out = []
    root = lxml.html.fragment_fromstring(text, create_parent="div")
    for kind, t in _html_events(root, hidden):
        out.append(t if kind == "t" else f"\n{'#' * int(kind[1])} {t}\n" if kind[0] == "h" else "\n")
    return "".join(out)


def _read_plain(path: Path, data: bytes) -> _Read:
    text = _decode(path, data)
    hidden: list[str] = []
    if SUFFIXES[path.suffix.lower()] == "text":
        lines = [_Line(t) for t in text.splitlines()]
        blocks = _blocks_from_lines(lines)
        return _guess_title([ln.text for ln in lines[:40]]), blocks, hidden, None
    text = _strip_markdown_html(text, hidden)
    blocks: list[Block] = []
    heading: list[tuple[int, str]] = []
    buf: list[str] = []
    title = ""

    def flush() -> None:
        if buf:
            blocks.append(Block(" ".join(buf), None, tuple(h for _, h in heading)))
            buf.clear()

    for raw in text.splitlines():
        t = " ".join(re.sub(r"\*\*|__|`", "", raw).split())
        if m := re.fullmatch(r"(#{1,6})\s+(.*?)\s*#*", t):
            flush()
            level, t = len(m.group(1)), m.group(2)
            heading = [h for h in heading if h[0] < level] + [(level, t)]
            title = title or (t if level == 1 else "")
            blocks.append(Block(t, None, tuple(h for _, h in heading)))
        elif not t or re.match(r"(?:[-*+]|\d+[.)])\s|>|\(\w{1,4}\)\s", t):
            flush()
            if t:
                buf.append(re.sub(r"^(?:[-*+]|>)\s*", "", t))
        else:
            buf.append(t)
    flush()
    return title, blocks, hidden, None


# ------------------------------------------------------------------------------------------------
# Authority metadata
# ------------------------------------------------------------------------------------------------

_FEDERAL = re.compile(
    r"U\.S\.C\.|C\.F\.R\.|United States Code|Code of Federal Regulations|Federal Rules? of"
    r"|Fed\. R\.|Constitution of the United States|United States Constitution|U\.?S\.? Const"
)
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_name) if m} | {
    m.lower(): i for i, m in enumerate(calendar.month_abbr) if m} | {"sept": 9}
_DATE = re.compile(
    r"\b(Decided|Filed|Effective|Enacted|Dated|Argued|Submitted)\b[:\s]+(?:on\s+|as of\s+)?"
    r"(?:([A-Za-z]{3,9})\.?\s+(\d{1,2}),?\s+(\d{4})|(\d{4})-(\d{2})-(\d{2})|(\d{4})\b)",
    re.I,
)
_DATE_RANK = ("decided", "filed", "effective", "enacted", "dated", "argued", "submitted")
_FEDERAL_NAMES = ("us", "usa", "federal", "fed", "unitedstates", "unitedstatesofamerica")


def _key(value: str) -> str:
    return re.sub(r"[^a-z]", "", value.lower())


@functools.cache
def _jurisdictions() -> dict[str, str]:
    import courts_db
    import reporters_db

    states = json.loads((Path(courts_db.__file__).parent / "data" / "states.json").read_text())
    table = {_key(n): "US" for n in _FEDERAL_NAMES}
    by_name = {}
    for code, name in states.items():
        if len(code) == 2:
            table[_key(code)] = table[_key(name)] = by_name[name.lower()] = code
    for abbr, name in reporters_db.STATE_ABBREVIATIONS.items():
        if name.lower() in by_name:
            table.setdefault(_key(abbr), by_name[name.lower()])
    return table


def normalize_jurisdiction(value: str) -> str:
    """``US`` for the federal system, else a state's USPS code: ``federal`` -> US, ``Texas``,
    ``tex``, ``Tex.``, ``tx`` -> TX.  Raises ValueError for anything else."""
    code = _jurisdictions().get(_key(value or ""))
    if code is None:
        raise ValueError(f"unknown jurisdiction {value!r}: use US (federal) or a state: TX, Texas")
    return code


def _court_jurisdiction(court: str) -> str | None:
    import courts_db

    found = courts_db.find_court_by_id(court)
    if not found:
        return None
    if found[0].get("system") == "federal":
        return "US"
    try:
        return normalize_jurisdiction(found[0].get("location") or "")
    except ValueError:
        return None


def _find_court(texts: Iterable[str]) -> str | None:
    import courts_db

    for text in texts:
        if "court" in text.lower() and len(text) <= 150:
            name = re.sub(r"^(?:in|for)\s+the\s+", "", text.strip(" .,:"), flags=re.I)
            found = courts_db.find_court(name, bankruptcy=False)
            if found:
                return found[0]
    return None


def _find_date(text: str) -> str | None:
    """The document's date from "Decided June 10, 1968", "Effective December 1, 2011", …: the
    decision date before a filing, effective, enactment or argument date."""
    best: tuple[int, str] | None = None
    for m in _DATE.finditer(text):
        if m[2]:
            y, mo, d = int(m[4]), _MONTHS.get(m[2].lower(), 0), int(m[3])
        elif m[5]:
            y, mo, d = int(m[5]), int(m[6]), int(m[7])
        else:
            y, mo, d = int(m[8]), 0, 0
        try:
            value = date(y, mo, d).isoformat() if mo else str(date(y, 1, 1).year)
        except ValueError:
            continue
        rank = _DATE_RANK.index(m[1].lower())
        if m[2] and not mo or not 1600 <= y <= 2200:
            continue
        if best is None or rank < best[0]:
            best = (rank, value)
    return best[1] if best else None


def _authority(title: str, blocks: Sequence[Block], kind: str) -> dict[str, str]:
    from eyecite import get_citations
    from eyecite.models import FullCaseCitation, FullLawCitation

    texts = [b.text for b in blocks[:60]]
    head = "\n".join(texts)[:HEAD_CHARS]
    cites = get_citations(head[:CITATION_CHARS])
    case = next((c for c in cites if isinstance(c, FullCaseCitation)), None)
    law = next((c for c in cites if isinstance(c, FullLawCitation)), None)
    meta: dict[str, str] = {}
    jurisdiction = None
    if kind == "opinion":
        meta["authority_type"] = "case"
        if case:
            meta["citation"] = case.corrected_citation()
        court = _find_court(texts[:40]) or (case.metadata.court if case else None)
        if court:
            meta["court"] = court
            jurisdiction = _court_jurisdiction(court)
    elif kind == "statute":
        both = f"{title}\n{head}"
        if re.search(r"C\.F\.R\.|Code of Federal Regulations", both):
            meta["authority_type"] = "regulation"
        elif re.search(r"\bRules? of (?:Evidence|Civil|Criminal|Appellate|Bankruptcy)|Federal Rules"
                       r"|^Rule\s+\d", both, re.M):
            meta["authority_type"] = "court_rule"
        elif "constitution" in both.lower() and re.search(r"^(?:Article|Amendment)\s", both, re.M | re.I):
            meta["authority_type"] = "constitution"
        else:
            meta["authority_type"] = "statute"
        if law:
            g = law.groups
            meta["citation"] = " ".join(
                p for p in (g.get("title") or g.get("chapter"), g.get("reporter"), "§", g.get("section")) if p
            )
        if _FEDERAL.search(both):
            jurisdiction = "US"
        else:
            words = [law.groups.get("reporter", "").split()[0]] if law and law.groups.get("reporter") else []
            words += re.findall(r"[A-Z][a-z]+(?: [A-Z][a-z]+)?", title)
            jurisdiction = next((_jurisdictions()[_key(w)] for w in words
                                 if _key(w) in _jurisdictions() and len(_key(w)) > 2), None)
    else:
        meta["authority_type"] = "secondary"
    when = _find_date(head) or (case.metadata.year if case and kind == "opinion" else None)
    if jurisdiction:
        meta["jurisdiction"] = jurisdiction
    if when:
        meta["date"] = when
    return meta


def _overrides(path: Path, extracted: dict[str, str], flags: dict[str, str] | None) -> dict[str, str]:
    """Validated metadata of the sidecar ``<file>.meta.json`` and then ``flags`` (later wins); a
    court given without a jurisdiction brings its own."""
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
    layers.append(("overrides", dict(flags or {})))
    out: dict[str, str] = {}
    for where, values in layers:
        for key, raw in values.items():
            key = {"source_type": "authority_type", "source-type": "authority_type"}.get(key, key)
            if key not in OVERRIDE_KEYS:
                raise _fail(path, f"{where}: unknown key {key!r} (use {', '.join(OVERRIDE_KEYS)})")
            if raw is None or not str(raw).strip():
                continue
            value = " ".join(str(raw).split())
            if key == "authority_type":
                value = value.lower().replace("-", "_").replace(" ", "_")
                if value not in AUTHORITY_TYPES:
                    raise _fail(path, f"{where}: authority_type {raw!r}: use {', '.join(AUTHORITY_TYPES)}")
            elif key == "jurisdiction":
                try:
                    value = normalize_jurisdiction(value)
                except ValueError as exc:
                    raise _fail(path, f"{where}: {exc}") from None
            elif key == "date":
                try:
                    parse_date(value)
                except ValueError as exc:
                    raise _fail(path, f"{where}: {exc}") from None
            elif key == "court":
                value = value.lower()
                if _court_jurisdiction(value) is None and not _court_known(value):
                    raise _fail(path, f"{where}: unknown court {raw!r} (a courts-db id: scotus, ca9, tex)")
            out[key] = value
    if "court" in out and "jurisdiction" not in out:
        j = _court_jurisdiction(out["court"])
        if j:
            out["jurisdiction"] = j
        else:
            extracted.pop("jurisdiction", None)
    return out


def _court_known(court: str) -> bool:
    import courts_db

    return bool(courts_db.find_court_by_id(court))


# ------------------------------------------------------------------------------------------------
# Chunking
# ------------------------------------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """Word pieces of ``text`` without a tokenizer: 1.35 per word (all-MiniLM-L6-v2 on legal
    English averages ~1.3)."""
    return math.ceil(len(text.split()) * 1.35)


@dataclass(slots=True)
class _Unit:
    text: str
    pin: str
    page: int | None
    heading: tuple[str, ...]
    part: str
    star: int | None


def _units(doc: Document) -> list[_Unit]:
    """The document's paragraphs, each with its pin at its start."""
    units: list[_Unit] = []
    stack: dict[int, str] = {}
    last: tuple[str, ...] | None = None
    part = ""
    star = None
    if doc.kind == "opinion" and any(_STAR.search(b.text) for b in doc.blocks):
        first = re.search(r"\s(\d+)$", doc.meta.get("citation", ""))
        star = int(first.group(1)) if first else None
    for n, b in enumerate(doc.blocks, start=1):
        text = " ".join(b.text.split())
        if not text:
            continue
        page_pin = f"p. {b.page}" if b.page else ""
        at = star
        if doc.kind == "statute":
            if b.heading != last:
                stack, last = {}, b.heading
            _push_labels(text, stack)
            pin = _statute_pin(b.heading, stack) or page_pin
        elif doc.kind == "opinion":
            part = _part_marker(text) or part
            pin = f"*{star}" if star else page_pin or f"¶ {n}"
            star = _advance_star(text, star)
        else:
            pin = page_pin or (b.heading[-1][:80] if b.heading else f"¶ {n}")
        units.append(_Unit(text, pin, b.page, b.heading, part, at))
    return units


def _spans(text: str, limit: int, count: Callable[[str], int]) -> list[tuple[int, int, int]]:
    """(start, end, tokens) of the sentences of ``text``; a sentence over ``limit`` is cut at
    words, a word over it every ``limit`` characters (a word piece is at least one character)."""
    from nupunkt import sent_spans

    out = []
    for s, e in sent_spans(text):
        n = count(text[s:e])
        if n <= limit:
            out.append((s, e, n))
            continue
        run: list[tuple[int, int, int]] = []
        for m in re.finditer(r"\S+", text[s:e]):
            ws, we = s + m.start(), s + m.end()
            wn = count(text[ws:we])
            if wn > limit:
                out += run
                run = []
                out += [(i, min(i + limit, we), count(text[i:min(i + limit, we)]))
                        for i in range(ws, we, limit)]
            else:
                run.append((ws, we, wn))
        out += run
    return out


def _pieces(text: str, limit: int, overlap: int, count: Callable[[str], int]) -> list[tuple[int, str]]:
    """``text`` cut at sentence boundaries into pieces of at most ``limit`` tokens, each starting
    with up to ``overlap`` tokens of the previous one: (start offset, piece)."""
    spans = _spans(text, limit, count)
    out: list[tuple[int, str]] = []
    i, done = 0, 0
    while i < len(spans):
        j, total = i, 0
        while j < len(spans) and total + spans[j][2] + (j > i) <= limit:
            total += spans[j][2] + (j > i)
            j += 1
        if j <= done:  # the overlap left no room for new text: start without it
            i = done
            continue
        j = max(j, i + 1)
        piece = text[spans[i][0] : spans[j - 1][1]].strip()
        while count(piece) > limit:  # a tokenizer that counts a join differently: drop the tail
            j -= 1
            piece = text[spans[i][0] : spans[j - 1][1]].strip() if j > i else piece[: len(piece) // 2]
            if j <= i:
                break
        out.append((spans[i][0], piece))
        done = max(j, i + 1)
        if done >= len(spans):
            break
        k, back = done, 0
        while k - 1 > i and back + spans[k - 1][2] <= overlap:
            back += spans[k - 1][2]
            k -= 1
        i = k
    return out


def chunk_document(
    doc: Document,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
    count_tokens: Callable[[str], int] | None = None,
) -> list[dict[str, Any]]:
    """Passages of ``doc`` in the loader's shape (``idx, text, source, title`` and flat metadata:
    doc_id, file, sha256, kind, heading, pin, page, part, citation, court, jurisdiction, date,
    date_int, authority_type, hidden_injection), each at most ``max_tokens`` by ``count_tokens``
    (default :func:`estimate_tokens`)."""
    if max_tokens < 8 or not 0 <= overlap_tokens < max_tokens // 2:
        raise ValueError(f"max_tokens {max_tokens} / overlap_tokens {overlap_tokens}: need "
                         "max_tokens >= 8 and 0 <= overlap < max_tokens / 2")
    count = count_tokens or estimate_tokens
    base = {
        "source": doc.meta.get("source") or doc.path.name,
        "title": doc.title,
        "doc_id": doc.doc_id,
        "file": doc.path.name,
        "sha256": doc.sha256,
        "kind": doc.kind,
        **{k: v for k, v in doc.meta.items() if k not in ("source", "title")},
    }
    if doc.meta.get("date"):
        base["date_int"] = parse_date(doc.meta["date"])
    if doc.hidden_flags:
        base["hidden_injection"] = ",".join(doc.hidden_flags)
    out: list[dict[str, Any]] = []

    def emit(text: str, unit: _Unit, pin: str) -> None:
        meta = {"heading": " > ".join(unit.heading), "pin": pin, "page": unit.page, "part": unit.part}
        rec = {"idx": f"{doc.doc_id}#{len(out) + 1}", "text": text, **base}
        rec.update({k: v for k, v in meta.items() if v not in (None, "")})
        out.append(rec)

    def split(text: str, unit: _Unit) -> None:
        for start, piece in _pieces(text, max_tokens, overlap_tokens, count):
            star = _advance_star(text[:start], unit.star) if unit.star is not None else None
            emit(piece, unit, f"*{star}" if star else unit.pin)

    group: list[_Unit] = []
    size = 0

    def flush() -> None:
        nonlocal size
        if group:
            text = "\n".join(u.text for u in group)
            if len(group) == 1 and size > max_tokens or count(text) > max_tokens:
                split(text, group[0])
            else:
                emit(text, group[0], group[0].pin)
        group.clear()
        size = 0

    for u in _units(doc):
        n = count(u.text)
        if group and ((u.heading, u.part) != (group[0].heading, group[0].part)
                      or size + n + 1 > max_tokens or n > max_tokens):
            flush()
        group.append(u)
        size += n + (len(group) > 1)
    flush()
    return out
