"""One settings object for the whole project: CLI flag > environment (and ``.env``) > default.

Entry points build a :class:`Settings` once; library modules receive it and never read
``os.environ``.  Settings are read in groups (``settings.llm.provider``) and named by their
environment variable in lower case (``llm_provider``) in overrides and :meth:`Settings.replace`;
``.env.example`` documents every variable."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

_BOOLS = dict.fromkeys(("1", "true", "yes", "on", "y"), True)
_BOOLS.update(dict.fromkeys(("0", "false", "no", "off", "n", ""), False))

SEARCH_TYPES = ("dense", "keyword", "hybrid")
"""The search types of a research step (SEARCH_STRATEGY forces one)."""
RERANKER_CHOICES = ("auto", "cross-encoder", "hybrid", "none")
"""RERANKER values (rag_utils.RERANKERS adds "bm25", the ranking of a keyword search)."""


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


class LLMConfigError(RuntimeError):
    """The LLM cannot be configured (unknown provider, missing API key, embedded model not
    installed); the message says what to set.  ``providers`` raises it."""


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where runtime data goes by default: ``$XDG_CACHE_HOME/legalragagent`` (``~/.cache/...``),
    outside the project folder that ``langgraph dev`` watches for changes."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "legalragagent"


_DATA_DIRS = {
    "CHROMA_DIR": "chroma_db",
    "LLM_CACHE_PATH": "llm_cache.sqlite",
    "LOCAL_MODEL_DIR": "models",
    "CHECKPOINTS": "checkpoints.sqlite",
}
"""Variables whose default is a path below :func:`default_data_dir`."""


def _var(name: str, default: Any, rule: tuple | None = None, **kwargs: Any) -> Any:
    """A setting read from the environment variable ``name``; ``rule``: its choices, or its
    (low, high) bounds with None for no upper bound (:meth:`Settings.validate`)."""
    return field(default=default, metadata={"env": name, "rule": rule}, **kwargs)


def _data_var(name: str) -> Any:
    """A path setting whose default lies below :func:`default_data_dir`."""
    return field(
        default_factory=lambda: str(default_data_dir() / _DATA_DIRS[name]), metadata={"env": name}
    )


@dataclass(frozen=True)
class RetrievalSettings:
    """The vector store, embeddings, reranking and the QA memory (``settings.retrieval``)."""

    chroma_dir: str = _data_var("CHROMA_DIR")
    chroma_host: str | None = _var("CHROMA_HOST", None)
    chroma_port: int = _var("CHROMA_PORT", 8000)
    embedding_model: str = _var("EMBEDDING_MODEL", "default")
    embedding_device: str | None = _var("EMBEDDING_DEVICE", None)
    embedding_batch_size: int = _var("EMBEDDING_BATCH_SIZE", 16)
    embedding_backend: str = _var("EMBEDDING_BACKEND", "auto", ("auto", "onnx", "torch"))
    trust_remote_code: bool = _var("TRUST_REMOTE_CODE", False)
    reranker: str = _var("RERANKER", "auto", RERANKER_CHOICES)
    reranker_model: str = _var("RERANKER_MODEL", "cross-encoder/ms-marco-MiniLM-L-6-v2")
    source_diverse: bool = _var("SOURCE_DIVERSE_RETRIEVAL", False)
    overretrieve_factor: int = _var("OVERRETRIEVE_FACTOR", 4, (1, None))
    dense_centering: bool = _var("DENSE_CENTERING", True)
    """Rank dense candidates by the query minus the corpus's mean passage vector; ``dense_score``
    stays the plain cosine the evidence gates were calibrated on."""
    fusion_dense_weight: float = _var("FUSION_DENSE_WEIGHT", 0.8, (0, 1))
    """Weight of the dense ranking in hybrid rank fusion (benchmarks/bench_retrieval.py)."""
    memory_threshold: float = _var("MEMORY_THRESHOLD", 0.92, (-1, 1))


@dataclass(frozen=True)
class FilterSettings:
    """Passage filters (``settings.filters``; filters.py)."""

    jurisdiction: str = _var("FILTER_JURISDICTION", "")
    court: str = _var("FILTER_COURT", "")
    source_type: str = _var("FILTER_SOURCE_TYPE", "")
    after: str = _var("FILTER_AFTER", "")
    before: str = _var("FILTER_BEFORE", "")


@dataclass(frozen=True)
class LLMSettings:
    """The LLM providers, the client's limits and cache, the embedded model (``settings.llm``)."""

    provider: str = _var("LLM_PROVIDER", "local")
    base_url: str | None = _var("LLM_BASE_URL", None)
    api_key: str | None = _var("LLM_API_KEY", None, repr=False)
    model: str | None = _var("LLM_MODEL", None)
    provider_fast: str | None = _var("LLM_PROVIDER_FAST", None)
    model_fast: str | None = _var("LLM_MODEL_FAST", None)
    judge_provider: str | None = _var("JUDGE_PROVIDER", None)
    judge_model: str | None = _var("JUDGE_MODEL", None)
    json_mode: str = _var("LLM_JSON_MODE", "auto", ("auto", "schema", "prompt"))
    temperature: float = _var("LLM_TEMPERATURE", 0.0)
    timeout: float = _var("LLM_TIMEOUT", 0.0, (0, None))
    """Seconds per LLM call attempt; 0 = auto (providers.call_timeout)."""
    max_retries: int = _var("LLM_MAX_RETRIES", 4, (0, None))
    requests_per_minute: int = _var("LLM_REQUESTS_PER_MINUTE", 0)
    cache: bool = _var("LLM_CACHE", True)
    """A call made before is answered from the response cache (``llm_cache.py``): at temperature 0
    the same reply, without starting the model (a multiple-choice question asked again: 18 -> 2 s)."""
    cache_path: str = _data_var("LLM_CACHE_PATH")
    local_model_dir: str = _data_var("LOCAL_MODEL_DIR")
    local_ctx_size: int = _var("LOCAL_CTX_SIZE", 8192, (2048, None))
    """At least the longest prompt (a fact pattern's apply call, ~1,000 tokens) and its reply."""
    local_threads: int = _var("LOCAL_THREADS", 0)


@dataclass(frozen=True)
class AgentSettings:
    """How the agent answers: mode, gates, bounds (``settings.agent``)."""

    lean_gate: float = _var("LEAN_GATE", 0.33, (-1, 1))
    skip_injection_check: bool | None = _var("SKIP_INJECTION_CHECK", None)
    verdict_support: float | None = _var("VERDICT_SUPPORT", None, (0, 1))
    """Unset: no reading of the facts is shown as a verdict on the embedded model, every one with
    an API model (``answer.API_VERDICT_SUPPORT``)."""
    checkpoints: str = _data_var("CHECKPOINTS")
    """Where the CLI keeps each run's thread (LangGraph checkpoints): a SQLite file, or a
    ``postgresql://`` (``postgres://``) URL to keep them on a PostgreSQL server; "off" = none."""
    run_timeout: float = _var("RUN_TIMEOUT", 600.0, (0, None))
    answer_mode: str = _var("ANSWER_MODE", "auto", ("auto", "research", "evidence", "lean"))
    """auto = lean for a multiple-choice question, research for any other (answer.py)."""
    research_policy: str = _var("RESEARCH_POLICY", "agenda", ("agenda", "adaptive"))
    search_strategy: str = _var("SEARCH_STRATEGY", "auto", ("auto", *SEARCH_TYPES))
    max_steps: int = _var("MAX_STEPS", 3, (1, None))
    max_iterations: int = _var("MAX_ITERATIONS", 6, (1, None))
    retrieval_k: int = _var("RETRIEVAL_K", 5, (1, None))


@dataclass(frozen=True)
class DataSettings:
    """Where the datasets come from (``settings.data``; load_corpus.py, the eval scripts)."""

    hf_dataset: str = _var("HF_DATASET", "reglab/barexam_qa")
    datasets_dir: str = _var("DATASETS_DIR", "datasets")


@dataclass(frozen=True)
class Settings:
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings)
    filters: FilterSettings = field(default_factory=FilterSettings)
    llm: LLMSettings = field(default_factory=LLMSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    data: DataSettings = field(default_factory=DataSettings)

    # Snapshot of the environment, used only to look up provider API keys by variable name.
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """``overrides`` (by name, ``retrieval_k=3``; None: not given) > ``env`` > defaults."""
        env = dict(os.environ if env is None else env)
        # Data paths follow the XDG_CACHE_HOME of ``env``, not only that of the process.
        data = default_data_dir(env)
        values = {var.lower(): str(data / leaf) for var, leaf in _DATA_DIRS.items()}
        for name, (_, _, hint, _) in VARIABLES.items():
            raw = env.get(name.upper())
            if overrides.get(name) is not None:
                values[name] = overrides[name]
            elif raw is not None and (raw.strip() or _is_optional(hint)):
                values[name] = _parse(name.upper(), raw.strip(), hint)
        _check_names(overrides)
        settings = cls().replace(environ=env, **values)
        settings.validate()
        return settings

    def replace(self, **changes: Any) -> Settings:
        """A copy with settings changed by variable name (``replace(llm_max_retries=0)``)."""
        environ = changes.pop("environ", self.environ)
        _check_names(changes)
        values: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            group, attr, *_ = VARIABLES[name]
            values.setdefault(group, {})[attr] = value
        groups = {g: dataclasses.replace(getattr(self, g), **kw) for g, kw in values.items()}
        return dataclasses.replace(self, environ=environ, **groups)

    def flat(self) -> dict[str, Any]:
        """Every setting by its variable name in lower case (``llm_provider``), in field order."""
        return {name: getattr(getattr(self, g), attr) for name, (g, attr, *_) in VARIABLES.items()}

    def validate(self) -> None:
        """Raise SettingsError naming the first variable whose value breaks its rule."""
        for name, value in self.flat().items():
            rule, var = VARIABLES[name][3], name.upper()
            if rule is None or value is None:  # no rule, or an optional setting left unset
                continue
            if isinstance(rule[0], str):
                given = value.strip().lower() if var == "EMBEDDING_BACKEND" else value
                if given not in rule:
                    choices = f"{', '.join(rule[:-1])} or {rule[-1]}"
                    raise SettingsError(f"{var}={value!r}: use {choices}")
                continue
            low, high = rule
            if high is not None and not low <= value <= high:
                raise SettingsError(f"{var}={value}: must be between {low} and {high}")
            if high is None and value < low:
                raise SettingsError(f"{var}={value}: must be at least {low}")

    def secret(self, env_var: str | None) -> str | None:
        """The value of an environment variable holding a secret (API key), or None."""
        return (self.environ.get(env_var, "").strip() or None) if env_var else None


VARIABLES: dict[str, tuple[str, str, Any, tuple | None]] = {
    f.metadata["env"].lower(): (group, f.name, hints[f.name], f.metadata.get("rule"))
    for group, cls in typing.get_type_hints(Settings).items()
    if group != "environ"
    for hints in [typing.get_type_hints(cls)]
    for f in dataclasses.fields(cls)
}
"""Variable name in lower case -> (group, field, type, rule of :func:`_var`): ``llm_max_retries``
-> ("llm", ...)."""


def _check_names(names: Iterable[str]) -> None:
    unknown = set(names) - set(VARIABLES)
    if unknown:
        raise TypeError(f"unknown settings: {sorted(unknown)}")


def _is_optional(hint: Any) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def _parse(var: str, raw: str, hint: Any) -> Any:
    base = hint
    if _is_optional(hint):
        if raw == "":
            return None
        base = next(a for a in typing.get_args(hint) if a is not type(None))
    expected = {bool: "1/0, true/false or yes/no", int: "a whole number", float: "a number"}
    try:
        return _BOOLS[raw.lower()] if base is bool else base(raw)  # str, int or float
    except (KeyError, ValueError):
        raise SettingsError(f"{var}={raw!r}: expected {expected[base]}") from None


def load_dotenv_file(path: str | os.PathLike[str] = ".env") -> None:
    """Read ``.env`` into the environment without overriding what is already set (entry points only)."""
    from dotenv import load_dotenv

    load_dotenv(path, override=False)


def run_script(main: Callable[[], int | None]) -> NoReturn:
    """Exit with ``main()``'s status; quietly when the output's reader goes away (``| head``)."""
    if hasattr(signal, "SIGPIPE"):  # not on Windows
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
