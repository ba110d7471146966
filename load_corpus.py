"""Load passages into the vector store (idempotent, resumable) and report what is loaded; the
commands (N, status, curated, starter, docs, remove) are in ``python load_corpus.py --help``.
Sources, file formats and resuming: docs/ARCHITECTURE.md, "Loading".
"""

from __future__ import annotations

import argparse
import bz2
import contextlib
import gzip
import hashlib
import itertools
import json
import logging
import lzma
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import filters
import injection
import rag_utils
from settings import Settings, SettingsError, load_dotenv_file, run_script

logger = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
FORMATS = {
    ".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl",
    ".json": "json", ".parquet": "parquet", ".pq": "parquet",
}  # fmt: skip
QA_FIELDS = ("question", "choice_a", "choice_b", "choice_c", "choice_d", "answer")
DEFAULT_BATCH = 256
DEFAULT_PADDING = 500
# a long load adds its passages and seconds to the collection's record (``status``) this often,
# so a load that is killed keeps all but its last minute
RECORD_EVERY_S = 60.0


class CorpusError(ValueError):
    """Bad input file; the message names the file and the row."""


def starter_dir() -> Path:
    return HERE / "datasets" / "starter"


# --- Reading files ------------------------------------------------------------------------------
# read for every format (pandas reads .zst for CSV, TSV and Parquet too)
COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def file_format(path: Path) -> str:
    inner = path.with_suffix("") if path.suffix.lower() in (*COMPRESSED, ".zst") else path
    if (fmt := FORMATS.get(inner.suffix.lower())) is None:
        what = path.suffix or "(no extension)"
        raise CorpusError(f"{path}: unknown format {what!r} — use CSV, TSV, JSONL, JSON or Parquet")
    return fmt


def _is_blank(value: Any) -> bool:
    nan = isinstance(value, float) and value != value
    return value is None or nan or isinstance(value, str) and not value.strip()


def _open_binary(p: Path) -> Any:
    suffix = p.suffix.lower()
    if suffix == ".zst":
        raise CorpusError(f"{p}: .zst is read for CSV, TSV and Parquet only; use .gz for JSON")
    return COMPRESSED.get(suffix, open)(p, "rb")


def _not_text(p: Path, row: int, exc: BaseException) -> CorpusError:
    if isinstance(exc, UnicodeDecodeError):
        why = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    else:  # a .gz/.bz2/.xz that is not one, or a truncated one
        why = f"cannot decompress ({rag_utils.short_error(exc)})"
    return CorpusError(f"{p}: row {row}: {why}")


def _read_tsv(p: Path, limit: int | None) -> Any:
    """A TSV file as a DataFrame of strings, read as plain TSV (no quoting) unless its non-blank
    lines do not all have one number of fields (a quoted field holding a newline breaks that) or
    every field holding a quote mark is wholly quoted (quoted TSV, as pandas and csv write it)."""
    import csv

    import pandas as pd

    common = {"sep": "\t", "dtype": str, "keep_default_na": False, "nrows": limit}
    widths: set[int] = set()
    if p.suffix.lower() != ".zst":  # a .zst is not read here; pandas' own parse decides
        with _open_binary(p) as fh:
            widths = {line.count("\t") for line in map(bytes.decode, fh) if line.strip()}
    with contextlib.suppress(pd.errors.ParserError):
        if len(widths) <= 1:
            plain = pd.read_csv(p, quoting=csv.QUOTE_NONE, **common)
            cells = [str(c) for col in plain for c in [col, *plain[col]] if '"' in str(c)]
            if not all(len(c) >= 2 and c[0] == c[-1] == '"' for c in cells) or not cells:
                return plain
    return pd.read_csv(p, **common)


def _json_rows(p: Path, lines: bool) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(row, record)`` of a JSONL file (row: the line number, blank lines skipped) or of a JSON
    array of objects, or an object holding one under "data" or "rows" (row 1: the first)."""
    row = 0
    try:
        with _open_binary(p) as fh:
            for row, raw in enumerate(fh, start=1) if lines else [(1, fh.read())]:
                text = raw.decode("utf-8")
                if lines and not text.strip():
                    continue
                try:
                    data = json.loads(text)
                except json.JSONDecodeError as exc:
                    why = exc.msg if lines else exc
                    raise CorpusError(f"{p}: row {row}: invalid JSON ({why})") from None
                if not lines and isinstance(data, dict):
                    data = data.get("data") or data.get("rows") or [data]
                if not lines and not isinstance(data, list):
                    raise CorpusError(
                        f"{p}: expected a JSON array of objects (or an object with 'data' or "
                        f"'rows'), found {type(data).__name__}"
                    )
                for i, rec in enumerate([data] if lines else data, start=row):
                    if not isinstance(rec, dict):
                        raise CorpusError(f"{p}: row {i}: expected a JSON object")
                    yield i, rec
    except UnicodeDecodeError as exc:
        raise _not_text(p, row, exc) from None
    except (OSError, EOFError) as exc:  # a JSON file's read fails before its row 1
        raise _not_text(p, row + 1, exc) from None


def iter_rows(path: str | Path, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(row number, record)`` of a CSV/TSV/JSONL/JSON/Parquet file, plain or compressed (.gz,
    .bz2, .xz); row 1 is the first record (for JSONL the line number)."""
    p = Path(path)
    if not p.exists():
        raise CorpusError(f"{p}: file not found")
    if p.is_dir():
        raise CorpusError(f"{p}: is a folder, not a file")
    fmt = file_format(p)
    if fmt in ("json", "jsonl"):
        yield from itertools.islice(_json_rows(p, fmt == "jsonl"), limit)
        return
    import pandas as pd

    try:
        if fmt == "parquet":
            df = pd.read_parquet(p).iloc[:limit]
        elif fmt == "tsv":
            df = _read_tsv(p, limit)
        else:
            df = pd.read_csv(p, sep=",", dtype=str, keep_default_na=False, nrows=limit)
    except pd.errors.EmptyDataError:
        raise CorpusError(f"{p}: row 1: the file is empty") from None
    except Exception as exc:
        raise CorpusError(f"{p}: cannot read as {fmt}: {' '.join(str(exc).split())}") from None
    for i, rec in enumerate(df.to_dict(orient="records"), start=1):
        yield i, {str(k): (None if _is_blank(v) else v) for k, v in rec.items()}


def _text(value: Any) -> str:
    return "" if _is_blank(value) else str(value).strip()


def _read_items(
    path: Path, limit: int | None, what: str, item: str, *fields: str
) -> list[tuple[str, dict[str, Any]]]:
    """``(id, record)`` of each record of a file, each with an ``idx`` (or ``id``) of its own and
    one of ``fields``; else :class:`CorpusError` names the file and the first bad row."""
    out: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for row, rec in iter_rows(path, limit=limit):
        rid, at = _text(rec.get("idx", rec.get("id"))), f"{path}: row {row}:"
        if not rid:
            raise CorpusError(f"{at} no {what} id (field 'idx')")
        if not any(_text(rec.get(f)) for f in fields):
            raise CorpusError(f"{at} {item} {rid!r} has no {fields[0]} (field '{fields[0]}')")
        if rid in seen:
            raise CorpusError(f"{at} duplicate {what} id {rid!r} (first at row {seen[rid]})")
        seen[rid] = row
        out.append((rid, rec))
    if not out:
        raise CorpusError(f"{path}: row 1: no {what}s (the file is empty)")
    return out


def read_passages(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Passages of a file, validated (each with an ``idx`` and a ``text``, ids unique), as dicts
    ``idx, text, source, title`` plus the other fields (metadata)."""
    p = Path(path)
    out: list[dict[str, Any]] = []
    skip = ("idx", "id", "text", "source", "title")
    for pid, rec in _read_items(p, limit, "passage", "passage", "text"):
        extra = {k: v for k, v in rec.items() if k not in skip and not _is_blank(v)}
        title = _text(rec.get("title"))
        if title and not rag_utils.passage_title(title):  # a benchmark label, not a title
            extra.setdefault("provenance", title)
            title = ""
        text, source = _text(rec["text"]), _text(rec.get("source")) or p.stem
        out.append({"idx": pid, "text": text, "source": source, "title": title, **extra})
    return out


def read_qa(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """QA items of a file with the Bar Exam QA field names (``idx, prompt, question, choice_a..
    choice_d, answer, gold_idx``); every item needs an ``idx`` and a ``question`` (or a
    ``prompt``); ids are unique. Missing optional fields become empty strings."""
    out: list[dict[str, Any]] = []
    for qid, rec in _read_items(Path(path), limit, "question", "item", "question", "prompt"):
        item = {k: (None if _is_blank(v) else v) for k, v in rec.items()} | {"idx": qid}
        item |= {f: _text(rec.get(f)) for f in ("prompt", "gold_idx", *QA_FIELDS)}
        out.append(item | {"answer": item["answer"].upper()})
    return out


def read_many(paths: Sequence[Path], reader: Any, limit: int | None = None) -> list[dict[str, Any]]:
    """Concatenate files read by ``reader``; ids stay unique across files."""
    out: dict[str, dict[str, Any]] = {}  # by id (a file's own duplicates are the reader's error)
    for p in paths:
        left = None if limit is None else limit - len(out)
        if left is not None and left <= 0:
            break
        for rec in reader(p, limit=left):  # the same passage in two split files: the first
            out.setdefault(rec["idx"], rec)
    return list(out.values())


# --- Sources: local Bar Exam QA folder, Hugging Face download, starter --------------------------
def _split_files(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(passage files, QA files) among a dataset's file names (relative paths): a name holding
    "passage" is passages, else one holding "qa" is QA; of each, the single whole-set file
    (``passages.tsv`` / ``qa.csv``) when present, else all splits."""
    passages = [n for n in names if "passage" in n.lower()]
    qa = [n for n in names if n not in passages and "qa" in n.lower()]
    whole_p = [n for n in passages if Path(n).stem.lower() == "passages"]
    whole_q = [n for n in qa if Path(n).stem.lower() == "qa"]
    return whole_p[:1] or passages, whole_q[:1] or qa


def barexam_dir(settings: Settings) -> Path:
    return HERE / Path(settings.data.datasets_dir).expanduser() / "barexam_qa"


def local_barexam(settings: Settings) -> tuple[list[Path], list[Path]] | None:
    """(passage files, QA files) of ``datasets/barexam_qa/`` when it holds passages."""
    root = barexam_dir(settings)
    found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in FORMATS)
    files = {str(p.relative_to(root)): p for p in found}
    passages, qa = _split_files(list(files))
    return ([files[n] for n in passages], [files[n] for n in qa]) if passages else None


def download_barexam(settings: Settings) -> tuple[list[Path], list[Path]]:
    """Download the passage and QA files of HF_DATASET (``reglab/barexam_qa``) into
    ``datasets/barexam_qa/``. Raises OSError-like exceptions when offline."""
    from huggingface_hub import HfApi, hf_hub_download

    repo = settings.data.hf_dataset
    root = barexam_dir(settings)
    files = HfApi().list_repo_files(repo, repo_type="dataset")
    passages, qa = _split_files([f for f in files if Path(f).suffix.lower() in FORMATS])
    if not passages:
        raise FileNotFoundError(f"{repo} has no passage files (files: {', '.join(files[:10])})")
    wanted = passages + qa
    print(f"downloading {len(wanted)} files of {repo} into {root} ...", file=sys.stderr)
    for f in wanted:
        hf_hub_download(repo, f, repo_type="dataset", local_dir=str(root))
    if (got := local_barexam(settings)) is None:
        raise FileNotFoundError(f"no passage files in {root} after downloading {repo}")
    return got


def default_source(settings: Settings) -> tuple[list[Path], list[Path]]:
    """(passage files, QA files): local Bar Exam QA, else downloaded, else the starter corpus."""
    if (got := local_barexam(settings)) is not None:
        return got
    try:
        return download_barexam(settings)
    except Exception as exc:
        print(
            f"offline or unavailable: cannot download {settings.data.hf_dataset} from Hugging Face "
            f"({rag_utils.short_error(exc, 160)}); use --passages PATH for local files — loading "
            "the bundled starter corpus instead",
            file=sys.stderr,
        )
    return starter_files()


def starter_files() -> tuple[list[Path], list[Path]]:
    """The starter corpus: ``([passages.jsonl], [qa.jsonl])``."""
    d = starter_dir()
    if not (d / "passages.jsonl").exists():
        raise CorpusError(f"{d}: the starter corpus is missing (no passages.jsonl)")
    qa = [d / "qa.jsonl"] if (d / "qa.jsonl").exists() else []
    return [d / "passages.jsonl"], qa


# --- Loading ------------------------------------------------------------------------------------
# metadata: the injection patterns a passage matched, comma-joined ("" clean; absent: unscreened)
INJECTION_FLAGS = "injection_flags"


def _metadata(p: dict[str, Any]) -> dict[str, Any]:
    """Stored metadata of a passage, with its injection screen result (:data:`INJECTION_FLAGS`)."""
    meta = {k: v for k, v in p.items() if k not in ("idx", "text", INJECTION_FLAGS)}
    flags = injection.screen_passage(p["text"])
    hidden = str(p.get("hidden_injection") or "")
    flags += [injection.HIDDEN_FLAG + f for f in hidden.split(",") if f]
    meta[INJECTION_FLAGS] = ",".join(flags)
    return meta


def load_passages(
    passages: Sequence[dict[str, Any]],
    settings: Settings,
    batch_size: int = DEFAULT_BATCH,
    progress: bool = True,
) -> int:
    """Embed and upsert the passages not yet stored (by id), ``batch_size`` at a time, each batch
    committed before the next; returns how many were added. Each passage's injection screen
    (:func:`injection.screen_passage`) is stored in its metadata."""
    embedder = rag_utils.get_embedder(settings)  # one that cannot load leaves no empty collection
    backend, device = (getattr(embedder, a, "unknown") for a in ("backend", "device"))
    store = rag_utils.get_store(settings)
    ids = [str(p["idx"]) for p in passages]
    if (dup := next((i for i, n in Counter(ids).items() if n > 1), None)) is not None:
        raise CorpusError(f"duplicate passage id {dup!r} in the passages to load")
    present = store.existing_ids(ids) if store.count() else set()
    todo = [p for p in passages if str(p["idx"]) not in present]
    if present:
        logger.info(
            "%d of %d passages already stored; loading %d", len(present), len(ids), len(todo)
        )
    if not todo:
        return 0
    rag_utils.require_writable(settings, f"add {len(todo)} passages")
    from tqdm import tqdm

    bar = tqdm(
        total=len(todo),
        unit="passage",
        desc=f"indexing into {store.name}",
        disable=not progress,
        smoothing=0.1,
        file=sys.stderr,
    )
    added = 0
    flagged: list[str] = []
    recorded = [0, time.perf_counter()]  # passages added and the time, at the last record

    def record() -> None:  # the passages since the last record join the indexing rate (status)
        now = time.perf_counter()
        try:
            if added > recorded[0]:
                store.record_indexing(backend, device, added - recorded[0], now - recorded[1])
        except Exception as exc:  # noqa: BLE001 - the passages are stored; only the record is lost
            logger.warning("cannot record the indexing rate: %s", rag_utils.short_error(exc))
        recorded[:] = [added, now]

    def commit(batch: list[dict[str, Any]], vecs: Any) -> None:
        nonlocal added
        metas = [_metadata(p) for p in batch]
        store.upsert([str(p["idx"]) for p in batch], [p["text"] for p in batch], metas, vecs)
        flagged.extend(
            str(p["idx"]) for p, m in zip(batch, metas, strict=True) if m[INJECTION_FLAGS]
        )
        added += len(batch)
        bar.update(len(batch))
        if time.perf_counter() - recorded[1] >= RECORD_EVERY_S:  # a killed load keeps its rate
            record()

    # Chroma's upsert runs beside the embedder (onnxruntime releases the GIL): the worker thread
    # screens and commits one batch while the next is embedded, each before the next is sent; an
    # interrupted load waits for the batch in flight (the pool's shutdown).
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="load_corpus") as pool:
            in_flight: Future = pool.submit(lambda: None)  # the batch before the first
            for i in range(0, len(todo), batch_size):
                batch = todo[i : i + batch_size]
                vecs = rag_utils.embed_passages([p["text"] for p in batch], settings)
                in_flight.result()
                in_flight = pool.submit(commit, batch, vecs)
            in_flight.result()
    finally:
        bar.close()
        record()
        if flagged:
            logger.warning(
                "%d of %d passages loaded look like prompt injections (metadata %r; e.g. %s)",
                len(flagged),
                added,
                INJECTION_FLAGS,
                ", ".join(flagged[:5]),
            )
    return added


def load_documents(
    paths: Sequence[str | Path],
    settings: Settings,
    overrides: dict[str, str] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Read, chunk and load the user's documents (files or folders; ``documents.py``): a file
    that cannot be read is skipped with one line on stderr saying why, an unchanged one is left
    as is, a changed one has its chunks replaced, and one with hidden instructions is loaded
    quarantined.  A document loaded again without ``overrides`` keeps the metadata flags it was
    loaded with before."""
    import documents

    files = documents.find_files(paths)
    if not files:
        raise CorpusError(f"no readable documents under {', '.join(map(str, paths))}")
    rag_utils.require_writable(settings, f"load {len(files)} documents")
    embedder = rag_utils.get_embedder(settings)  # a chunk holds its word pieces, [CLS] and [SEP]
    limit = min(documents.DEFAULT_MAX_TOKENS, int(getattr(embedder, "max_tokens", 256)) - 2)
    spans = getattr(embedder, "token_spans", None)
    count_tokens = (lambda text: len(spans(text))) if spans else None
    store = rag_utils.get_store(settings)
    report: dict[str, Any] = {"files": len(files), "loaded": [], "replaced": [], "unchanged": []}
    report.update(failed=[], quarantined=[], chunks_added=0, kept_flags=[])
    from tqdm import tqdm

    for path in tqdm(files, unit="file", desc="documents", disable=not progress, file=sys.stderr):
        given = overrides or {}
        if not given and store.count():
            given = store.document_flags(documents.document_id(path))
            report["kept_flags"] += [{"file": str(path), **given}] if given else []
        try:
            doc = documents.read_document(path, given)
            chunks = documents.chunk_document(doc, limit, count_tokens=count_tokens)
        except documents.DocumentError as exc:
            print(f"skipped: {exc}", file=sys.stderr)
            report["failed"].append({"file": str(path), "error": str(exc)})
            continue
        for c in chunks:  # text and metadata: a new sidecar or flag changes it too
            if given:
                c["given_flags"] = json.dumps(given, sort_keys=True)
            blob = json.dumps(c, sort_keys=True, default=str).encode()
            c["chunk_hash"] = hashlib.sha1(blob).hexdigest()[:16]
        stored = store.document_chunks(chunks[0]["doc_id"]) if store.count() else {}
        if stored == {c["idx"]: c["chunk_hash"] for c in chunks}:
            report["unchanged"].append(str(path))
            continue
        store.delete(list(stored))
        if hidden := chunks[0].get("hidden_injection"):
            report["quarantined"].append({"file": str(path), "flags": hidden})
            print(
                f"quarantined: {path}: hidden text reads as instructions ({hidden})",
                file=sys.stderr,
            )
        report["chunks_added"] += load_passages(chunks, settings, progress=False)
        report["replaced" if stored else "loaded"].append(str(path))
    return report


def ensure_starter_index(settings: Settings) -> int:
    """Index the bundled starter corpus into an empty passage collection; returns passages added."""
    if rag_utils.corpus_count(settings) > 0:
        return 0
    if rag_utils.is_read_only(settings):
        logger.warning("the store is empty and read-only: the starter corpus is not indexed")
        return 0
    passages = read_passages(starter_files()[0][0])
    logger.info("indexing the starter corpus (%d passages)", len(passages))
    return load_passages(passages, settings, progress=False)


def scan_metadata(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The counts :func:`status` reports, in one pass over stored passages (``iter_all``)."""
    sources, flags, kinds, places, screens = Counter(), Counter(), Counter(), Counter(), Counter()
    docs: dict[str, tuple[str, str]] = {}
    for p in records:
        sources[p["source"] or "(none)"] += 1
        a = filters.attributes(p["id"], p["source"], p["metadata"])
        kinds[a["authority_type"]] += 1
        places[a["jurisdiction"] or "(none)"] += 1
        if p["metadata"].get("doc_id"):
            docs[p["metadata"]["doc_id"]] = (a["authority_type"], a["jurisdiction"] or "(none)")
        value = p["metadata"].get(INJECTION_FLAGS)
        screens["unscreened" if value is None else "flagged" if value else "clean"] += 1
        flags.update(value.split(",") if value else ())
    return {
        "sources": dict(sources.most_common()),
        "authority_types": dict(kinds.most_common()),
        "jurisdictions": dict(places.most_common()),
        "documents": {
            "count": len(docs),
            "by_type": dict(Counter(k for k, _ in docs.values()).most_common()),
            "by_jurisdiction": dict(Counter(j for _, j in docs.values()).most_common()),
        },
        "injection_flagged": screens["flagged"],
        "injection_unscreened": screens["unscreened"],
        "injection_flags": dict(flags.most_common()),
    }


def status(settings: Settings) -> dict[str, Any]:
    """What the store of ``settings`` holds, for ``load_corpus.py status``; creates nothing."""
    r = settings.retrieval
    where = (
        f"{r.chroma_host}:{r.chroma_port}" if r.chroma_host else str(Path(r.chroma_dir).resolve())
    )
    existing = rag_utils.existing_collections(settings)
    name = rag_utils.collection_name(settings)
    memory = rag_utils.collection_name(settings, prefix=rag_utils.MEMORY_PREFIX) in existing
    collection, count, records, bm25, indexed_by = f"{name} (absent)", 0, [], "absent", []
    if name not in existing:  # a look creates nothing (a typo'd model or folder stays a typo)
        where += "" if existing or r.chroma_host else " (no store here)"
    else:
        store = rag_utils.get_store(settings)
        collection, count, indexed_by = store.name, store.count(), store.indexed_by()
        records = store.iter_all(include_text=False) if count else []
        with contextlib.suppress(ValueError, KeyError, OSError):
            saved = json.loads((store.bm25_dir / store.name / "ids.json").read_text())
            bm25 = "fresh" if int(saved["count"]) == count else "stale"
    return {
        "store": where,
        "collection": collection,
        "embedding_model": rag_utils.embedder_name(settings),
        "count": count,
        "indexed_by": indexed_by,
        **scan_metadata(records),
        "bm25_index": bm25,
        "reranker": r.reranker,
        "qa_memory_entries": rag_utils.memory_count(settings) if memory else 0,
    }


# --- CLI ----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="load_corpus.py",
        description="Load passages into the vector store (idempotent and resumable) or show status.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "commands:\n"
            "  N                 load the first N passages of the source (all when omitted)\n"
            "  status            collection size, embedding model and sources (--json)\n"
            "  curated [N]       every gold passage of the QA set + N padding passages (default 500)\n"
            "  starter           (re)load the bundled starter corpus\n"
            "  docs PATH...      your own documents: PDF, HTML, DOCX, Markdown, text files or\n"
            "                    folders of them, chunked by section, paragraph or heading with\n"
            "                    pin cites; metadata from the text, a <file>.meta.json sidecar or\n"
            "                    the flags below (idempotent: unchanged files are skipped)\n"
            "  remove PATH...    take documents loaded with 'docs' out of the store (files, also\n"
            "                    deleted or moved ones, or folders)\n\n"
            "source: --passages PATH, else datasets/barexam_qa/, else a download of HF_DATASET\n"
            "(reglab/barexam_qa) when online, else the starter corpus."
        ),
    )
    add = p.add_argument
    add("command", nargs="?", help="N | status | curated | starter | docs | remove")
    add("rest", nargs="*", metavar="ARG", help="'curated': padding passages; 'docs': paths")
    add("--passages", help="passages file (CSV, TSV, JSONL, JSON, Parquet)")
    add("--qa", help="QA file for 'curated' (same formats; needs gold_idx)")
    add("--batch-size", type=int, default=DEFAULT_BATCH, help="passages per upsert")
    add("--json", action="store_true", help="machine-readable output")
    add("--chroma-dir", help="Chroma folder (CHROMA_DIR)")
    add("--embedding-model", help="EMBEDDING_MODEL for this run")
    add("--no-progress", action="store_true", help="no progress bar")
    add("-v", "--verbose", action="store_true")
    meta = p.add_argument_group(
        "document metadata for 'docs' (overrides the text and sidecars; kept when the file is loaded again without them)"
    )
    for flag, what in DOC_FLAGS.items():
        meta.add_argument(f"--{flag}", help=what)
    return p


DOC_FLAGS = {
    "title": "the document's title",
    "citation": "its own citation, e.g. '392 U.S. 1' or '28 U.S.C. § 1441'",
    "court": "courts-db id, e.g. scotus, ca9, tex",
    "jurisdiction": "US (federal) or a state: TX, Texas",
    "date": "decision or enactment date, YYYY[-MM[-DD]]",
    "source-type": "constitution, statute, regulation, court_rule, case or secondary",
}  # the metadata flags of 'docs'; each overrides what the text or a sidecar says


def doc_overrides(args: argparse.Namespace) -> dict[str, str]:
    """The metadata the ``docs`` flags set (documents reads ``source-type`` as ``authority_type``)."""
    return {f: v for f in DOC_FLAGS if (v := getattr(args, f.replace("-", "_")))}


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _show(report: dict[str, Any], as_json: bool, lines: Iterable[str]) -> None:
    """A command's ``report`` as JSON (``--json``), else its ``lines`` for a reader."""
    print(json.dumps(report, indent=2) if as_json else "\n".join(lines))


def _status_lines(info: dict[str, Any]) -> Iterator[str]:
    yield f"store:           {info['store']}"
    yield f"collection:      {info['collection']}"
    yield f"embedding model: {info['embedding_model']}"
    yield f"passages:        {info['count']}"
    for row in info["indexed_by"]:
        rate = f", {row['passages_per_s']} passages/s" if row["passages_per_s"] else ""
        yield (
            f"indexed by:      {row['backend']} on {row['device']}: "
            f"{row['passages']} passages in {row['seconds']} s{rate}"
        )
    yield f"BM25 index:      {info['bm25_index']}"
    yield f"QA memory:       {info['qa_memory_entries']} cached answer(s) (main.py --clear-memory)"
    flags, unscreened = _counts(info["injection_flags"]), info["injection_unscreened"]
    yield (
        f"injection flags: {info['injection_flagged']} passages flagged"
        + (f" ({flags})" if flags else "")
        + (f"; {unscreened} loaded before screening" if unscreened else "")
    )
    for key, label in (("authority_types", "by type"), ("jurisdictions", "by jurisdiction")):
        if info.get(key):
            yield f"{label + ':':<17}{_counts(info[key])}"
    if (docs := info["documents"])["count"]:
        by = f"{_counts(docs['by_type'])}; {_counts(docs['by_jurisdiction'])}"
        yield f"documents:       {docs['count']} ({by})"
    if info["sources"]:
        yield "sources:"
        yield from (f"  {n:>8}  {name}" for name, n in info["sources"].items())


def run(args: argparse.Namespace, settings: Settings) -> int:
    command = (args.command or "").strip().lower()
    if command.lstrip("-").isdigit() and int(command) < 1:
        raise CorpusError(f"N must be at least 1, not {command}")
    if args.rest and command not in ("curated", "docs", "remove"):
        raise CorpusError(f"unexpected extra argument {args.rest[0]!r}")
    if command == "status":
        info = status(settings)
        _show(info, args.json, _status_lines(info))
        return 0
    if command in ("docs", "remove"):
        if not args.rest:
            raise CorpusError(
                f"{command} needs at least one file or folder: load_corpus.py {command} PATH..."
            )
        return (_run_docs if command == "docs" else _run_remove)(args, settings)
    if doc_overrides(args):
        raise CorpusError(
            "--title, --citation, --court, --jurisdiction, --date and --source-type are for 'docs'"
        )
    if command == "curated" and (len(args.rest) > 1 or args.rest and not args.rest[0].isdigit()):
        raise CorpusError(
            f"curated takes one number of padding passages, not {' '.join(args.rest)!r}"
        )
    if command not in ("", "all", "curated", "starter") and not command.isdigit():
        raise CorpusError(
            f"unknown command {args.command!r}: use N, status, curated, starter, docs or remove"
        )
    limit = int(command) if command.isdigit() else None

    # read and validate everything first: nothing is written when an input is bad
    if command == "starter":
        passage_files, qa_files = starter_files()
    elif args.passages:
        passage_files, qa_files = [Path(args.passages)], []
    else:
        passage_files, qa_files = default_source(settings)
    if args.qa:
        qa_files = [Path(args.qa)]

    if command == "curated":
        if not qa_files:
            raise CorpusError("curated needs a QA file: give --qa PATH")
        # every gold passage of the QA set, then the first N others
        gold = {str(q["gold_idx"]) for q in read_many(qa_files, read_qa) if q.get("gold_idx")}
        every = read_many(passage_files, read_passages)
        passages = [p for p in every if p["idx"] in gold]
        missing = sorted(gold - {p["idx"] for p in passages})
        padding = int(args.rest[0]) if args.rest else DEFAULT_PADDING
        passages += [p for p in every if p["idx"] not in gold][:padding]
        if missing:
            print(
                f"warning: {len(missing)} gold passages are not in the passage files "
                f"(e.g. {', '.join(missing[:3])})",
                file=sys.stderr,
            )
    else:
        passages = read_many(passage_files, read_passages, limit=limit)

    start = time.perf_counter()
    added = load_passages(
        passages, settings, batch_size=max(1, args.batch_size), progress=not args.no_progress
    )
    seconds = time.perf_counter() - start
    total = rag_utils.corpus_count(settings)
    result = {
        "source": [str(p) for p in passage_files],
        "requested": len(passages),
        "added": added,
        "already_stored": len(passages) - added,
        "collection": rag_utils.collection_name(settings),
        "count": total,
        "seconds": round(seconds, 2),
        "passages_per_s": round(added / seconds, 1) if added and seconds > 0 else None,
    }
    rate = f" ({result['passages_per_s']} passages/s)" if result["passages_per_s"] else ""
    done = f"added {added} passages{rate}, {result['already_stored']} already stored; "
    _show(result, args.json, [f"{done}{result['collection']} now holds {total}"])
    return 0


def _run_docs(args: argparse.Namespace, settings: Settings) -> int:
    """``load_corpus.py docs PATH...``; a file that cannot be read is named on stderr."""
    import documents

    flags = doc_overrides(args)
    try:  # a bad flag is one error, not one "skipped:" line per file
        documents.validated_metadata(flags)
    except ValueError as exc:
        raise CorpusError(f"docs: {exc}") from None
    start = time.perf_counter()
    report = load_documents(args.rest, settings, overrides=flags, progress=not args.no_progress)
    report["seconds"] = round(time.perf_counter() - start, 2)
    report["count"] = rag_utils.corpus_count(settings)
    lines = [
        f"{_n(report['files'], 'file')}: {len(report['loaded'])} loaded, "
        f"{len(report['replaced'])} replaced, {len(report['unchanged'])} unchanged, "
        f"{len(report['failed'])} skipped, {len(report['quarantined'])} quarantined; "
        f"{_n(report['chunks_added'], 'chunk')} added in {report['seconds']} s; "
        f"{rag_utils.collection_name(settings)} now holds {report['count']}"
    ]
    if kept := len(report["kept_flags"]):
        lines.append(f"{_n(kept, 'file')} kept the metadata flags given when they were last loaded")
    _show(report, args.json, lines)
    return _exit_status(len(report["failed"]), report["files"])


def _run_remove(args: argparse.Namespace, settings: Settings) -> int:
    """``load_corpus.py remove PATH...``: files (also deleted or moved ones) or folders; a path
    with no chunks to remove fails."""
    import documents

    rag_utils.require_writable(settings, "remove documents")
    store = rag_utils.get_store(settings)
    report: dict[str, Any] = {"removed": [], "not_loaded": [], "chunks_removed": 0}
    for path in documents.find_files(args.rest):
        ids = list(store.document_chunks(documents.document_id(path))) if store.count() else []
        store.delete(ids)
        report["removed" if ids else "not_loaded"].append(str(path))
        report["chunks_removed"] += len(ids)
    report["count"] = rag_utils.corpus_count(settings)
    if not args.json:  # the paths that failed, before the summary line
        for path in report["not_loaded"]:
            print(f"not loaded: {path}", file=sys.stderr)
    removed = f"removed {_n(len(report['removed']), 'document')} "
    now = f"{rag_utils.collection_name(settings)} now holds {report['count']}"
    _show(report, args.json, [f"{removed}({_n(report['chunks_removed'], 'chunk')}); {now}"])
    return _exit_status(len(report["not_loaded"]), len(report["not_loaded"] + report["removed"]))


def _exit_status(failed: int, total: int) -> int:
    """The exit status of ``docs`` and ``remove``: 0 none failed, 1 some did, 2 all did."""
    return 0 if not failed else 2 if failed == total else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    store_errors = (rag_utils.ModelLoadError, rag_utils.StoreError)  # exit 1; bad input exits 2
    try:
        load_dotenv_file()
        settings = Settings.from_env(
            chroma_dir=args.chroma_dir, embedding_model=args.embedding_model
        )
        return run(args, settings)
    except (SettingsError, FileNotFoundError, CorpusError, *store_errors) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, store_errors) else 2
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    run_script(main)
