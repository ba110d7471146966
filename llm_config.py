"""Every LLM call of the agent and the eval scripts goes through :class:`LLMClient`;
:mod:`providers` says which endpoint a role talks to and builds its chat model.  API keys never
reach the cache, logs or records.  ``python llm_config.py`` lists the providers and selection."""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from langchain_core.messages import HumanMessage, SystemMessage, convert_to_messages
from langchain_core.outputs import ChatGeneration
from langchain_core.utils.json import parse_partial_json
from pydantic import BaseModel, ValidationError

import local_llm
import providers
from llm_cache import ResponseCache
from settings import Settings, SettingsError, load_dotenv_file, run_script

logger = logging.getLogger(__name__)

T = TypeVar("T", bound=BaseModel)


class LLMCallError(RuntimeError):
    """A call failed after all retries (rate limit, timeout, connection, server error, bad request);
    ``reason`` is the short cause its call record keeps."""

    def __init__(
        self, message: str, *, role: str, provider: str, attempts: int = 0, reason: str = ""
    ) -> None:
        super().__init__(message)
        self.role, self.provider, self.attempts, self.reason = role, provider, attempts, reason


class LLMDeadlineError(LLMCallError):
    """The run deadline passed before a call could finish."""


class JSONReplyError(ValueError):
    """A reply holds no JSON object that validates against the schema."""


_JSON_WORDS = re.compile(r"\b(true|false|null)\b")
_PYTHON_WORDS = {"true": "True", "false": "False", "null": "None"}


def json_objects(text: str, *, cut_off: bool = False) -> Iterator[dict[str, Any]]:
    """Every top-level ``{...}`` object of a model reply that parses, in order, skipping the prose
    around them; trailing commas and Python-style quoting (small models' slips) are read as a
    Python literal.  With ``cut_off``, an object the reply ends inside is completed and yielded."""
    depth = start = 0
    quote, escaped = "", False
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and not escaped:
                quote = ""
            escaped = ch == "\\" and not escaped
        elif ch in "\"'" and depth:
            quote = ch
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                span = text[start : i + 1]
                try:
                    data = json.loads(span)
                except ValueError:
                    try:
                        data = ast.literal_eval(
                            _JSON_WORDS.sub(lambda m: _PYTHON_WORDS[m[1]], span)
                        )
                    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                        continue
                if isinstance(data, dict):
                    yield data
    if cut_off and depth:
        with contextlib.suppress(ValueError):
            if isinstance(data := parse_partial_json(text[start:]), dict):
                yield data


def parse_json_reply(text: str, schema: type[T]) -> T:
    """The first of :func:`json_objects` that validates against ``schema``, else JSONReplyError."""
    if not text or not text.strip():
        raise JSONReplyError("empty reply")
    last_error: ValidationError | None = None
    for data in json_objects(text):
        try:
            return schema.model_validate(data)
        except ValidationError as exc:
            last_error = exc
    if last_error is not None:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
            for e in last_error.errors()[:3]
        )
        raise JSONReplyError(f"JSON does not match {schema.__name__}: {errors}")
    snippet = text.strip().replace("\n", " ")[:80]
    raise JSONReplyError(f"no JSON object found in reply: {snippet!r}")


@dataclass
class LLMResult:
    text: str
    parsed: Any = None
    parse_error: str | None = None
    cached: bool = False
    latency_s: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_prompt_tokens: int | None = None  # served from the provider's prompt cache
    retries: int = 0
    finish_reason: str | None = None

    @property
    def empty(self) -> bool:
        """The model returned no text: a failed call, never cached."""
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
    json_mode: str | None = None  # "schema" (the provider's JSON-schema mode), "prompt" or None
    parse_failed: bool = False
    empty: bool = False
    error: str | None = None


def _ask_for_json(msgs: list[Any], schema: type[BaseModel], *, in_system: bool) -> list[Any]:
    """``msgs`` with the schema instruction ending the last system (``in_system``) or human one."""
    compact = json.dumps(schema.model_json_schema(), separators=(",", ":"))
    suffix = (
        "\n\nReply with only one JSON object (no prose, no code fence) that matches this JSON "
        f"schema:\n{compact}"
    )
    out = list(msgs)
    for kind in (SystemMessage, HumanMessage) if in_system else (HumanMessage,):
        for i in reversed(range(len(out))):
            if isinstance(out[i], kind):
                out[i] = type(out[i])(content=out[i].text + suffix)
                return out
    return [*out, HumanMessage(content=suffix.strip())]


class LLMClient:
    """The call helper every node and eval script uses, on LangChain's structured output, rate
    limiter and cache interface and the SDK's retries; it adds the run deadline, lenient JSON
    replies and per-call records.  ``llm_factory(role) -> BaseChatModel`` replaces
    ``providers.chat_model``."""

    def __init__(self, settings: Settings, llm_factory: Callable[[str], Any] | None = None) -> None:
        self.settings = settings
        self._factory = llm_factory
        self.deadline: float | None = None  # time.monotonic(); AgentContext.start_run sets it
        self._records: list[CallRecord] = []  # appended by concurrent eval workers (atomic)
        self._cache = ResponseCache(settings.llm.cache_path) if settings.llm.cache else None

    @property
    def records(self) -> list[CallRecord]:
        return list(self._records)

    def summary(self, since: int = 0) -> dict:
        """Usage totals of the records from ``since`` on (a run's ``record_offset``) and by_role."""
        records = self.records[since:]

        def totals(rs: Sequence[CallRecord]) -> dict[str, Any]:
            return {
                "llm_calls": len(rs),
                "provider_calls": sum(not r.cached for r in rs),
                "cached_calls": sum(r.cached for r in rs),
                "llm_errors": sum(r.error is not None for r in rs),
                "retries": sum(r.retries for r in rs),
                "parse_failures": sum(r.parse_failed for r in rs),
                "empty_replies": sum(r.empty for r in rs),
                "input_tokens": sum(r.input_tokens or 0 for r in rs),
                "output_tokens": sum(r.output_tokens or 0 for r in rs),
                "cached_prompt_tokens": sum(r.cached_prompt_tokens or 0 for r in rs),
                "in_chars": sum(r.in_chars for r in rs),
                "out_chars": sum(r.out_chars for r in rs),
                "llm_seconds": round(sum(r.latency_s for r in rs), 3),
            }

        roles = dict.fromkeys(r.role for r in records)
        by_role = {role: totals([r for r in records if r.role == role]) for role in roles}
        return {**totals(records), "by_role": by_role}

    def is_local(self, role: str) -> bool:
        """True when ``role`` talks to the embedded local model (short reply budgets)."""
        return providers.resolve(role, self.settings).local

    def invoke(
        self,
        messages: Sequence[Any],
        *,
        role: str,
        schema: type[BaseModel] | None = None,
        max_tokens: int | None = None,
        json_mode: Literal["schema", "prompt"] | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> LLMResult:
        """Send ``messages`` (LangChain messages or (role, content) tuples) for ``role``.  With
        ``schema``, ``.parsed`` is the reply parsed into it, or None with ``.parse_error`` saying
        why.  ``json_mode`` forces "schema" (provider JSON-schema mode) or "prompt"; None picks
        schema mode where the provider supports it.  ``accept``: whether a reply is usable (else
        it is not cached); by default one that parsed, or any text without a schema.  Raises
        LLMCallError when the call still fails after LLM_MAX_RETRIES (a 429 asking to wait over 2
        minutes, at once), LLMConfigError at once, LLMDeadlineError once ``self.deadline`` passes
        (no attempt starts or lasts past it)."""
        cfg = providers.resolve(role, self.settings)
        deadline = self.deadline
        if deadline is not None and time.monotonic() >= deadline:
            raise LLMDeadlineError(
                f"LLM call for role {role!r} not started: the run deadline has passed "
                "(RUN_TIMEOUT / --deadline)",
                role=role,
                provider=cfg.provider,
            )
        msgs = convert_to_messages(list(messages))
        if not cfg.supports_system_messages:
            msgs = providers.fold_system_messages(msgs)
        json_format = None
        if schema is None:
            json_mode = None
        else:
            json_mode = json_mode or ("schema" if cfg.supports_json_schema else "prompt")
            # The schema ends the system message in schema mode (a stable prompt-cache prefix),
            # the question in prompt mode (else the 1.5B echoes it; bench_llm: 25% vs 100% valid).
            msgs = _ask_for_json(msgs, schema, in_system=json_mode == "schema")
            if json_mode == "schema":  # as a dict: a class would be sent as OpenAI's strict schema
                json_format = {"name": schema.__name__, "schema": schema.model_json_schema()}
        record = dict(
            role=role, provider=cfg.provider, model=cfg.model, schema=schema and schema.__name__,
            json_mode=json_mode, in_chars=sum(len(m.text) for m in msgs),
        )  # fmt: skip
        prompt = json.dumps([[m.type, m.text] for m in msgs])
        llm_string = json.dumps({
            "provider": cfg.provider, "base_url": cfg.display_url, "model": cfg.model,
            "temperature": self.settings.llm.temperature, "max_tokens": max_tokens,
            "json_mode": json_mode,
            "schema": schema.model_json_schema() if schema is not None else None,
        })  # fmt: skip
        hit = self._cache.lookup(prompt, llm_string) if self._cache is not None else None
        start = time.perf_counter()
        if hit is not None:
            message, retries = hit[0].message, 0
        else:
            try:
                message, retries = self._call(msgs, max_tokens, json_format, cfg, role, deadline)
            except LLMCallError as exc:
                took = round(time.perf_counter() - start, 4)
                record.update(latency_s=took, out_chars=0, retries=exc.attempts, error=exc.reason)
                self._records.append(CallRecord(**record))
                raise
        usage = message.usage_metadata or {}
        result = LLMResult(
            text=message.text,
            cached=hit is not None,
            latency_s=0.0 if hit is not None else time.perf_counter() - start,
            input_tokens=usage.get("input_tokens"),
            output_tokens=usage.get("output_tokens"),
            cached_prompt_tokens=(usage.get("input_token_details") or {}).get("cache_read"),
            retries=retries,
            finish_reason=message.response_metadata.get("finish_reason"),
        )
        cut = result.finish_reason == "length"
        if schema is not None and cut and result.empty:
            result.parse_error = "reply cut off at max_tokens before any output"
        elif schema is not None:
            try:
                result.parsed = parse_json_reply(result.text, schema)
            except JSONReplyError as exc:
                result.parse_error = f"{exc} (reply cut off at max_tokens)" if cut else str(exc)
        if result.parse_error:
            logger.info("LLM %s/%s parse failure: %s", cfg.provider, role, result.parse_error)
            logger.debug("LLM %s/%s unparsed reply: %r", cfg.provider, role, result.text)
        if result.empty:
            logger.warning(
                "LLM %s/%s returned an empty reply (finish_reason=%s)",
                cfg.provider, role, result.finish_reason,
            )  # fmt: skip
        self._records.append(CallRecord(
            **record, latency_s=round(result.latency_s, 4), out_chars=len(result.text),
            input_tokens=result.input_tokens, output_tokens=result.output_tokens,
            cached_prompt_tokens=result.cached_prompt_tokens, cached=result.cached,
            retries=result.retries, parse_failed=result.parse_error is not None, empty=result.empty,
        ))  # fmt: skip
        # Only good replies are cached: a bad one would be replayed to every later run.
        usable = not result.empty and (accept(result.text) if accept else not result.parse_error)
        if self._cache is not None and hit is None and usable:
            self._cache.update(prompt, llm_string, [ChatGeneration(message=message)])
        return result

    def _call(
        self,
        msgs: list[Any],
        max_tokens: int | None,
        json_format: dict[str, Any] | None,
        cfg: providers.ResolvedLLM,
        role: str,
        deadline: float | None,
    ) -> tuple[Any, int]:
        """The reply message and the SDK's retries; with ``json_format``, in JSON-schema mode (its
        raw reply: :func:`parse_json_reply` reads it, as it reads cached and prompt-mode replies)."""
        import openai
        from langchain_openai.chat_models.base import BaseChatOpenAI

        llm = self._factory(role) if self._factory else providers.chat_model(cfg, self.settings)
        kwargs = {} if max_tokens is None else {"max_tokens": max_tokens}
        if json_format is None:
            runnable = llm.bind(**kwargs)
        elif isinstance(llm, BaseChatOpenAI):
            runnable = llm.with_structured_output(
                json_format, method="json_schema", include_raw=True, **kwargs
            )
        else:  # a test's fake model: the format goes along as a keyword
            fmt = {"type": "json_schema", "json_schema": json_format}
            runnable = llm.bind(response_format=fmt, **kwargs)
        limiter = providers.rate_limiter(cfg)
        attempts = providers.Attempts(deadline, limiter, getattr(llm, "root_client", None))
        token = providers.CALL.set(attempts)
        system = "".join(m.text for m in msgs[:1] if m.type == "system")
        local = cfg.local and self._factory is None
        state = local_llm.prompt_state(cfg.provider, system) if local else contextlib.nullcontext()
        t0 = time.perf_counter()
        try:
            with state:  # the embedded model's saved prompt state
                reply = runnable.invoke(msgs)
        except (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError) as exc:
            # JSON-schema mode's parse() refuses a cut-off reply: its text is still the reply
            generation = llm._create_chat_result(exc.completion).generations[0]  # noqa: SLF001
            reply = generation.message
            reply.response_metadata.update(generation.generation_info or {})
        except Exception as exc:
            n = attempts.count if attempts.client is not None else 1  # a fake sends no request
            prefix = f"LLM call for role {role!r} to {cfg.provider} ({cfg.model})"
            stopped = isinstance(exc, providers.DeadlineReached)
            reason = cfg.redact(str(exc) if stopped else providers.failure_reason(exc))
            about = {"role": role, "provider": cfg.provider, "attempts": n, "reason": reason}
            if stopped or (deadline is not None and time.monotonic() >= deadline):
                raise LLMDeadlineError(
                    f"{prefix} stopped at the run deadline after {n} attempt(s) and "
                    f"{time.perf_counter() - t0:.1f}s (last: {reason}); raise RUN_TIMEOUT / "
                    "--deadline to allow more time",
                    **about,
                ) from None
            where = f" at {cfg.display_url}" if cfg.display_url and not cfg.local else ""
            message = f"{prefix} failed after {n} attempt(s): {reason}{where}"
            raise LLMCallError(message, **about) from None
        finally:
            providers.CALL.reset(token)
        return reply["raw"] if isinstance(reply, dict) else reply, max(0, attempts.count - 1)


def main(argv: Sequence[str] | None = None) -> int:
    """``python llm_config.py``: the providers, the selection and, with ``--ping``, one call."""
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
    try:
        load_dotenv_file()
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"llm_config.py: error: {exc}", file=sys.stderr)
        return 2
    ping = None
    if args.ping:
        client = LLMClient(settings.replace(llm_cache=False))
        try:
            ask = [("user", "Reply with the single word: ready")]
            res = client.invoke(ask, role="ping", max_tokens=8)
            ping = {"ok": True, "reply": res.text.strip(), "latency_s": round(res.latency_s, 2)}
            if res.empty:  # what the agent counts as a failed call (a thinking model, 8 tokens)
                ping = {"ok": False, "error": f"empty reply (finish_reason {res.finish_reason})"}
        except (LLMCallError, providers.LLMConfigError) as exc:
            ping = {"ok": False, "error": str(exc)}
    out = {**providers.listing(settings), "ping": ping}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(providers.format_listing(out))
        if ping is not None:
            ok = f"ok, replied {ping.get('reply')!r} in {ping.get('latency_s')} s"
            print(f"ping: {ok if ping['ok'] else 'failed: ' + ping['error']}")
    return 0 if ping is None or ping["ok"] else 1


if __name__ == "__main__":
    run_script(main)
