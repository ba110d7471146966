"""The doctrine taxonomy and issue spotting: which doctrines a question raises, each searched under
its own name (docs/ARCHITECTURE.md, "Issue spotting").

The taxonomy (``datasets/legal_taxonomy.jsonl``) holds the MBE subjects' doctrines with aliases, a
one-line description and relations ``element_of`` / ``exception_to`` / ``related_to``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import rag_utils
from settings import Settings

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

TAXONOMY_PATH = Path(__file__).resolve().parent / "datasets" / "legal_taxonomy.jsonl"
RELATIONS = ("element_of", "exception_to", "related_to")


class TaxonomyError(RuntimeError):
    """The doctrine taxonomy cannot be read; the message names the file and the line."""


# --- Taxonomy -----------------------------------------------------------------------------------
_TOKEN = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    """Lower-case word tokens; punctuation and hyphens separate words ("res ipsa", "2-207")."""
    return _TOKEN.findall(text.lower())


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


class Match(NamedTuple):
    """A doctrine alias found in a text: token span [start, end)."""

    doctrine_ids: tuple[str, ...]
    alias: str
    start: int
    end: int


class Taxonomy:
    """The doctrines with an alias index for longest-match linking: alias token sequences -> the
    doctrine ids they name (an id kept once per alias, in file order)."""

    def __init__(self, doctrines: Sequence[Doctrine], fingerprint: str) -> None:
        self.doctrines: dict[str, Doctrine] = {d.id: d for d in doctrines}
        self.fingerprint = fingerprint
        index: dict[tuple[str, ...], dict[str, None]] = defaultdict(dict)  # ids as ordered sets
        for d in doctrines:
            for alias in (d.name, *d.aliases):
                if words := tuple(tokens(alias)):
                    index[words][d.id] = None
        self._aliases = {k: tuple(v) for k, v in index.items()}
        self._max_len = max((len(k) for k in index), default=0)
        self._first = {k[0] for k in index}

    def __getitem__(self, doctrine_id: str) -> Doctrine:
        return self.doctrines[doctrine_id]

    def find(self, text: str) -> list[Match]:
        """Alias matches in ``text``: at each position the longest alias wins and matches never
        overlap, so "procedural due process" is not also "due process"."""
        toks = tokens(text)
        out: list[Match] = []
        i, n = 0, len(toks)
        while i < n:
            longest = min(self._max_len, n - i) if toks[i] in self._first else 0
            for length in range(longest, 0, -1):
                if ids := self._aliases.get(tuple(toks[i : i + length])):
                    out.append(Match(ids, " ".join(toks[i : i + length]), i, i + length))
                    i += length
                    break
            else:
                i += 1
        return out

    def root(self, doctrine_id: str) -> str:
        """The claim a doctrine belongs to: follow ``element_of`` / ``exception_to`` upward
        (first parent each time) to a doctrine that has neither."""
        chain = [doctrine_id]
        while True:
            d = self.doctrines[chain[-1]]
            nxt = next((p for p in (*d.element_of, *d.exception_to) if p not in chain), None)
            if nxt is None:
                return d.id
            chain.append(nxt)


def load_taxonomy(path: str | Path | None = None) -> Taxonomy:
    """The doctrine taxonomy (JSONL, one doctrine a line), validated: unique ids, a name, a
    subject and relations that name existing ids. Cached per file and modification time."""
    p = Path(path) if path is not None else TAXONOMY_PATH
    try:
        return _read_taxonomy(p, p.stat().st_mtime_ns)
    except OSError as exc:
        raise TaxonomyError(f"cannot read the doctrine taxonomy {p}: {exc.strerror}") from None


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
                    **{f: str(rec[f]) for f in ("id", "name", "subject")},
                    description=str(rec.get("description", "")),
                    aliases=tuple(str(a) for a in rec.get("aliases", ())),
                    **{r: tuple(rec.get(r, ())) for r in RELATIONS},
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise TaxonomyError(f"{p}: line {lineno}: not a doctrine record ({exc})") from None
    ids = Counter(d.id for d in doctrines)
    if (dup := next((i for i, n in ids.items() if n > 1), None)) is not None:
        raise TaxonomyError(f"{p}: duplicate doctrine id {dup!r}")
    for d in doctrines:
        for rel in RELATIONS:
            if unknown := [other for other in getattr(d, rel) if other not in ids]:
                raise TaxonomyError(f"{p}: {d.id}.{rel} names unknown doctrine {unknown[0]!r}")
    return Taxonomy(doctrines, fingerprint=hashlib.sha1(raw).hexdigest()[:12])


# --- Doctrine vectors ---------------------------------------------------------------------------
_doctrine_vectors: dict[tuple, tuple[list[str], Any]] = {}


def doctrine_vectors(settings: Settings) -> tuple[list[str], np.ndarray]:
    """Embeddings of every doctrine's name and description, computed once per embedder and
    taxonomy version and cached on disk (``CHROMA_DIR/doctrines/<model>-<version>.npy``)."""
    import numpy as np

    tax = load_taxonomy()
    model = rag_utils.embedder_name(settings)
    folder = Path(settings.retrieval.chroma_dir).expanduser() / "doctrines"
    key = (model, tax.fingerprint, str(folder))
    if key in _doctrine_vectors:
        return _doctrine_vectors[key]
    ids = list(tax.doctrines)
    cache = folder / f"{rag_utils.sanitize_model_name(model)}-{tax.fingerprint}.npy"
    try:
        vecs = np.load(cache)
    except (OSError, ValueError):
        vecs = None
    if vecs is None or vecs.shape[0] != len(ids):
        # name, description and the first aliases: the aliases carry the words fact patterns use
        texts = [
            f"{d.name}: {d.description} ({'; '.join(d.aliases[:8])})"
            for d in tax.doctrines.values()
        ]
        vecs = np.asarray(rag_utils.get_embedder(settings).embed_documents(texts), dtype=np.float32)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            np.save(cache, vecs)
        except OSError as exc:
            logger.debug("cannot cache doctrine embeddings at %s: %s", cache, exc)
    _doctrine_vectors[key] = (ids, vecs)
    return ids, vecs


def reset_caches() -> None:
    """Forget the in-memory doctrine and query vectors (tests)."""
    _doctrine_vectors.clear()
    _embed_query.cache_clear()


@functools.lru_cache(maxsize=64)
def _embed_query(embedder: Any, query: str) -> np.ndarray:
    """The query's embedding, remembered (the planner links the same question more than once)."""
    return embedder.embed_query(query)


# --- Issue spotting -----------------------------------------------------------------------------
ALIAS_WEIGHT = 0.35
"""Score an alias hit adds to a doctrine's link score (cosine similarities are ~0.1-0.6)."""
MAX_PER_CLAIM = 2
"""Doctrines of one claim (same root) that link_doctrines returns at most."""


def link_doctrines(
    question: str, settings: Settings, k: int = 6, *, use_embeddings: bool = True
) -> list[Doctrine]:
    """The doctrines a question raises, best first: alias matches (an alias shared by n doctrines
    counts 1/n) plus the question's embedding cosine to each doctrine; at most ``MAX_PER_CLAIM``
    of one claim, so that one issue cannot crowd out the others."""
    tax = load_taxonomy()
    scores: dict[str, float] = defaultdict(float)
    picked: set[str] = set()  # an alias hit or among the top k by similarity
    for m in tax.find(question):
        for did in m.doctrine_ids:
            scores[did] += ALIAS_WEIGHT / len(m.doctrine_ids)
            picked.add(did)
    if use_embeddings:
        ids, vecs = doctrine_vectors(settings)
        sims = vecs @ _embed_query(rag_utils.get_embedder(settings), question)
        for did, sim in zip(ids, sims.tolist(), strict=True):
            if sim > 0:
                scores[did] += sim
        picked.update(ids[i] for i in sims.argsort()[::-1][:k])
    out: list[Doctrine] = []
    per_root: Counter[str] = Counter()
    for did in sorted(picked & scores.keys(), key=lambda d: (-scores[d], d)):
        root = tax.root(did)
        if per_root[root] < MAX_PER_CLAIM:
            per_root[root] += 1
            out.append(tax[did])
    return out[:k]


def issue_doctrine(issue: str, tax: Taxonomy) -> str | None:
    """The doctrine an issue label names (its first, longest alias match), or None."""
    best = max(tax.find(issue), key=lambda m: (m.end - m.start, -m.start), default=None)
    return best.doctrine_ids[0] if best else None


def doctrine_named(words: str) -> str | None:
    """The name of the doctrine a user's words name ("propensity" -> "Character evidence"; the
    name before its parentheses), or None."""
    tax = load_taxonomy()
    did = issue_doctrine(words, tax)
    return tax[did].name.split(" (")[0] if did else None


def claim_agenda(linked: Sequence[Doctrine], *, max_items: int | None = None) -> list[str]:
    """The linked doctrines as agenda items, one per claim (a doctrine, its elements and
    exceptions): named by its first doctrine, with up to three others it absorbed in parentheses
    (a name the first already contains is not repeated)."""
    tax = load_taxonomy()
    claims: dict[str, list[str]] = {}
    for d in linked:
        names = claims.setdefault(tax.root(d.id), [])
        if not names or (d.name.lower() not in names[0].lower() and d.name not in names):
            names.append(d.name)
    items = [f"{n[0]} ({'; '.join(n[1:4])})" if len(n) > 1 else n[0] for n in claims.values()]
    return items[:max_items] if max_items else items
