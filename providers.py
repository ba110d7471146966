"""The provider side of the LLM layer: the registry of OpenAI-compatible endpoints
(``PROVIDERS``), which one each role talks to (:func:`resolve`), its chat model, rate limiter and
deadline (:class:`Attempts`), what a failed call says (:func:`failure_reason`), and URLs without
credentials (:func:`redact_url`).  :mod:`llm_config` makes the calls; this module sends none."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.rate_limiters import InMemoryRateLimiter

import local_llm
from settings import LLMConfigError, Settings


class MalformedResponseError(httpx2.DecodingError):
    """A 200 response that is not a chat completion (a proxy's HTML page, an error object, no
    choices); a transport error to the OpenAI SDK, which retries it."""


class DeadlineReached(RuntimeError):
    """The run deadline stops a call between the SDK's attempts (the SDK does not catch it)."""


_SECRET_PARAM = re.compile(r"key|token|secret|password|passwd|pwd|sig|auth|credential", re.I)
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>()]+")
REDACTED = "***"


def _redact_params(part: str) -> str:
    """``a=1&api_key=s`` -> ``a=1&api_key=***`` (names kept, secret values hidden, order kept)."""
    pairs = [pair.partition("=") for pair in part.split("&")]
    return "&".join(
        f"{name}={REDACTED}" if eq and _SECRET_PARAM.search(urllib.parse.unquote_plus(name))
        else name + eq + value
        for name, eq, value in pairs
    )  # fmt: skip


def redact_url(url: str | None) -> str | None:
    """``url`` with ``***`` for its user:password and for the values of query or fragment
    parameters whose names look secret (``key``, ``token``, ``sig`` ...); host, port and path kept.
    Apply it wherever a URL is recorded."""
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
        netloc = f"{REDACTED}@{f'[{host}]' if ':' in host else host}{port}"
    query, fragment = _redact_params(parts.query), _redact_params(parts.fragment)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact_urls_in_text(text: str) -> str:
    """Every URL inside ``text`` passed through :func:`redact_url` (log lines, error messages)."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)) or "", text)


def _redact_record(record: logging.LogRecord) -> bool:
    """A handler filter that strips credentials from URLs in a log line (httpx logs them)."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a broken log call is not ours to fix here
        return True
    clean = redact_urls_in_text(message)
    if clean != message:
        record.msg, record.args = clean, None
    return True


def install_log_redaction() -> None:
    """Add :func:`_redact_record` to each root handler, once (a CLI, after ``basicConfig``)."""
    for handler in logging.getLogger().handlers:
        if _redact_record not in handler.filters:
            handler.addFilter(_redact_record)


@dataclass(frozen=True)
class Provider:
    """An OpenAI-compatible endpoint.  Limits: the published free tier, a guide (None = none
    fixed).  ``local``: served in-process by local_llm.  ``api_key_env_aliases``: read when
    ``api_key_env`` is unset (GOOGLE_API_KEY)."""

    name: str
    base_url: str | None
    model: str
    api_key_env: str | None
    requests_per_day: int | None = None
    tokens_per_day: int | None = None
    requests_per_minute: int | None = None
    supports_system_messages: bool = True
    supports_json_schema: bool = False
    local: bool = False
    notes: str = ""
    api_key_env_aliases: tuple[str, ...] = ()

    def api_key(self, settings: Settings) -> str | None:
        values = (settings.secret(var) for var in (self.api_key_env, *self.api_key_env_aliases))
        return next((v for v in values if v), None)


_GOOGLE = "https://generativelanguage.googleapis.com/v1beta/openai/"
_GROQ = "https://api.groq.com/openai/v1"
_OPENROUTER = "https://openrouter.ai/api/v1"
_OPENROUTER_FREE = "OpenRouter free model; shares the free daily request budget"

PROVIDERS: dict[str, Provider] = {p.name: p for p in [
    Provider("local", None, "qwen2.5-coder-1.5b-instruct", None, supports_json_schema=True, local=True,
             notes="default; embedded Qwen2.5-Coder-1.5B Q4_K_M via xllamacpp, offline ('local' extra)"),
    Provider("local-small", None, "qwen2.5-coder-0.5b-instruct", None, supports_json_schema=True, local=True,
             notes="embedded Qwen2.5-Coder-0.5B Q4_K_M, faster, weaker ('local-small' extra)"),
    Provider("google-gemma", _GOOGLE, "gemma-3-27b-it", "GEMINI_API_KEY", 14_400, None, 30, False,
             api_key_env_aliases=("GOOGLE_API_KEY",), notes="Google AI Studio free tier (30 req/min, 15k tokens/min); system prompt folded into the user turn"),
    Provider("google-gemini-flash", _GOOGLE, "gemini-2.5-flash", "GEMINI_API_KEY", 250, None, 10, supports_json_schema=True,
             api_key_env_aliases=("GOOGLE_API_KEY",), notes="Google AI Studio free tier (10 req/min)"),
    Provider("groq", _GROQ, "llama-3.3-70b-versatile", "GROQ_API_KEY", 1_000, 100_000, 30,
             notes="Groq free tier (30 req/min, 12k tokens/min)"),
    Provider("groq-small", _GROQ, "llama-3.1-8b-instant", "GROQ_API_KEY", 14_400, 500_000, 30,
             notes="Groq free tier; cheap calls (LLM_PROVIDER_FAST)"),
    Provider("openrouter-llama-free", _OPENROUTER, "meta-llama/llama-3.3-70b-instruct:free", "OPENROUTER_API_KEY", 50, None, 20,
             notes="OpenRouter free model (20 req/min; 1000 req/day after buying $10 credit)"),
    Provider("openrouter-deepseek-free", _OPENROUTER, "deepseek/deepseek-chat-v3-0324:free", "OPENROUTER_API_KEY", 50, None, 20,
             notes=_OPENROUTER_FREE),
    Provider("openrouter-gemma-free", _OPENROUTER, "google/gemma-3-27b-it:free", "OPENROUTER_API_KEY", 50, None, 20, False,
             notes=_OPENROUTER_FREE),
    Provider("openrouter-qwen-free", _OPENROUTER, "qwen/qwen-2.5-72b-instruct:free", "OPENROUTER_API_KEY", 50, None, 20,
             notes=_OPENROUTER_FREE),
    Provider("openrouter-paid", _OPENROUTER, "openai/gpt-4o-mini", "OPENROUTER_API_KEY", supports_json_schema=True,
             notes="OpenRouter paid model (pay per token); any OpenRouter model id via LLM_MODEL"),
    Provider("cerebras", "https://api.cerebras.ai/v1", "llama-3.3-70b", "CEREBRAS_API_KEY", 14_400, 1_000_000, 30,
             notes="Cerebras free tier (30 req/min, 60k tokens/min)"),
    Provider("ollama", "http://localhost:11434/v1", "qwen2.5:7b-instruct", None, supports_json_schema=True,
             notes="local Ollama server; `ollama pull` the model first; LLM_MODEL picks another"),
    Provider("deepseek", "https://api.deepseek.com/v1", "deepseek-chat", "DEEPSEEK_API_KEY",
             notes="paid, no fixed daily limit"),
    Provider("openai", "https://api.openai.com/v1", "gpt-4o-mini", "OPENAI_API_KEY", supports_json_schema=True,
             notes="paid; limits depend on the account tier"),
    Provider("together", "https://api.together.xyz/v1", "meta-llama/Llama-3.3-70B-Instruct-Turbo", "TOGETHER_API_KEY",
             notes="paid; per-minute limits by account tier"),
    Provider("mistral", "https://api.mistral.ai/v1", "mistral-small-latest", "MISTRAL_API_KEY", requests_per_minute=60,
             notes="free 'Experiment' plan: 1 req/s, 500k tokens/min, 1B tokens/month"),
    Provider("vllm", "http://localhost:8000/v1", "", None, supports_json_schema=True,
             notes="your vLLM server; set LLM_MODEL (and LLM_BASE_URL if not localhost:8000)"),
    Provider("llamacpp-server", "http://localhost:8080/v1", "local-model", None, supports_json_schema=True,
             notes="a separate llama.cpp llama-server; LLM_BASE_URL if not localhost:8080"),
]}  # fmt: skip

PROVIDER_ALIASES: dict[str, str] = {
    "gemma": "google-gemma",
    "groq-llama70b": "groq",
    "or-llama70b": "openrouter-llama-free",
}
"""The original project's provider names, so that its ``.env`` works unchanged."""


FAST_ROLES = frozenset({"classify", "rewrite", "injection"})
"""Roles that use LLM_PROVIDER_FAST / LLM_MODEL_FAST when set (cheap, short calls); the ``judge``
role (the answer grader of the eval) uses JUDGE_PROVIDER / JUDGE_MODEL when set."""


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
        return redact_url(self.base_url)

    def redact(self, text: str) -> str:
        """``text`` (an error message) without this endpoint's key or URL credentials."""
        if self.api_key and len(self.api_key) >= 4:
            text = text.replace(self.api_key, REDACTED)
        if self.base_url and self.display_url != self.base_url:
            text = text.replace(self.base_url, self.display_url or "")
        return redact_urls_in_text(text)


LOCAL_TIMEOUT_S = 300.0
"""Default seconds per call on this machine: the 1.5B model on 2 cores needs up to ~60 s."""
REMOTE_TIMEOUT_S = 60.0
"""Default seconds per call for remote APIs: 60 s without a byte means the endpoint hangs."""


def call_timeout(cfg: ResolvedLLM, settings: Settings) -> float:
    """Seconds one attempt may take: LLM_TIMEOUT when set (> 0), else :data:`LOCAL_TIMEOUT_S` for
    the embedded model and servers on loopback (slow CPU inference), :data:`REMOTE_TIMEOUT_S`."""
    if settings.llm.timeout > 0:
        return float(settings.llm.timeout)
    return LOCAL_TIMEOUT_S if cfg.local or _loopback(cfg.base_url) else REMOTE_TIMEOUT_S


def _loopback(url: str | None) -> tuple[str, int] | None:
    """(host, port) of a URL on this machine (a server the user runs: Ollama, vLLM); else None."""
    try:
        parts = urllib.parse.urlsplit(url or "")
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None
    here = host in {"localhost", "::1", "0.0.0.0"} or host.startswith("127.")
    if not (here or host.endswith(".localhost")):
        return None
    return host, port or (443 if parts.scheme == "https" else 80)


def resolve(role: str | None, settings: Settings) -> ResolvedLLM:
    """Which provider, URL, model and key ``role`` uses; raises LLMConfigError when unusable.
    LLM_BASE_URL, LLM_API_KEY and LLM_MODEL belong to the main provider: a fast or judge provider
    takes its own registry URL and key."""
    llm, fast, judge = settings.llm, role in FAST_ROLES, role == "judge"
    given, var = llm.provider, "LLM_PROVIDER"
    if judge and llm.judge_provider:
        given, var = llm.judge_provider, "JUDGE_PROVIDER"
    elif fast and llm.provider_fast:
        given, var = llm.provider_fast, "LLM_PROVIDER_FAST"
    main = var == "LLM_PROVIDER"  # the raw overrides belong to the main provider
    key = given.strip().lower()
    provider = PROVIDERS.get(PROVIDER_ALIASES.get(key, key))
    if provider is None:
        raise LLMConfigError(
            f"{var}={given!r} is not a known provider; choose one of: {', '.join(PROVIDERS)} "
            f"or the aliases {', '.join(PROVIDER_ALIASES)} (python llm_config.py lists them)"
        )
    base_url = (main and llm.base_url) or provider.base_url
    model = (fast and llm.model_fast) or (judge and llm.judge_model) or (main and llm.model)
    model = model or provider.model
    api_key = (main and llm.api_key) or provider.api_key(settings)
    local = provider.local and not (main and llm.base_url)
    # LLM_BASE_URL and LLM_MODEL alone on an embedded provider: the user's own server
    name = "openai-compatible" if provider.local and not local else provider.name
    schema = {"schema": True, "prompt": False}.get(llm.json_mode, provider.supports_json_schema)
    if provider.api_key_env and not api_key:
        aliases = ", ".join(provider.api_key_env_aliases)
        raise LLMConfigError(
            f"{var}={given} needs an API key: set {provider.api_key_env}"
            f"{f' (or {aliases})' if aliases else ''}{' or LLM_API_KEY' if main else ''} in the "
            "environment or .env"
        )
    if not model:  # LLM_MODEL, LLM_MODEL_FAST or JUDGE_MODEL
        raise LLMConfigError(
            f"{var}={name} has no default model: set {var.replace('PROVIDER', 'MODEL')}"
        )
    return ResolvedLLM(
        provider=name,
        base_url=base_url,
        model=model,
        supports_system_messages=provider.supports_system_messages,
        supports_json_schema=schema,
        local=local,
        api_key=api_key,
        requests_per_minute=llm.requests_per_minute or provider.requests_per_minute,
    )


def check_config(settings: Settings, roles: tuple[str | None, ...] = (None, "classify")) -> None:
    """Raise LLMConfigError when a role cannot be configured (unknown provider, missing API key or
    model, embedded model not installed); starts nothing, sends no request."""
    for role in roles:  # default: the main provider, and the fast one for the cheap roles
        cfg = resolve(role, settings)
        if cfg.local:
            local_llm.check_installed(cfg.provider)


def check_reachable(settings: Settings, roles: tuple[str | None, ...] = (None, "classify")) -> None:
    """Raise LLMConfigError when a role's server runs on this machine (a loopback URL) and nothing
    listens there: a user who has not started Ollama learns it at once, not after each call's
    retries (two calls of five attempts: 14 s).  A remote endpoint is not contacted."""
    import socket

    seen = set()
    for role in roles:
        cfg = resolve(role, settings)
        if cfg.local or (at := _loopback(cfg.base_url)) is None or at in seen:
            continue
        seen.add(at)
        try:
            socket.create_connection(at, timeout=2).close()
        except ConnectionRefusedError:
            fast = role in FAST_ROLES and settings.llm.provider_fast
            var = "LLM_PROVIDER_FAST" if fast else "LLM_PROVIDER"
            raise LLMConfigError(
                f"{var}={cfg.provider}: nothing answers at {cfg.display_url} (connection "
                "refused): start its server (Ollama: `ollama serve`) or choose another provider"
            ) from None
        except OSError:  # another failure (a firewall, a slow start): the calls will say
            continue


_models: dict[tuple, Any] = {}
_limiters: dict[tuple, Any] = {}
_models_lock = threading.Lock()


def rate_limiter(cfg: ResolvedLLM) -> Any:
    """The process-wide ``InMemoryRateLimiter`` of an endpoint, shared by concurrent eval workers
    (None without a limit); the bucket starts full."""
    if not cfg.requests_per_minute or cfg.requests_per_minute <= 0:
        return None
    key = (cfg.provider, cfg.base_url, cfg.model, cfg.requests_per_minute)
    with _models_lock:
        if key not in _limiters:
            rps = cfg.requests_per_minute / 60
            limiter = InMemoryRateLimiter(requests_per_second=rps, check_every_n_seconds=0.05)
            limiter.available_tokens = 1.0
            _limiters[key] = limiter
        return _limiters[key]


def fold_system_messages(messages: Sequence[Any]) -> list[Any]:
    """System messages merged into the first human one (Gemma on Google AI Studio rejects them)."""
    preamble = "\n\n".join(m.text for m in messages if isinstance(m, SystemMessage))
    rest = [m for m in messages if not isinstance(m, SystemMessage)]
    if not preamble:
        return list(messages)
    for i, m in enumerate(rest):
        if isinstance(m, HumanMessage):
            rest[i] = HumanMessage(content=f"{preamble}\n\n{m.text}")
            return rest
    return [HumanMessage(content=preamble), *rest]


def _check_completion(response: Any) -> None:
    """Raise MalformedResponseError unless a 200 reply is a chat completion whose first choice has
    a message (else LangChain fails with an AttributeError)."""
    response.read()
    try:
        data = json.loads(response.content)
    except ValueError as exc:
        if "json" in response.headers.get("content-type", ""):
            message = f"the 200 response body is not valid JSON ({getattr(exc, 'msg', exc)})"
        else:
            message = f"the 200 response is not a chat completion: {' '.join(response.text.split())[:80]!r}"
        raise MalformedResponseError(message) from None
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise MalformedResponseError(f"the 200 response is not a chat completion ({kind})")
    if data.get("error"):
        detail = " ".join(str(data["error"]).split())[:120]
        raise MalformedResponseError(f"the 200 response is an error object: {detail}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponseError("the 200 response has no choices")
    if not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
        raise MalformedResponseError("the 200 response's first choice has no message")


def _acquire(limiter: Any, deadline: float | None) -> bool:
    """Take a slot of ``limiter``, or return False at once when the next slot comes only after
    ``deadline`` (the limiter's own blocking ``acquire`` knows no deadline)."""
    while not limiter.acquire(blocking=False):
        tokens_missing = 1.0 - limiter.available_tokens
        ready = (limiter.last or time.monotonic()) + tokens_missing / limiter.requests_per_second
        if deadline is not None and ready >= deadline:
            return False
        time.sleep(limiter.check_every_n_seconds)
    return True


@dataclass
class Attempts:
    """The HTTP attempts of one call, which the OpenAI SDK makes and retries (its backoff, the
    provider's Retry-After): counted, a slot of ``limiter`` each, none started after ``deadline``
    or lasting past it, none waited for across it.  ``client``: the SDK client."""

    deadline: float | None = None
    limiter: Any = None
    client: Any = None
    count: int = 0


CALL: contextvars.ContextVar[Attempts | None] = contextvars.ContextVar("llm_call", default=None)
"""The :class:`Attempts` of the call this thread makes (set by ``LLMClient``)."""


def _before_attempt(request: Any) -> None:
    """An httpx request hook: the rate-limit slot and the deadline of the current call."""
    if (call := CALL.get()) is None:
        return
    if call.limiter is not None and not _acquire(call.limiter, call.deadline):
        raise DeadlineReached("no rate-limit slot before the deadline")
    if call.deadline is not None:
        left = call.deadline - time.monotonic()
        if left <= 0:
            raise DeadlineReached(f"the deadline passed before attempt {call.count + 1}")
        timeout = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {k: min(v or left, left) for k, v in timeout.items()}
    call.count += 1


def _after_attempt(response: Any) -> None:
    """An httpx response hook: a 200 that is no chat completion is an error the SDK retries; a
    retry the SDK would wait for past the deadline (Retry-After, as the SDK reads it) stops."""
    call = CALL.get()
    if response.status_code == 200:
        _check_completion(response)
    elif call and call.deadline is not None and call.client._should_retry(response):  # noqa: SLF001
        wait = call.client._parse_retry_after_header(response.headers) or 0.0  # noqa: SLF001
        if time.monotonic() + wait >= call.deadline:
            raise DeadlineReached(
                f"HTTP {response.status_code}, the provider asks to wait {wait:.0f}s"
            )


def failure_reason(exc: BaseException) -> str:
    """What a failed call says, once the SDK has made its attempts: timeout, connection refused or
    lost, malformed 200, rate limited (with the wait a 429 asks for), server error or the status
    and the provider's message."""
    import openai

    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "connection refused (is the server running?)"
    if malformed := [e for e in chain if isinstance(e, MalformedResponseError)]:
        return f"malformed response ({malformed[0]})"
    for e in chain:
        if isinstance(e, openai.APITimeoutError | TimeoutError):
            return "timeout (LLM_TIMEOUT: seconds per attempt)"
        if isinstance(e, openai.APIConnectionError | ConnectionError):
            return f"connection error ({e.__class__.__name__})"
        if isinstance(e, openai.APIStatusError):
            status, asked = e.status_code, e.response.headers.get("retry-after")
            if status == 429:  # the SDK waits at most 2 minutes: longer is a used-up quota
                return f"rate limited (HTTP 429{f', asks to wait {asked}s' if asked else ''})"
            if status >= 500 or status == 408:
                return f"server error (HTTP {status})"
            said = re.sub(r"^Error code: \d+ - ", "", str(e.message))  # the SDK's own prefix
            return f"HTTP {status}: {said}"
    return f"{chain[0].__class__.__name__}: {chain[0]}"


def chat_model(cfg: ResolvedLLM, settings: Settings) -> Any:
    """The cached chat model of an endpoint (starts the embedded model when local); the OpenAI SDK
    retries LLM_MAX_RETRIES times, within the deadline of :data:`CALL`.  ``BaseChatOpenAI`` sends
    the classic ``max_tokens`` every OpenAI-compatible server understands; ``ChatOpenAI`` (OpenAI
    itself) sends ``max_completion_tokens``."""
    import openai
    from langchain_openai import ChatOpenAI
    from langchain_openai.chat_models.base import BaseChatOpenAI

    base_url, model = cfg.base_url, cfg.model
    if cfg.local:
        server = local_llm.get_local_server(cfg.provider, settings)
        base_url, model = server.base_url, server.model
    timeout, retries = call_timeout(cfg, settings), settings.llm.max_retries
    key = (cfg.provider, base_url, model, cfg.api_key, settings.llm.temperature, timeout, retries)
    with _models_lock:
        if key not in _models:
            cls = ChatOpenAI if cfg.provider == "openai" else BaseChatOpenAI
            _models[key] = cls(
                model=model,
                base_url=base_url,
                api_key=cfg.api_key or "sk-no-key-required",  # the SDK insists on a key
                temperature=settings.llm.temperature,
                timeout=timeout,
                max_retries=retries,
                http_client=openai.DefaultHttpxClient(
                    event_hooks={"request": [_before_attempt], "response": [_after_attempt]}
                ),
            )
        return _models[key]


def listing(settings: Settings) -> dict:
    """What ``python llm_config.py --json`` prints: the registry (whether each key is set, never
    the key), the aliases and the endpoints of the main and fast roles."""
    rows = [
        {
            "name": p.name,
            "model": p.model or "(LLM_MODEL)",
            "base_url": redact_url(p.base_url) or "(embedded, loopback)",
            "api_key_env": p.api_key_env,
            "api_key_env_aliases": list(p.api_key_env_aliases),
            "aliases": sorted(a for a, target in PROVIDER_ALIASES.items() if target == p.name),
            "key": ("set" if p.api_key(settings) else "missing") if p.api_key_env else "not needed",
            "requests_per_minute": p.requests_per_minute,
            "requests_per_day": p.requests_per_day,
            "tokens_per_day": p.tokens_per_day,
            "json_schema": p.supports_json_schema,
            "system_messages": p.supports_system_messages,
            "notes": p.notes,
        }
        for p in PROVIDERS.values()
    ]
    selected = {}
    for label, role in (("main", None), ("fast", "classify")):
        try:
            cfg = resolve(role, settings)
            selected[label] = {
                "provider": cfg.provider,
                "model": cfg.model,
                "base_url": cfg.display_url,
                "timeout_s": call_timeout(cfg, settings),
            }
        except LLMConfigError as exc:
            selected[label] = {"error": str(exc)}
    return {"providers": rows, "aliases": PROVIDER_ALIASES, "selected": selected}


def format_listing(listing: dict) -> str:
    limits = ("requests_per_minute", "requests_per_day", "tokens_per_day")
    headers = ["name", "model", "key", "req/min", "req/day", "tokens/day", "schema", "notes"]
    table = [
        [
            r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else ""),
            r["model"],
            f"{'/'.join([r['api_key_env'], *r['api_key_env_aliases']])}: {r['key']}"
            if r["api_key_env"]
            else r["key"],
            *("-" if r[k] is None else f"{r[k]:,}" for k in limits),
            "yes" if r["json_schema"] else "no",
            r["notes"],
        ]
        for r in listing["providers"]
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *table, strict=False)]
    widths[-1] = 0
    lines = [
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
        for line in [headers, *table]
    ]
    aliases = ", ".join(f"{alias} = {target}" for alias, target in listing["aliases"].items())
    lines.append(f"\naliases (the original project's names, accepted in LLM_PROVIDER): {aliases}")
    for label, sel in listing["selected"].items():
        where = f"{sel.get('provider')} / {sel.get('model')} @ {sel.get('base_url') or 'embedded'}"
        lines.append(f"{label}: {sel.get('error', where)}")
    return "\n".join(lines)
