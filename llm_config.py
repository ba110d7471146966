"""Every LLM call of the agent and the eval scripts goes through this module.

* ``PROVIDERS`` — OpenAI-compatible endpoints as data (base URL, model, the env variable holding the
  key, published free-tier limits).  ``python llm_config.py`` prints them.
* ``get_llm(role)`` — a cached LangChain ``ChatOpenAI`` for the selected provider.  ``LLM_PROVIDER``
  picks the entry; ``LLM_BASE_URL`` / ``LLM_API_KEY`` / ``LLM_MODEL`` override it; the cheap roles
  (``FAST_ROLES``: classify, rewrite, injection) use ``LLM_PROVIDER_FAST`` / ``LLM_MODEL_FAST`` when set.
  The default ``local`` provider is the embedded model of :mod:`local_llm`.
* ``LLMClient`` — the one call helper: retries with backoff (honouring Retry-After), per-call
  timeout, an optional deadline (``LLMDeadlineError``), JSON output (provider JSON-schema mode, else
  prompt + :func:`parse_json_reply`), per-call metrics and an optional SQLite response cache.  A 200
  response that is not a chat completion (a proxy's HTML error page, broken JSON) is retried like a
  5xx.  API keys never reach the cache, logs or records, and :func:`redact_url` strips credentials
  from any URL before it is shown or saved.
"""

from __future__ import annotations

import argparse
import ast
import email.utils
import hashlib
import json
import logging
import random
import re
import sqlite3
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

import local_llm
from settings import Settings, load_dotenv_file, set_settings

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=BaseModel)


class LLMConfigError(RuntimeError):
    """The LLM cannot be configured (unknown provider, missing API key); the message says what to set."""


class LLMCallError(RuntimeError):
    """A call failed after all retries (rate limit, timeout, connection, server error, bad request)."""

    def __init__(
        self, message: str, *, role: str = "", provider: str = "", attempts: int = 0
    ) -> None:
        super().__init__(message)
        self.role = role
        self.provider = provider
        self.attempts = attempts


class LLMDeadlineError(LLMCallError):
    """The deadline passed before a call could finish.  Raised at once when a call starts past the
    deadline; no attempt or backoff sleep starts past it, and an attempt's timeout never runs beyond
    it.  A subclass of LLMCallError, so code that survives a failed call survives this too."""


class MalformedResponseError(RuntimeError):
    """A 200 response that is not a chat completion: not JSON (a proxy's HTML error page), an
    error object, or no choices.  Retried like a server error: it is the server's fault."""


class JSONReplyError(ValueError):
    """A reply holds no JSON object that validates against the schema."""


# ------------------------------------------------------------------------------------------------
# Credentials in URLs
# ------------------------------------------------------------------------------------------------

_SECRET_PARAM = re.compile(r"key|token|secret|password|passwd|pwd|sig|auth|credential", re.I)
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>()]+")
REDACTED = "***"


def _redact_params(part: str) -> str:
    """``a=1&api_key=s`` -> ``a=1&api_key=***`` (names kept, secret values hidden, order kept)."""
    out = []
    for pair in part.split("&"):
        name, eq, _value = pair.partition("=")
        if eq and _SECRET_PARAM.search(urllib.parse.unquote_plus(name)):
            pair = f"{name}={REDACTED}"
        out.append(pair)
    return "&".join(out)


def redact_url(url: str | None) -> str | None:
    """``url`` without its credentials: user name and password become ``***`` and so do the values
    of query (or fragment) parameters whose names look secret (``key``, ``api_key``, ``token``,
    ``sig``, ``password`` ...).  Host, port and path are kept so the record still says where the
    calls went.  Apply it wherever a URL is recorded (case studies, eval configs, traces, logs)."""
    if not url or "://" not in url:
        return url
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # an unparseable port or bracket: hide everything after the scheme
        return url.split("://", 1)[0] + "://" + REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        host = f"[{host}]" if ":" in host else host
        netloc = f"{REDACTED}@{host}{port}"
    return urllib.parse.urlunsplit(
        (
            parts.scheme,
            netloc,
            parts.path,
            _redact_params(parts.query),
            _redact_params(parts.fragment),
        )
    )


def redact_urls_in_text(text: str) -> str:
    """Every URL inside ``text`` passed through :func:`redact_url` (log lines, error messages)."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)) or "", text)


class RedactingFilter(logging.Filter):
    """A handler filter that strips credentials from URLs in every log line (httpx logs each
    request URL, user:password included).  The CLIs install it with :func:`install_log_redaction`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken log call is not ours to fix here
            return True
        clean = redact_urls_in_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install_log_redaction(logger_: logging.Logger | None = None) -> None:
    """Add :class:`RedactingFilter` to every handler of ``logger_`` (default: the root logger);
    call it after ``logging.basicConfig`` in a CLI.  Idempotent."""
    for handler in (logger_ or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


# ------------------------------------------------------------------------------------------------
# Provider registry
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Provider:
    """An OpenAI-compatible endpoint.  Limits are the published free-tier numbers (None = no fixed
    daily limit / pay as you go); providers change them, so treat them as a guide."""

    name: str
    base_url: str | None
    model: str
    api_key_env: str | None
    """The variable holding the key; ``api_key_env_aliases`` are read when it is unset."""
    requests_per_day: int | None = None
    tokens_per_day: int | None = None
    requests_per_minute: int | None = None
    """Calls started per minute that the client allows itself (None = no limit)."""
    supports_system_messages: bool = True
    supports_json_schema: bool = False
    key_required: bool = True
    local: bool = False
    """Served in-process by local_llm (base_url is known only once the server runs)."""
    notes: str = ""
    api_key_env_aliases: tuple[str, ...] = ()
    """Other variables that hold the same key (GOOGLE_API_KEY for Google AI Studio)."""

    def api_key(self, settings: Settings) -> str | None:
        """The key from ``api_key_env``, else from the first of its aliases that is set."""
        for var in (self.api_key_env, *self.api_key_env_aliases):
            value = settings.secret(var)
            if value:
                return value
        return None

    def key_variables(self) -> str:
        """The variable names a user may set, for messages: 'GEMINI_API_KEY (or GOOGLE_API_KEY)'."""
        if not self.api_key_env_aliases:
            return str(self.api_key_env)
        return f"{self.api_key_env} (or {', '.join(self.api_key_env_aliases)})"


_PROVIDER_LIST = [
    Provider("local", None, "qwen2.5-coder-1.5b-instruct", None, supports_json_schema=True,
             key_required=False, local=True,
             notes="default; embedded Qwen2.5-Coder-1.5B Q4_K_M via xllamacpp, offline ('local' extra)"),
    Provider("local-small", None, "qwen2.5-coder-0.5b-instruct", None, supports_json_schema=True,
             key_required=False, local=True,
             notes="embedded Qwen2.5-Coder-0.5B Q4_K_M, faster, weaker ('local-small' extra)"),
    Provider("google-gemma", "https://generativelanguage.googleapis.com/v1beta/openai/",
             "gemma-3-27b-it", "GEMINI_API_KEY", 14_400, None, supports_system_messages=False,
             requests_per_minute=30, api_key_env_aliases=("GOOGLE_API_KEY",), notes="Google AI Studio free tier (30 req/min, 15k tokens/min); system prompt folded into the user turn"),
    Provider("google-gemini-flash", "https://generativelanguage.googleapis.com/v1beta/openai/",
             "gemini-2.5-flash", "GEMINI_API_KEY", 250, None, supports_json_schema=True,
             requests_per_minute=10, api_key_env_aliases=("GOOGLE_API_KEY",), notes="Google AI Studio free tier (10 req/min)"),
    Provider("groq", "https://api.groq.com/openai/v1", "llama-3.3-70b-versatile", "GROQ_API_KEY",
             1_000, 100_000, requests_per_minute=30, notes="Groq free tier (30 req/min, 12k tokens/min)"),
    Provider("groq-small", "https://api.groq.com/openai/v1", "llama-3.1-8b-instant", "GROQ_API_KEY",
             14_400, 500_000, requests_per_minute=30, notes="Groq free tier; cheap calls (LLM_PROVIDER_FAST)"),
    Provider("openrouter-llama-free", "https://openrouter.ai/api/v1",
             "meta-llama/llama-3.3-70b-instruct:free", "OPENROUTER_API_KEY", 50, None,
             requests_per_minute=20, notes="OpenRouter free model (20 req/min; 1000 req/day after buying $10 credit)"),
    Provider("openrouter-deepseek-free", "https://openrouter.ai/api/v1",
             "deepseek/deepseek-chat-v3-0324:free", "OPENROUTER_API_KEY", 50, None,
             requests_per_minute=20, notes="OpenRouter free model; shares the free daily request budget"),
    Provider("openrouter-gemma-free", "https://openrouter.ai/api/v1", "google/gemma-3-27b-it:free",
             "OPENROUTER_API_KEY", 50, None, supports_system_messages=False,
             requests_per_minute=20, notes="OpenRouter free model; shares the free daily request budget"),
    Provider("openrouter-qwen-free", "https://openrouter.ai/api/v1",
             "qwen/qwen-2.5-72b-instruct:free", "OPENROUTER_API_KEY", 50, None,
             requests_per_minute=20, notes="OpenRouter free model; shares the free daily request budget"),
    Provider("openrouter-paid", "https://openrouter.ai/api/v1", "openai/gpt-4o-mini",
             "OPENROUTER_API_KEY", None, None, supports_json_schema=True,
             notes="OpenRouter paid model (pay per token); any OpenRouter model id via LLM_MODEL"),
    Provider("cerebras", "https://api.cerebras.ai/v1", "llama-3.3-70b", "CEREBRAS_API_KEY",
             14_400, 1_000_000, requests_per_minute=30, notes="Cerebras free tier (30 req/min, 60k tokens/min)"),
    Provider("ollama", "http://localhost:11434/v1", "qwen2.5:7b-instruct", None,
             supports_json_schema=True, key_required=False,
             notes="local Ollama server; `ollama pull` the model first; LLM_MODEL picks another"),
    Provider("deepseek", "https://api.deepseek.com/v1", "deepseek-chat", "DEEPSEEK_API_KEY",
             None, None, notes="paid, no fixed daily limit"),
    Provider("openai", "https://api.openai.com/v1", "gpt-4o-mini", "OPENAI_API_KEY", None, None,
             supports_json_schema=True, notes="paid; limits depend on the account tier"),
    Provider("together", "https://api.together.xyz/v1", "meta-llama/Llama-3.3-70B-Instruct-Turbo",
             "TOGETHER_API_KEY", None, None, notes="paid; per-minute limits by account tier"),
    Provider("mistral", "https://api.mistral.ai/v1", "mistral-small-latest", "MISTRAL_API_KEY",
             None, None, requests_per_minute=60, notes="free 'Experiment' plan: 1 req/s, 500k tokens/min, 1B tokens/month"),
    Provider("vllm", "http://localhost:8000/v1", "", None, supports_json_schema=True,
             key_required=False,
             notes="your vLLM server; set LLM_MODEL (and LLM_BASE_URL if not localhost:8000)"),
    Provider("llamacpp-server", "http://localhost:8080/v1", "local-model", None,
             supports_json_schema=True, key_required=False,
             notes="a separate llama.cpp llama-server; LLM_BASE_URL if not localhost:8080"),
]  # fmt: skip

PROVIDERS: dict[str, Provider] = {p.name: p for p in _PROVIDER_LIST}

PROVIDER_ALIASES: dict[str, str] = {
    "gemma": "google-gemma",
    "groq-llama70b": "groq",
    "or-llama70b": "openrouter-llama-free",
}
"""The original project's provider names, so that its ``.env`` works unchanged (its ``cerebras``
and ``ollama`` are registry names as they are)."""


def provider_name(name: str | None) -> str | None:
    """The registry name of ``name`` (an alias is translated; unknown names come back unchanged)."""
    if name is None:
        return None
    key = name.strip().lower()
    return PROVIDER_ALIASES.get(key, key)


FAST_ROLES = frozenset(
    {"classify", "classifier", "rewrite", "query_rewrite", "injection", "injection_check"}
)
"""Roles that use LLM_PROVIDER_FAST / LLM_MODEL_FAST when set (cheap, short calls)."""

_NO_KEY = "sk-no-key-required"


@dataclass(frozen=True)
class ResolvedLLM:
    """The endpoint one role talks to after applying the overrides (the key is never printed)."""

    provider: str
    base_url: str | None = field(repr=False)
    """May hold credentials (user:password@, ?key=): show :attr:`display_url` instead."""
    model: str
    supports_system_messages: bool
    supports_json_schema: bool
    local: bool
    api_key: str | None = field(default=None, repr=False)
    requests_per_minute: int | None = None

    @property
    def display_url(self) -> str | None:
        """The base URL without credentials (safe to print, log and save)."""
        return redact_url(self.base_url)

    @property
    def on_this_machine(self) -> bool:
        """The embedded model or a server on loopback (Ollama, vLLM, llama.cpp here): slow CPU
        inference, so such calls get the long default timeout."""
        if self.local:
            return True
        try:
            host = (urllib.parse.urlsplit(self.base_url or "").hostname or "").lower()
        except ValueError:
            return False
        return (
            host in {"localhost", "::1", "0.0.0.0"}
            or host.startswith("127.")
            or host.endswith(".localhost")
        )


LOCAL_TIMEOUT_S = 300.0
"""Default seconds per call for the embedded model and servers on this machine (LLM_TIMEOUT=0):
the 1.5B model on 2 CPU cores needs up to ~60 s for the longest node prompt, a slow laptop more."""
REMOTE_TIMEOUT_S = 60.0
"""Default seconds per call for remote APIs (LLM_TIMEOUT=0): a hosted 70B answers our prompts
(at most ~1,000 output tokens) in seconds; 60 s without a byte means the endpoint hangs."""


def call_timeout(cfg: ResolvedLLM, settings: Settings) -> float:
    """Seconds one attempt may take: LLM_TIMEOUT when set (> 0), else 300 on this machine and
    60 for remote providers."""
    if settings.llm_timeout and settings.llm_timeout > 0:
        return float(settings.llm_timeout)
    return LOCAL_TIMEOUT_S if cfg.on_this_machine else REMOTE_TIMEOUT_S


def deadline_after(seconds: float | None) -> float | None:
    """An absolute ``time.monotonic()`` deadline ``seconds`` from now; None for None or <= 0
    (no deadline).  ``deadline_after(settings.run_timeout)`` is a run's deadline."""
    if seconds is None or seconds <= 0:
        return None
    return time.monotonic() + float(seconds)


JUDGE_ROLES = frozenset({"judge"})
"""Roles that use JUDGE_PROVIDER / JUDGE_MODEL when set (the answer grader of the eval)."""


def resolve(role: str | None, settings: Settings) -> ResolvedLLM:
    """Which provider, URL, model and key ``role`` uses; raises LLMConfigError when unusable.

    The cheap roles (:data:`FAST_ROLES`) use LLM_PROVIDER_FAST / LLM_MODEL_FAST and the grader
    (:data:`JUDGE_ROLES`) JUDGE_PROVIDER / JUDGE_MODEL when set.  A separately chosen provider
    takes its own registry URL and key: LLM_BASE_URL, LLM_API_KEY and LLM_MODEL belong to the
    main one."""
    fast = role in FAST_ROLES
    judge = role in JUDGE_ROLES
    use_fast_provider = fast and bool(settings.llm_provider_fast)
    use_judge_provider = judge and bool(settings.judge_provider)
    if use_judge_provider:
        given, var = settings.judge_provider, "JUDGE_PROVIDER"
    elif use_fast_provider:
        given, var = settings.llm_provider_fast, "LLM_PROVIDER_FAST"
    else:
        given, var = settings.llm_provider, "LLM_PROVIDER"
    use_fast_provider = use_fast_provider or use_judge_provider  # "not the main provider"
    provider = PROVIDERS.get(provider_name(given) or "")
    if provider is None:
        raise LLMConfigError(
            f"{var}={given!r} is not a known provider; choose one of: {', '.join(PROVIDERS)} "
            f"or the aliases {', '.join(PROVIDER_ALIASES)} (python llm_config.py lists them)"
        )
    name = provider.name
    # The raw overrides belong to the main provider, not to a separately chosen fast provider.
    base_url = provider.base_url
    model = provider.model
    api_key = provider.api_key(settings)
    if not use_fast_provider:
        base_url = settings.llm_base_url or base_url
        model = settings.llm_model or model
        api_key = settings.llm_api_key or api_key
    if fast and settings.llm_model_fast:
        model = settings.llm_model_fast
    if judge and settings.judge_model:
        model = settings.judge_model
    local = provider.local and not (settings.llm_base_url and not use_fast_provider)
    if provider.key_required and not api_key:
        raise LLMConfigError(
            f"{var}={given} needs an API key: set {provider.key_variables()} or LLM_API_KEY "
            "in the environment or .env"
        )
    if not model:
        raise LLMConfigError(f"{var}={name} has no default model: set LLM_MODEL")
    if not local and not base_url:
        raise LLMConfigError(f"{var}={name} has no base URL: set LLM_BASE_URL")
    return ResolvedLLM(
        provider=name,
        base_url=base_url,
        model=model,
        supports_system_messages=provider.supports_system_messages,
        supports_json_schema=provider.supports_json_schema,
        local=local,
        api_key=api_key,
        requests_per_minute=settings.llm_requests_per_minute or provider.requests_per_minute,
    )


def check_config(settings: Settings, roles: tuple[str | None, ...] = (None, "classify")) -> None:
    """Raise LLMConfigError when any role cannot be configured: an unknown provider, a missing
    API key or model, or the embedded model's packages not installed.  Entry points call it before
    any work starts, so a configuration error costs nothing and prints one line (exit 2).  Starts
    nothing and sends no request."""
    checked: set[str] = set()
    for role in roles:  # default: the main provider, and the fast one for the cheap roles
        cfg = resolve(role, settings)
        if cfg.local and cfg.provider not in checked:
            checked.add(cfg.provider)

            try:
                local_llm.check_installed(cfg.provider)
            except local_llm.LocalModelError as exc:
                raise LLMConfigError(str(exc)) from None


# ------------------------------------------------------------------------------------------------
# Rate limiting
# ------------------------------------------------------------------------------------------------


class RateLimiter:
    """Spaces call starts at least ``60 / per_minute`` seconds apart, across threads, so that
    concurrent eval workers stay within a provider's requests-per-minute limit."""

    def __init__(self, per_minute: float) -> None:
        self.interval = 60.0 / per_minute
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self, deadline: float | None = None) -> float | None:
        """Block until this call may start; returns the seconds waited, or None (without waiting
        or taking a slot) when the call could only start after ``deadline``."""
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            if deadline is not None and start >= deadline:
                return None
            self._next = start + self.interval
        delay = start - now
        if delay > 0:
            time.sleep(delay)
        return delay


_limiters: dict[tuple[str, str | None, str, int], RateLimiter] = {}
_limiters_lock = threading.Lock()


def rate_limiter(cfg: ResolvedLLM) -> RateLimiter | None:
    """The process-wide limiter of an endpoint (None when it has no per-minute limit)."""
    if not cfg.requests_per_minute or cfg.requests_per_minute <= 0:
        return None
    key = (cfg.provider, cfg.base_url, cfg.model, cfg.requests_per_minute)
    with _limiters_lock:
        if key not in _limiters:
            _limiters[key] = RateLimiter(cfg.requests_per_minute)
        return _limiters[key]


# ------------------------------------------------------------------------------------------------
# Chat models
# ------------------------------------------------------------------------------------------------


def _to_messages(messages: Sequence[Any]) -> list[Any]:
    from langchain_core.messages import convert_to_messages

    return list(convert_to_messages(list(messages)))


def fold_system_messages(messages: Sequence[Any]) -> list[Any]:
    """Merge system messages into the first human message (for models that reject the system role)."""
    from langchain_core.messages import HumanMessage, SystemMessage

    msgs = _to_messages(messages)
    system = [m for m in msgs if isinstance(m, SystemMessage)]
    if not system:
        return msgs
    preamble = "\n\n".join(_content_text(m.content) for m in system)
    rest = [m for m in msgs if not isinstance(m, SystemMessage)]
    for i, m in enumerate(rest):
        if isinstance(m, HumanMessage):
            rest[i] = HumanMessage(content=f"{preamble}\n\n{_content_text(m.content)}")
            return rest
    return [HumanMessage(content=preamble), *rest]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
        return "".join(parts)
    return "" if content is None else str(content)


def _chat_model_class() -> type:
    from langchain_openai import ChatOpenAI

    class RegistryChatOpenAI(ChatOpenAI):
        """ChatOpenAI that folds system messages when the model rejects them and sends the
        classic ``max_tokens`` field that every OpenAI-compatible server understands."""

        fold_system: bool = False
        legacy_max_tokens: bool = True

        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super()._generate(*args, **kwargs)
            except json.JSONDecodeError as exc:  # Content-Type: application/json, body is not
                raise MalformedResponseError(
                    f"the 200 response body is not valid JSON ({exc.msg})"
                ) from None

        def _create_chat_result(self, response: Any, generation_info: Any = None) -> Any:
            check_chat_completion(response)
            return super()._create_chat_result(response, generation_info)

        def _get_request_payload(self, input_: Any, *, stop: Any = None, **kwargs: Any) -> dict:
            if self.fold_system:
                input_ = fold_system_messages(self._convert_input(input_).to_messages())
            payload = super()._get_request_payload(input_, stop=stop, **kwargs)
            if self.legacy_max_tokens and "max_completion_tokens" in payload:
                payload["max_tokens"] = payload.pop("max_completion_tokens")
            return payload

    return RegistryChatOpenAI


def check_chat_completion(response: Any) -> None:
    """Raise MalformedResponseError unless ``response`` (what the OpenAI SDK parsed from a 200
    reply) is a chat completion with at least one choice that has a message.  An empty message
    is a valid completion: :attr:`LLMResult.empty` reports it."""
    if isinstance(response, str | bytes):
        text = response.decode("utf-8", "replace") if isinstance(response, bytes) else response
        snippet = " ".join(text.split())[:80]
        raise MalformedResponseError(f"the 200 response is not a chat completion: {snippet!r}")
    data = response.model_dump() if hasattr(response, "model_dump") else response
    if not isinstance(data, dict):
        raise MalformedResponseError(
            f"the 200 response is not a chat completion ({type(response).__name__})"
        )
    if data.get("error"):
        detail = " ".join(str(data["error"]).split())[:120]
        raise MalformedResponseError(f"the 200 response is an error object: {detail}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponseError("the 200 response has no choices")
    first = choices[0]
    if not isinstance(first, dict) or not isinstance(first.get("message"), dict):
        raise MalformedResponseError("the 200 response's first choice has no message")


_llm_cache: dict[tuple, Any] = {}
_llm_lock = threading.Lock()


def get_llm(role: str | None, settings: Settings) -> Any:
    """A cached ``ChatOpenAI`` for ``role`` (starts the embedded model when the provider is local).

    The client never retries by itself (max_retries=0): :class:`LLMClient` does, with backoff.
    """
    cfg = resolve(role, settings)
    base_url = cfg.base_url
    model = cfg.model
    if cfg.local:
        try:
            server = local_llm.get_local_server(cfg.provider, settings)
        except local_llm.LocalModelError as exc:
            raise LLMConfigError(str(exc)) from exc
        base_url, model = server.base_url, server.model
    key_digest = hashlib.sha256((cfg.api_key or "").encode()).hexdigest()
    timeout = call_timeout(cfg, settings)
    cache_key = (
        cfg.provider,
        base_url,
        model,
        key_digest,
        settings.llm_temperature,
        timeout,
    )
    with _llm_lock:
        llm = _llm_cache.get(cache_key)
        if llm is None:
            cls = _chat_model_class()
            llm = cls(
                model=model,
                base_url=base_url,
                api_key=cfg.api_key or _NO_KEY,
                temperature=settings.llm_temperature,
                timeout=timeout,
                max_retries=0,
                fold_system=not cfg.supports_system_messages,
                legacy_max_tokens=cfg.provider != "openai",
            )
            _llm_cache[cache_key] = llm
        return llm


def clear_llm_cache() -> None:
    """Forget the cached chat models (tests; after changing settings)."""
    with _llm_lock:
        _llm_cache.clear()


# ------------------------------------------------------------------------------------------------
# JSON replies
# ------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def _loads_lenient(text: str) -> Any:
    """json.loads, then the usual small-model slips: trailing commas, Python-style quoting."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    fixed = _TRAILING_COMMA.sub(r"\1", text)
    try:
        return json.loads(fixed)
    except ValueError:
        pass
    pyish = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", fixed))
    pyish = re.sub(r"\bnull\b", "None", pyish)
    try:
        return ast.literal_eval(pyish)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError("not valid JSON") from None


def _json_candidates(text: str) -> list[str]:
    candidates = [m.group(1).strip() for m in _FENCE.finditer(text)]
    candidates.append(text.strip())
    # Every balanced {...} span, outermost first, so prose before/after the object is ignored.
    depth, start, in_str, quote, escape = 0, -1, False, "", False
    for i, ch in enumerate(text):
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == quote:
                in_str = False
        elif ch in "\"'" and depth > 0:
            in_str, quote = True, ch
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                candidates.append(text[start : i + 1])
    return candidates


def parse_json_reply(text: str, schema: type[T]) -> T:
    """Extract and validate a JSON object from a model reply.

    Accepts a fenced ```json block, a bare object, an object surrounded by prose, trailing commas
    and single-quoted (Python-style) objects.  Raises JSONReplyError saying what was wrong.
    """
    if not text or not text.strip():
        raise JSONReplyError("empty reply")
    last_validation: ValidationError | None = None
    for candidate in _json_candidates(text):
        try:
            data = _loads_lenient(candidate)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        try:
            return schema.model_validate(data)
        except ValidationError as exc:
            last_validation = exc
    if last_validation is not None:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
            for e in last_validation.errors()[:3]
        )
        raise JSONReplyError(f"JSON does not match {schema.__name__}: {errors}")
    snippet = text.strip().replace("\n", " ")[:80]
    raise JSONReplyError(f"no JSON object found in reply: {snippet!r}")


def cut_off_prefixes(text: str) -> Iterator[dict[str, Any]]:
    """The JSON object a reply cut off mid-way (at max_tokens) began, completed at each place where
    a value had ended, longest first: its open arrays and objects closed, the unfinished value
    dropped.  A caller validates each against what it needs and takes the first that passes."""
    start = text.find("{")
    if start < 0:
        return
    closers: list[str] = []
    cuts: list[tuple[int, str]] = []
    in_string = escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            closers.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not closers or closers.pop() != ch:
                break
            if not closers:
                break  # the object is complete: nothing was cut off
            cuts.append((i + 1, "".join(reversed(closers))))
        elif ch == ",":
            cuts.append((i, "".join(reversed(closers))))
    for end, close in reversed(cuts):
        try:
            data = json.loads(text[start:end] + close)
        except ValueError:
            continue
        if isinstance(data, dict):
            yield data


def json_schema_instruction(schema: type[BaseModel]) -> str:
    """The instruction appended (after the prompt, keeping its prefix stable) in prompt-JSON mode."""
    compact = json.dumps(schema.model_json_schema(), separators=(",", ":"))
    return (
        "\n\nReply with only one JSON object (no prose, no code fence) that matches this JSON "
        f"schema:\n{compact}"
    )


def _response_format(schema: type[BaseModel]) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema()},
    }


# ------------------------------------------------------------------------------------------------
# Response cache
# ------------------------------------------------------------------------------------------------


class ResponseCache:
    """SQLite cache of replies keyed by sha256 of (provider, base URL, model, messages, params).

    Holds reply text and token usage only — never an API key or header."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, provider TEXT, "
            "model TEXT, text TEXT, usage TEXT, created REAL)"
        )
        self._db.commit()

    @staticmethod
    def key(payload: dict) -> str:
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> dict | None:
        with self._lock:
            row = self._db.execute(
                "SELECT text, usage FROM responses WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        return {"text": row[0], "usage": json.loads(row[1] or "{}")}

    def put(self, key: str, provider: str, model: str, text: str, usage: dict) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                (key, provider, model, text, json.dumps(usage), time.time()),
            )
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


# ------------------------------------------------------------------------------------------------
# The call helper
# ------------------------------------------------------------------------------------------------


@dataclass
class LLMResult:
    text: str
    parsed: Any = None
    parse_error: str | None = None
    cached: bool = False
    latency_s: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    """Prompt tokens the provider served from its prompt cache (when it reports them)."""
    retries: int = 0
    finish_reason: str | None = None

    @property
    def empty(self) -> bool:
        """The model returned no text (content "" or null, whatever the finish reason).  Never
        an answer: callers treat it as a failed call, and it is never cached."""
        return not self.text.strip()


@dataclass
class CallRecord:
    role: str
    provider: str
    model: str
    latency_s: float
    in_chars: int
    out_chars: int
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    cached: bool = False
    retries: int = 0
    schema: str | None = None
    json_mode: str | None = None
    """'schema' (provider JSON-schema mode), 'prompt' (instruction + parsing) or None."""
    parse_failed: bool = False
    empty: bool = False
    """The reply had no text (see LLMResult.empty)."""
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Failure:
    retryable: bool
    reason: str
    retry_after: float | None = None


def _retry_after_seconds(headers: Any) -> float | None:
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
        value = headers.get("retry-after")
    except (AttributeError, ValueError):
        return None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _classify(exc: BaseException) -> _Failure:
    """Is the failure worth retrying, why, and how long the provider asks us to wait."""
    import openai

    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    for e in seen:
        if isinstance(e, MalformedResponseError):
            return _Failure(True, f"malformed response ({e})")
        if isinstance(e, openai.APITimeoutError):
            return _Failure(True, "timeout")
        if isinstance(e, openai.APIConnectionError):
            return _Failure(True, f"connection error ({e.__class__.__name__})")
        if isinstance(e, openai.APIStatusError):
            status = e.status_code
            headers = getattr(e.response, "headers", None)
            if status == 429:
                return _Failure(True, "rate limited (HTTP 429)", _retry_after_seconds(headers))
            if status >= 500 or status == 408:
                return _Failure(
                    True, f"server error (HTTP {status})", _retry_after_seconds(headers)
                )
            return _Failure(False, f"HTTP {status}: {e.message}")
        if isinstance(e, TimeoutError):
            return _Failure(True, "timeout")
        if isinstance(e, ConnectionError):
            return _Failure(True, f"connection error ({e.__class__.__name__})")
    return _Failure(False, f"{exc.__class__.__name__}: {exc}")


def usage(records: Sequence[CallRecord]) -> dict[str, Any]:
    """The one usage summary of a list of call records (a run's, an eval task's, a benchmark's):
    calls (from the provider and from the cache), errors, retries, parse failures, tokens,
    characters and LLM seconds, in total and per role."""

    def totals(rs: Sequence[CallRecord]) -> dict[str, Any]:
        return {
            "llm_calls": len(rs),
            "provider_calls": sum(not r.cached for r in rs),
            "cached_calls": sum(r.cached for r in rs),
            "llm_errors": sum(r.error is not None for r in rs),
            "retries": sum(r.retries or 0 for r in rs),
            "parse_failures": sum(bool(r.parse_failed) for r in rs),
            "empty_replies": sum(bool(r.empty) for r in rs),
            "input_tokens": sum(r.input_tokens or 0 for r in rs),
            "output_tokens": sum(r.output_tokens or 0 for r in rs),
            "cached_prompt_tokens": sum(r.cached_prompt_tokens or 0 for r in rs),
            "in_chars": sum(r.in_chars for r in rs),
            "out_chars": sum(r.out_chars for r in rs),
            "llm_seconds": round(sum(r.latency_s for r in rs), 3),
        }

    out = totals(records)
    out["by_role"] = {
        role: totals([r for r in records if r.role == role])
        for role in dict.fromkeys(r.role for r in records)
    }
    return out


class LLMClient:
    """The call helper every node and eval script uses.

    ``llm_factory(role) -> BaseChatModel`` replaces :func:`get_llm` (tests inject fake models).
    ``deadline`` (an absolute ``time.monotonic()`` value, or None) bounds every call made through
    this client — set it once per run (``client.deadline = deadline_after(settings.run_timeout)``)
    and no node has to pass it.
    """

    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0
    max_retry_after_s: float = 120.0
    """A provider asking us to wait longer than this (a daily quota) fails at once."""

    def __init__(
        self,
        settings: Settings,
        llm_factory: Callable[[str], Any] | None = None,
        *,
        deadline: float | None = None,
    ) -> None:
        self.settings = settings
        self._factory = llm_factory
        self.deadline: float | None = deadline
        """Default deadline of every call (time.monotonic() value); None = none."""
        self._records: list[CallRecord] = []
        self._lock = threading.Lock()
        self._cache: ResponseCache | None = None
        if self.settings.llm_cache:
            self._cache = ResponseCache(self.settings.llm_cache_path)

    # -- metrics ---------------------------------------------------------------------------------

    @property
    def records(self) -> list[CallRecord]:
        with self._lock:
            return list(self._records)

    def reset(self) -> None:
        with self._lock:
            self._records.clear()

    def summary(self, since: int = 0) -> dict:
        """:func:`usage` of the records since the last reset, from record ``since`` on (a run's
        first record: its context's ``record_offset``)."""
        return usage(self.records[since:])

    def is_local(self, role: str) -> bool:
        """True when ``role`` talks to the embedded local model (short reply budgets)."""
        return resolve(role, self.settings).local

    # -- calls -----------------------------------------------------------------------------------

    def _llm(self, role: str) -> Any:
        if self._factory is not None:
            return self._factory(role)
        return get_llm(role, self.settings)

    def _redact(self, text: str, cfg: ResolvedLLM) -> str:
        if cfg.api_key and len(cfg.api_key) >= 4:
            text = text.replace(cfg.api_key, REDACTED)
        if cfg.base_url and cfg.display_url != cfg.base_url:
            text = text.replace(cfg.base_url, cfg.display_url or "")
        return redact_urls_in_text(text)

    def effective_deadline(self, deadline: float | None = None) -> float | None:
        """The earlier of ``deadline`` and the client's own (a call never outlives the run)."""
        found = [d for d in (deadline, self.deadline) if d is not None]
        return min(found) if found else None

    def invoke(
        self,
        messages: Sequence[Any],
        *,
        role: str,
        schema: type[BaseModel] | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        json_mode: str | None = None,
        deadline: float | None = None,
    ) -> LLMResult:
        """Send ``messages`` (LangChain messages or (role, content) tuples) for ``role``.

        With ``schema`` the reply is parsed into it: ``.parsed`` is the instance, or None with
        ``.parse_error`` saying why (no exception; an empty reply is a parse failure too).
        ``.empty`` tells an empty reply apart for free-text calls.  Transport failures that
        persist after ``settings.llm_max_retries`` retries raise LLMCallError (a 200 response that
        is not a chat completion counts as one); configuration problems raise LLMConfigError at
        once.  ``json_mode`` forces "schema" (provider JSON-schema mode) or "prompt" (instruction +
        parsing); None picks schema mode where the provider supports it.  ``timeout`` (seconds)
        overrides the per-attempt timeout (:func:`call_timeout`) for this call.

        ``deadline`` (absolute ``time.monotonic()``; the earlier of it and ``self.deadline``
        applies): each attempt's timeout is capped by the time left, no attempt, rate-limit wait
        or backoff sleep starts past it, and LLMDeadlineError is raised when it passes — at once
        when the call starts after it.
        """
        if json_mode not in (None, "schema", "prompt"):
            raise ValueError(f"json_mode must be 'schema', 'prompt' or None, not {json_mode!r}")
        cfg = resolve(role, self.settings)
        deadline = self.effective_deadline(deadline)
        if deadline is not None and time.monotonic() >= deadline:
            raise LLMDeadlineError(
                f"LLM call for role {role!r} not started: the run deadline has passed "
                "(RUN_TIMEOUT / --deadline)",
                role=role,
                provider=cfg.provider,
                attempts=0,
            )
        msgs = _to_messages(messages)
        if not cfg.supports_system_messages:
            msgs = fold_system_messages(msgs)
        kwargs: dict[str, Any] = {}
        if schema is None:
            json_mode = None
        else:
            if json_mode is None:
                json_mode = "schema" if cfg.supports_json_schema else "prompt"
            # The model sees the schema in both modes (field names, enums).  In schema mode the
            # server enforces it, and the instruction goes at the end of the system message so
            # the prefix shared by every call of a node stays stable for the prompt cache.  In
            # prompt mode it must sit right after the question: the local 1.5B echoed the schema
            # itself when it was in the system message (bench_llm: 25% vs 100% valid).
            instruction = json_schema_instruction(schema)
            if json_mode == "schema":
                kwargs["response_format"] = _response_format(schema)
                msgs = _add_instruction(msgs, instruction, prefer_system=True)
            else:
                msgs = _add_instruction(msgs, instruction, prefer_system=False)
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        in_chars = sum(len(_content_text(m.content)) for m in msgs)

        cache_key = None
        if self._cache is not None:
            cache_key = ResponseCache.key(
                {
                    "provider": cfg.provider,
                    "base_url": cfg.display_url,
                    "model": cfg.model,
                    "messages": [[m.type, _content_text(m.content)] for m in msgs],
                    "temperature": self.settings.llm_temperature,
                    "max_tokens": max_tokens,
                    "json_mode": json_mode,
                    "schema": schema.model_json_schema() if schema is not None else None,
                }
            )
            hit = self._cache.get(cache_key)
            if hit is not None:
                usage = hit["usage"]
                result = LLMResult(
                    text=hit["text"],
                    cached=True,
                    input_tokens=usage.get("input_tokens"),
                    output_tokens=usage.get("output_tokens"),
                    finish_reason=usage.get("finish_reason"),
                )
                self._finish(result, cfg, role, schema, json_mode, in_chars)
                return result

        result = self._call_with_retries(
            msgs, kwargs, cfg, role, schema, json_mode, in_chars, timeout, deadline
        )
        self._finish(result, cfg, role, schema, json_mode, in_chars)
        # An empty or unparseable reply is a fault, not an answer: caching it would replay it to
        # every later run (also after the server is fixed), so only good replies are kept.
        if (
            self._cache is not None
            and cache_key is not None
            and not result.empty
            and result.parse_error is None
        ):
            self._cache.put(
                cache_key,
                cfg.provider,
                cfg.model,
                result.text,
                {
                    "input_tokens": result.input_tokens,
                    "output_tokens": result.output_tokens,
                    "finish_reason": result.finish_reason,
                },
            )
        return result

    def _call_with_retries(
        self,
        msgs: list[Any],
        kwargs: dict[str, Any],
        cfg: ResolvedLLM,
        role: str,
        schema: type[BaseModel] | None,
        json_mode: str | None,
        in_chars: int,
        timeout: float | None,
        deadline: float | None,
    ) -> LLMResult:
        import openai

        llm = self._llm(role)
        openai_model = _is_openai_model(llm)
        call_kwargs = dict(kwargs)
        per_call = float(timeout) if timeout is not None else call_timeout(cfg, self.settings)
        attempts = max(0, int(self.settings.llm_max_retries)) + 1
        limiter = rate_limiter(cfg)
        start = time.perf_counter()

        def fail(attempt: int, reason: str, *, at_deadline: bool) -> LLMCallError:
            self._record_failure(cfg, role, schema, json_mode, in_chars, start, attempt, reason)
            if at_deadline:
                return LLMDeadlineError(
                    f"LLM call for role {role!r} to {cfg.provider} ({cfg.model}) stopped at the "
                    f"run deadline after {attempt} attempt(s) and {time.perf_counter() - start:.1f}s"
                    f" (last: {reason}); raise RUN_TIMEOUT / --deadline to allow more time",
                    role=role,
                    provider=cfg.provider,
                    attempts=attempt,
                )
            return LLMCallError(
                f"LLM call for role {role!r} to {cfg.provider} ({cfg.model}) failed after "
                f"{attempt} attempt(s): {reason}",
                role=role,
                provider=cfg.provider,
                attempts=attempt,
            )

        reason = "no attempt made"
        for attempt in range(attempts):
            if limiter is not None:
                waited = limiter.wait(deadline)
                if waited is None:
                    why = "no rate-limit slot before the deadline"
                    raise fail(
                        attempt, why if attempt == 0 else f"{reason}; {why}", at_deadline=True
                    )
                if waited > 0:
                    logger.debug(
                        "LLM %s/%s: waited %.1fs for the rate limit", cfg.provider, role, waited
                    )
            attempt_timeout = per_call
            capped = False
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise fail(attempt, reason, at_deadline=True)
                capped = remaining < per_call
                attempt_timeout = min(per_call, remaining)
            if openai_model:
                call_kwargs["timeout"] = attempt_timeout
            try:
                message = llm.invoke(msgs, **call_kwargs)
            except openai.LengthFinishReasonError as exc:
                # JSON-schema mode raises on max_tokens truncation; keep the partial reply.
                choice = exc.completion.choices[0] if exc.completion.choices else None
                text = (choice.message.content or "") if choice else ""
                usage = exc.completion.usage
                return LLMResult(
                    text=text,
                    latency_s=time.perf_counter() - start,
                    input_tokens=usage.prompt_tokens if usage else None,
                    output_tokens=usage.completion_tokens if usage else None,
                    retries=attempt,
                    finish_reason="length",
                )
            except Exception as exc:
                failure = _classify(exc)
                reason = self._redact(failure.reason, cfg)
                too_long = (
                    failure.retry_after is not None and failure.retry_after > self.max_retry_after_s
                )
                if not failure.retryable or too_long:
                    if too_long:
                        reason += f"; the provider asks to wait {failure.retry_after:.0f}s"
                    raise fail(attempt + 1, reason, at_deadline=False) from None
                delay = self._backoff(attempt, failure.retry_after)
                if deadline is not None:
                    now = time.monotonic()
                    timed_out_at_deadline = capped and failure.reason == "timeout"
                    no_time_to_retry = attempt < attempts - 1 and now + delay >= deadline
                    if now >= deadline or timed_out_at_deadline or no_time_to_retry:
                        raise fail(attempt + 1, reason, at_deadline=True) from None
                if attempt == attempts - 1:
                    raise fail(attempt + 1, reason, at_deadline=False) from None
                logger.warning(
                    "LLM %s/%s %s; retry %d/%d in %.1fs",
                    cfg.provider,
                    role,
                    reason,
                    attempt + 1,
                    attempts - 1,
                    delay,
                )
                time.sleep(delay)
                continue
            return _result_from_message(message, time.perf_counter() - start, attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after + random.uniform(0, 0.1 * self.backoff_base_s)
        delay = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        return delay + random.uniform(0, delay / 2)

    def _finish(
        self,
        result: LLMResult,
        cfg: ResolvedLLM,
        role: str,
        schema: type[BaseModel] | None,
        json_mode: str | None,
        in_chars: int,
    ) -> None:
        if schema is not None:
            if result.finish_reason == "length" and not result.text.strip():
                result.parse_error = "reply cut off at max_tokens before any output"
            else:
                try:
                    result.parsed = parse_json_reply(result.text, schema)
                except JSONReplyError as exc:
                    result.parse_error = str(exc)
                    if result.finish_reason == "length":
                        result.parse_error += " (reply cut off at max_tokens)"
            if result.parse_error:
                logger.info("LLM %s/%s parse failure: %s", cfg.provider, role, result.parse_error)
                logger.debug("LLM %s/%s unparsed reply: %r", cfg.provider, role, result.text)
        if result.empty:
            logger.warning(
                "LLM %s/%s returned an empty reply (finish_reason=%s)",
                cfg.provider,
                role,
                result.finish_reason,
            )
        record = CallRecord(
            role=role,
            provider=cfg.provider,
            model=cfg.model,
            latency_s=round(result.latency_s, 4),
            in_chars=in_chars,
            out_chars=len(result.text),
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            cached_prompt_tokens=result.cached_prompt_tokens,
            cached=result.cached,
            retries=result.retries,
            schema=schema.__name__ if schema is not None else None,
            json_mode=json_mode,
            parse_failed=result.parse_error is not None,
            empty=result.empty,
        )
        with self._lock:
            self._records.append(record)

    def _record_failure(
        self,
        cfg: ResolvedLLM,
        role: str,
        schema: type[BaseModel] | None,
        json_mode: str | None,
        in_chars: int,
        start: float,
        attempt: int,
        reason: str,
    ) -> None:
        record = CallRecord(
            role=role,
            provider=cfg.provider,
            model=cfg.model,
            latency_s=round(time.perf_counter() - start, 4),
            in_chars=in_chars,
            out_chars=0,
            retries=attempt,
            schema=schema.__name__ if schema is not None else None,
            json_mode=json_mode,
            error=reason,
        )
        with self._lock:
            self._records.append(record)


def _is_openai_model(llm: Any) -> bool:
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:  # pragma: no cover
        return False
    return isinstance(llm, ChatOpenAI)


def _add_instruction(msgs: list[Any], suffix: str, *, prefer_system: bool) -> list[Any]:
    """Append ``suffix`` to the last system message (if preferred and present), else to the last
    human message."""
    from langchain_core.messages import HumanMessage, SystemMessage

    out = list(msgs)
    for i in range(len(out) - 1, -1, -1):
        if prefer_system and isinstance(out[i], SystemMessage):
            out[i] = SystemMessage(content=_content_text(out[i].content) + suffix)
            return out
    for i in range(len(out) - 1, -1, -1):
        if isinstance(out[i], HumanMessage):
            out[i] = HumanMessage(content=_content_text(out[i].content) + suffix)
            return out
    out.append(HumanMessage(content=suffix.strip()))
    return out


def _result_from_message(message: Any, latency_s: float, retries: int) -> LLMResult:
    text = _content_text(getattr(message, "content", message))
    usage = getattr(message, "usage_metadata", None) or {}
    details = usage.get("input_token_details") or {}
    meta = getattr(message, "response_metadata", None) or {}
    return LLMResult(
        text=text,
        latency_s=latency_s,
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
        cached_prompt_tokens=details.get("cache_read"),
        retries=retries,
        finish_reason=meta.get("finish_reason"),
    )


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def provider_rows(settings: Settings) -> list[dict]:
    """The registry as rows for display: limits and whether the key is set (never the key)."""
    rows = []
    for p in PROVIDERS.values():
        key = "set" if p.api_key(settings) else "missing"
        if not p.key_required:
            key = "not needed"
        rows.append(
            {
                "name": p.name,
                "model": p.model or "(LLM_MODEL)",
                "base_url": redact_url(p.base_url) or "(embedded, loopback)",
                "api_key_env": p.api_key_env,
                "api_key_env_aliases": list(p.api_key_env_aliases),
                "aliases": sorted(a for a, target in PROVIDER_ALIASES.items() if target == p.name),
                "key": key,
                "requests_per_minute": p.requests_per_minute,
                "requests_per_day": p.requests_per_day,
                "tokens_per_day": p.tokens_per_day,
                "json_schema": p.supports_json_schema,
                "system_messages": p.supports_system_messages,
                "notes": p.notes,
            }
        )
    return rows


def _selection(settings: Settings) -> dict:
    out = {}
    for label, role in (("main", None), ("fast", "classify")):
        try:
            cfg = resolve(role, settings)
            out[label] = {
                "provider": cfg.provider,
                "model": cfg.model,
                "base_url": cfg.display_url,
                "timeout_s": call_timeout(cfg, settings),
            }
        except LLMConfigError as exc:
            out[label] = {"error": str(exc)}
    return out


def _fmt_limit(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def main(argv: Sequence[str] | None = None) -> int:

    parser = argparse.ArgumentParser(
        description="List the LLM providers (limits, whether each key is set) and the selection."
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--ping",
        action="store_true",
        help="send one short request through the selected provider and report the latency",
    )
    args = parser.parse_args(argv)
    load_dotenv_file()
    settings = Settings.from_env()
    set_settings(settings)
    rows = provider_rows(settings)
    selection = _selection(settings)
    ping = None
    if args.ping:
        client = LLMClient(settings.replace(llm_cache=False))
        try:
            res = client.invoke(
                [("user", "Reply with the single word: ready")], role="ping", max_tokens=8
            )
            ping = {"ok": True, "reply": res.text.strip(), "latency_s": round(res.latency_s, 2)}
        except (LLMCallError, LLMConfigError) as exc:
            ping = {"ok": False, "error": str(exc)}
    if args.json:
        out = {"providers": rows, "aliases": PROVIDER_ALIASES, "selected": selection, "ping": ping}
        print(json.dumps(out, indent=2))
        return 0 if ping is None or ping["ok"] else 1

    headers = ["name", "model", "key", "req/min", "req/day", "tokens/day", "schema", "notes"]
    table = [
        [
            r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else ""),
            r["model"],
            f"{'/'.join([r['api_key_env'], *r['api_key_env_aliases']])}: {r['key']}"
            if r["api_key_env"]
            else r["key"],
            _fmt_limit(r["requests_per_minute"]),
            _fmt_limit(r["requests_per_day"]),
            _fmt_limit(r["tokens_per_day"]),
            "yes" if r["json_schema"] else "no",
            r["notes"],
        ]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *table, strict=False)]
    widths[-1] = 0
    for line in [headers, *table]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip())
    print()
    aliases = ", ".join(f"{alias} = {target}" for alias, target in PROVIDER_ALIASES.items())
    print(f"aliases (the original project's names, accepted in LLM_PROVIDER): {aliases}")
    for label, sel in selection.items():
        if "error" in sel:
            print(f"{label}: {sel['error']}")
        else:
            print(f"{label}: {sel['provider']} / {sel['model']} @ {sel['base_url'] or 'embedded'}")
    if ping is not None:
        print(f"ping: {ping}")
        return 0 if ping["ok"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
