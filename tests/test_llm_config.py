"""LLM layer: registry and overrides, retries against a scripted OpenAI-compatible server on
loopback (real HTTP through ChatOpenAI), JSON parsing, metrics, the response cache and secrets."""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from pydantic import BaseModel

import llm_config
import providers
from llm_config import JSONReplyError, LLMCallError, LLMClient, LLMDeadlineError, parse_json_reply
from providers import (
    PROVIDERS,
    LLMConfigError,
    chat_model,
    check_config,
    fold_system_messages,
    resolve,
)
from settings import Settings

SECRET = "gsk-test-SECRET-value-123456"


class Verdict(BaseModel):
    verdict: Literal["safe", "unsafe"]
    reason: str


class Rewrite(BaseModel):
    primary: str
    alternatives: list[str]


# ------------------------------------------------------------------------------------------------
# A scripted OpenAI-compatible server
# ------------------------------------------------------------------------------------------------


def completion(content: str, finish_reason: str = "stop") -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": 11,
            "completion_tokens": 7,
            "total_tokens": 18,
            "prompt_tokens_details": {"cached_tokens": 5},
        },
    }


class FakeServer:
    """Answers POST /v1/chat/completions from a script; each step is a dict with optional
    status, body (dict), raw (str: the body as is, e.g. an HTML page), content_type, headers,
    delay (seconds).  When the script runs out, the last step repeats."""

    def __init__(self) -> None:
        self.script: list[dict] = []
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with outer._lock:
                    outer.requests.append(
                        {
                            "t": time.monotonic(),
                            "path": self.path,
                            "body": body,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                        }
                    )
                    step = (
                        outer.script.pop(0) if len(outer.script) > 1 else (outer.script or [{}])[0]
                    )
                time.sleep(step.get("delay", 0))
                if "raw" in step:
                    payload = step["raw"].encode()
                else:
                    payload = json.dumps(step.get("body", completion("ok"))).encode()
                try:
                    self.send_response(step.get("status", 200))
                    self.send_header("Content-Type", step.get("content_type", "application/json"))
                    self.send_header("Content-Length", str(len(payload)))
                    for k, v in step.get("headers", {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = FakeServer()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def _fresh_llm_cache(monkeypatch):
    import openai._base_client

    monkeypatch.setattr(providers, "_models", {})
    monkeypatch.setattr(providers, "_limiters", {})
    monkeypatch.setattr(openai._base_client, "INITIAL_RETRY_DELAY", 0.01)  # the SDK's backoff


def make_client(tmp_settings, server: FakeServer, provider: str = "vllm", **changes) -> LLMClient:
    """A client for ``provider`` pointed at the fake server."""
    env = {"GROQ_API_KEY": SECRET, "GEMINI_API_KEY": SECRET}
    values = {
        "llm_provider": provider,
        "llm_base_url": server.url,
        "llm_model": "fake-model",
        "llm_timeout": 5.0,
        "llm_max_retries": 3,
        "environ": env,
        **changes,
    }
    return LLMClient(tmp_settings.replace(**values))


MSGS = [("system", "You screen questions."), ("user", "Question: what is adverse possession?")]


# ------------------------------------------------------------------------------------------------
# Registry and configuration
# ------------------------------------------------------------------------------------------------


def test_registry_covers_the_expected_providers():
    assert len(PROVIDERS) >= 19
    for name in ("local", "local-small", "google-gemma", "groq", "groq-small", "cerebras", "ollama",
                 "deepseek", "openai", "together", "mistral", "vllm", "llamacpp-server"):  # fmt: skip
        assert name in PROVIDERS
    assert sum(n.startswith("openrouter") for n in PROVIDERS) >= 3
    assert PROVIDERS["google-gemma"].model == "gemma-3-27b-it"
    assert PROVIDERS["google-gemma"].supports_system_messages is False
    assert PROVIDERS["groq"].model == "llama-3.3-70b-versatile"
    assert PROVIDERS["local"].supports_json_schema


def test_missing_key_fails_at_once_naming_the_variable(tmp_settings, server):
    settings = tmp_settings.replace(llm_provider="groq", environ={})
    with pytest.raises(LLMConfigError, match="GROQ_API_KEY"):
        resolve(None, settings)
    with pytest.raises(LLMConfigError, match="GROQ_API_KEY"):
        LLMClient(settings).invoke(MSGS, role="synthesize")
    assert server.requests == []


def test_unknown_provider_lists_the_choices(tmp_settings):
    with pytest.raises(LLMConfigError, match="groq-small"):
        resolve(None, tmp_settings.replace(llm_provider="nope"))


@pytest.mark.parametrize(
    ("original", "provider", "base_url", "model", "key_var"),
    [
        ("gemma", "google-gemma", "https://generativelanguage.googleapis.com/v1beta/openai/",
         "gemma-3-27b-it", "GOOGLE_API_KEY"),
        ("groq-llama70b", "groq", "https://api.groq.com/openai/v1", "llama-3.3-70b-versatile",
         "GROQ_API_KEY"),
        ("or-llama70b", "openrouter-llama-free", "https://openrouter.ai/api/v1",
         "meta-llama/llama-3.3-70b-instruct:free", "OPENROUTER_API_KEY"),
        ("cerebras", "cerebras", "https://api.cerebras.ai/v1", "llama-3.3-70b", "CEREBRAS_API_KEY"),
        ("ollama", "ollama", "http://localhost:11434/v1", PROVIDERS["ollama"].model, None),
    ],
)  # fmt: skip
def test_an_env_file_of_the_original_project_selects_the_same_endpoint(
    original, provider, base_url, model, key_var
):
    env = {"LLM_PROVIDER": original, **({key_var: "k-123"} if key_var else {})}
    cfg = resolve(None, Settings.from_env(env=env))
    assert (cfg.provider, cfg.base_url, cfg.model) == (provider, base_url, model)
    assert cfg.api_key == ("k-123" if key_var else None)
    # The fast provider accepts the same names.
    fast_env = {"LLM_PROVIDER": "ollama", "LLM_PROVIDER_FAST": original, **env}
    assert resolve("classify", Settings.from_env(env=fast_env)).provider == provider


def test_google_ai_studio_takes_gemini_or_google_api_key():
    for name in ("gemma", "google-gemma", "google-gemini-flash"):
        env = {"LLM_PROVIDER": name}
        with pytest.raises(LLMConfigError, match="GEMINI_API_KEY.*GOOGLE_API_KEY"):
            resolve(None, Settings.from_env(env=env))
        assert resolve(None, Settings.from_env(env={**env, "GOOGLE_API_KEY": "g"})).api_key == "g"
        both = {**env, "GOOGLE_API_KEY": "g", "GEMINI_API_KEY": "m"}
        assert resolve(None, Settings.from_env(env=both)).api_key == "m"
    # The Google variable is no key for another provider.
    with pytest.raises(LLMConfigError, match="GROQ_API_KEY"):
        resolve(None, Settings.from_env(env={"LLM_PROVIDER": "groq", "GOOGLE_API_KEY": "g"}))


def test_original_gemma_settings_reach_the_endpoint_with_the_google_key(tmp_settings, server):
    """LLM_PROVIDER=gemma + GOOGLE_API_KEY, as in the original .env: the request carries that key
    and gemma's folded system prompt; records name the registry entry."""
    server.script = [{"body": completion("ok")}]
    settings = tmp_settings.replace(
        llm_provider="gemma", llm_base_url=server.url, environ={"GOOGLE_API_KEY": SECRET}
    )
    client = LLMClient(settings)
    assert client.invoke(MSGS, role="synthesize").text == "ok"
    (req,) = server.requests
    assert req["headers"]["authorization"] == f"Bearer {SECRET}"
    assert req["body"]["model"] == "gemma-3-27b-it"
    assert [m["role"] for m in req["body"]["messages"]] == ["user"]
    assert client.records[0].provider == "google-gemma"


def test_fast_roles_use_the_fast_provider_and_model(tmp_settings):
    s = tmp_settings.replace(
        llm_provider="groq",
        llm_provider_fast="cerebras",
        environ={"GROQ_API_KEY": "a-key", "CEREBRAS_API_KEY": "c-key"},
        llm_model="override-main",
    )
    main, fast = resolve("synthesize", s), resolve("classify", s)
    assert (main.provider, main.model) == ("groq", "override-main")
    assert (fast.provider, fast.model) == ("cerebras", PROVIDERS["cerebras"].model)
    assert fast.base_url == PROVIDERS["cerebras"].base_url
    s2 = tmp_settings.replace(llm_model_fast="tiny-model")
    assert resolve("rewrite", s2).model == "tiny-model"
    assert resolve("mc_select", s2).model == PROVIDERS["local"].model


def test_the_grader_uses_the_judge_provider_and_model(tmp_settings):
    s = tmp_settings.replace(
        llm_provider="groq",
        judge_provider="cerebras",
        judge_model="judge-70b",
        environ={"GROQ_API_KEY": "a-key", "CEREBRAS_API_KEY": "c-key"},
        llm_model="override-main",
    )
    judge, main = resolve("judge", s), resolve("mc_select", s)
    assert (judge.provider, judge.model, judge.api_key) == ("cerebras", "judge-70b", "c-key")
    assert judge.base_url == PROVIDERS["cerebras"].base_url
    assert (main.provider, main.model) == ("groq", "override-main")
    # JUDGE_MODEL alone: the main provider with another model
    alone = resolve("judge", tmp_settings.replace(judge_model="bigger-model"))
    assert (alone.provider, alone.model) == ("local", "bigger-model")
    # unset: the grader is the main model
    assert resolve("judge", tmp_settings) == resolve("mc_select", tmp_settings)
    # a judge provider without its key fails before any work, naming the variable
    with pytest.raises(LLMConfigError, match="JUDGE_PROVIDER=groq needs an API key"):
        check_config(tmp_settings.replace(judge_provider="groq", environ={}), roles=("judge",))


def test_raw_overrides_replace_the_registry_entry(tmp_settings):
    s = tmp_settings.replace(
        llm_provider="openai", llm_base_url="http://h:1/v1", llm_api_key="k", llm_model="m"
    )
    cfg = resolve(None, s)
    assert (cfg.base_url, cfg.model, cfg.api_key) == ("http://h:1/v1", "m", "k")
    assert "k" not in repr(cfg)
    # A base URL on the local provider means "a llama.cpp server elsewhere": nothing embedded starts.
    assert resolve(None, tmp_settings.replace(llm_base_url="http://h:1/v1")).local is False


def test_chat_model_is_cached_and_retries_through_the_sdk(tmp_settings, server):
    s = tmp_settings.replace(llm_provider="vllm", llm_model="fake-model", llm_base_url=server.url)
    llm = chat_model(resolve("synthesize", s), s)
    assert llm is chat_model(resolve("classify", s), s)
    assert llm.max_retries == s.llm.max_retries == 4
    assert llm.invoke("hello").content == "ok"


def test_system_messages_are_folded_for_gemma(tmp_settings, server):
    server.script = [{"body": completion("fine")}]
    client = make_client(tmp_settings, server, provider="google-gemma")
    assert client.invoke(MSGS, role="injection").text == "fine"
    sent = server.requests[0]["body"]["messages"]
    assert [m["role"] for m in sent] == ["user"]
    assert sent[0]["content"].startswith("You screen questions.")
    assert "adverse possession" in sent[0]["content"]


def test_fold_system_messages_without_a_human_turn():
    out = fold_system_messages([SystemMessage("a"), SystemMessage("b"), AIMessage("x")])
    assert isinstance(out[0], HumanMessage) and out[0].content == "a\n\nb"


# ------------------------------------------------------------------------------------------------
# Retries and failures over real HTTP
# ------------------------------------------------------------------------------------------------


def test_rate_limit_retry_after_is_honoured(tmp_settings, server):
    server.script = [
        {
            "status": 429,
            "body": {"error": {"message": "slow down"}},
            "headers": {"Retry-After": "1"},
        },
        {"body": completion("done")},
    ]
    client = make_client(tmp_settings, server)
    t0 = time.perf_counter()
    res = client.invoke(MSGS, role="synthesize")
    assert res.text == "done" and res.retries == 1
    assert time.perf_counter() - t0 >= 1.0
    assert len(server.requests) == 2


def test_concurrent_calls_stay_within_the_requests_per_minute_limit(tmp_settings, server):
    from concurrent.futures import ThreadPoolExecutor

    server.script = [{"body": completion("ok")}]
    client = make_client(tmp_settings, server, llm_requests_per_minute=300)  # one per 0.2 s
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: client.invoke(MSGS, role="synthesize").text, range(4)))
    assert replies == ["ok"] * 4
    # At one call per 0.2 s the fourth may start 0.6 s after the first is let through, which is
    # after t0 (unlimited, all four arrive within ~0.05 s).  Measured from t0, not from the first
    # arrival: a busy machine can delay a thread between its turn and its request, so the first
    # request may arrive with the second.
    starts = sorted(r["t"] for r in server.requests)
    assert len(starts) == 4 and starts[-1] - t0 >= 0.55, [s - t0 for s in starts]


def test_registry_rate_limit_applies_unless_overridden(tmp_settings):
    from providers import resolve

    env = {"GROQ_API_KEY": SECRET}
    groq = tmp_settings.replace(llm_provider="groq", environ=env)
    assert resolve("synthesize", groq).requests_per_minute == 30
    assert resolve("synthesize", groq.replace(llm_requests_per_minute=5)).requests_per_minute == 5
    assert resolve("synthesize", tmp_settings).requests_per_minute is None  # local: no limit


def test_server_errors_are_retried_then_succeed(tmp_settings, server):
    server.script = [{"status": 500}, {"status": 503}, {"body": completion("third time")}]
    res = make_client(tmp_settings, server).invoke(MSGS, role="synthesize")
    assert res.text == "third time" and res.retries == 2
    server.script = [{"status": 500}, {"body": completion('{"verdict": "safe", "reason": "r"}')}]
    res = make_client(tmp_settings, server).invoke(MSGS, role="injection", schema=Verdict)
    assert res.parsed.verdict == "safe" and res.retries == 1  # JSON-schema mode: the same


def test_persistent_server_error_raises_typed_error(tmp_settings, server):
    server.script = [{"status": 500, "body": {"error": {"message": "boom"}}}]
    client = make_client(tmp_settings, server, llm_max_retries=2)
    with pytest.raises(LLMCallError, match="after 3 attempt") as info:
        client.invoke(MSGS, role="synthesize")
    assert "server error (HTTP 500)" in str(info.value)  # the message says what went wrong
    assert info.value.role == "synthesize" and info.value.attempts == 3
    assert len(server.requests) == 3
    assert client.records[-1].error and "500" in client.records[-1].error
    assert client.summary()["llm_errors"] == 1


def test_a_server_that_refuses_the_connection_fails_naming_its_url(tmp_settings, server):
    """A user's Ollama that is not running: the SDK's short retries, then its URL."""
    client = make_client(tmp_settings, server, llm_max_retries=1)
    url = server.url
    server.close()  # nothing listens there now
    with pytest.raises(LLMCallError, match="connection refused") as info:
        client.invoke(MSGS, role="synthesize")
    assert str(info.value).endswith(f" at {url}") and info.value.attempts == 2


def test_timeout_is_retried_then_reported(tmp_settings, server):
    server.script = [{"delay": 1.5, "body": completion("late")}]
    client = make_client(tmp_settings, server, llm_timeout=0.4, llm_max_retries=1)
    t0 = time.perf_counter()
    with pytest.raises(LLMCallError, match="timeout"):
        client.invoke(MSGS, role="synthesize")
    assert time.perf_counter() - t0 < 3.0
    assert len(server.requests) == 2


def test_a_timed_out_attempt_is_retried(tmp_settings, server):
    server.script = [{"delay": 1.0, "body": completion("late")}, {"body": completion("quick")}]
    client = make_client(tmp_settings, server, llm_timeout=0.3)
    res = client.invoke(MSGS, role="synthesize")
    assert res.text == "quick" and res.retries == 1


def test_auth_error_is_not_retried_and_key_is_not_leaked(tmp_settings, server, caplog):
    server.script = [
        {"status": 401, "body": {"error": {"message": f"Incorrect API key provided: {SECRET}"}}}
    ]
    client = make_client(tmp_settings, server, provider="groq")
    with caplog.at_level(logging.DEBUG), pytest.raises(LLMCallError, match="401") as info:
        client.invoke(MSGS, role="synthesize")
    assert len(server.requests) == 1
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in str(info.value)
    # the endpoint is named, the status said once ("HTTP 401: Error code: 401 - ..." before)
    assert f"at {server.url}" in str(info.value) and "Error code" not in str(info.value)
    assert SECRET not in caplog.text
    assert SECRET not in json.dumps([dataclasses.asdict(r) for r in client.records])


def test_quota_style_retry_after_fails_at_once_naming_the_provider(tmp_settings, server):
    server.script = [{"status": 429, "headers": {"Retry-After": "3600"}}]
    client = make_client(tmp_settings, server, provider="groq")
    t0 = time.monotonic()
    with pytest.raises(LLMCallError, match=r"to groq .*HTTP 429.*wait 3600s") as info:
        client.invoke(MSGS, role="synthesize")
    assert not isinstance(info.value, LLMDeadlineError) and info.value.attempts == 1
    assert len(server.requests) == 1 and time.monotonic() - t0 < 2


# ------------------------------------------------------------------------------------------------
# JSON outputs
# ------------------------------------------------------------------------------------------------


def test_schema_mode_sends_json_schema_and_parses(tmp_settings, server):
    server.script = [{"body": completion('{"verdict": "safe", "reason": "ordinary question"}')}]
    res = make_client(tmp_settings, server).invoke(
        MSGS, role="injection", schema=Verdict, max_tokens=64
    )
    assert res.parsed == Verdict(verdict="safe", reason="ordinary question")
    body = server.requests[0]["body"]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["verdict", "reason"]
    assert body["max_tokens"] == 64
    system, user = body["messages"]  # schema hint in the stable system prefix, question untouched
    assert (
        system["content"].startswith("You screen questions.") and '"verdict"' in system["content"]
    )
    assert user["content"] == "Question: what is adverse possession?"
    assert (res.input_tokens, res.output_tokens, res.cached_prompt_tokens) == (11, 7, 5)


def test_prompt_mode_for_providers_without_schema_support(tmp_settings, server):
    server.script = [
        {
            "body": completion(
                'Sure! Here it is:\n```json\n{"verdict": "unsafe", "reason": "x"}\n```'
            )
        }
    ]
    client = make_client(tmp_settings, server, provider="groq")
    res = client.invoke(MSGS, role="injection", schema=Verdict)
    assert res.parsed is not None and res.parsed.verdict == "unsafe"
    body = server.requests[0]["body"]
    assert "response_format" not in body
    last = body["messages"][-1]["content"]
    assert last.startswith("Question: what is adverse possession?") and '"verdict"' in last
    assert client.records[-1].json_mode == "prompt"


def test_llm_json_mode_prompt_serves_a_server_that_refuses_json_schemas(tmp_settings, server):
    """LLM_BASE_URL and LLM_MODEL alone (your own server) always sent response_format, and a
    server answering "'json_schema' is not supported" failed every JSON call; it was also named
    'local', which read as if the embedded model had failed."""
    server.script = [{"body": completion('{"verdict": "safe", "reason": "ok"}')}]
    client = make_client(tmp_settings, server, provider="local", llm_json_mode="prompt")
    assert client.invoke(MSGS, role="injection", schema=Verdict).parsed.verdict == "safe"
    assert "response_format" not in server.requests[0]["body"]
    assert client.records[-1].provider == "openai-compatible"


def test_malformed_json_is_a_counted_parse_failure_not_an_exception(tmp_settings, server):
    server.script = [{"body": completion('{"verdict": "safe", "reason": ')}]
    client = make_client(tmp_settings, server)
    res = client.invoke(MSGS, role="injection", schema=Verdict)
    assert res.parsed is None and res.parse_error
    assert client.summary()["parse_failures"] == 1
    assert client.summary()["by_role"]["injection"]["parse_failures"] == 1


def test_empty_reply(tmp_settings, server):
    server.script = [{"body": completion("")}]
    client = make_client(tmp_settings, server)
    assert client.invoke(MSGS, role="synthesize").text == ""
    res = client.invoke(MSGS, role="injection", schema=Verdict)
    assert res.parsed is None and res.parse_error == "empty reply"


def test_truncated_schema_reply_is_a_parse_failure(tmp_settings, server):
    server.script = [{"body": completion('{"verdict": "sa', finish_reason="length")}]
    res = make_client(tmp_settings, server).invoke(
        MSGS, role="injection", schema=Verdict, max_tokens=5
    )
    assert res.parsed is None and "max_tokens" in res.parse_error
    assert res.finish_reason == "length" and res.text == '{"verdict": "sa'  # the text is kept
    assert (res.input_tokens, res.output_tokens) == (11, 7)


@pytest.mark.parametrize(
    "reply",
    [
        '{"primary": "q", "alternatives": ["a", "b"]}',
        '```json\n{"primary": "q", "alternatives": ["a", "b"]}\n```',
        'Here is the rewrite: {"primary": "q", "alternatives": ["a", "b"]} Hope this helps {:)',
        "{'primary': 'q', 'alternatives': ['a', 'b'],}",
        '{"primary": "q", "alternatives": ["a", "b",],}\nNote: done.',
    ],
)
def test_parse_json_reply_accepts_common_shapes(reply):
    assert parse_json_reply(reply, Rewrite) == Rewrite(primary="q", alternatives=["a", "b"])


def test_parse_json_reply_braces_inside_strings():
    reply = 'x {"primary": "a {weird} q", "alternatives": ["}", "{"]} y'
    assert parse_json_reply(reply, Rewrite).primary == "a {weird} q"


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("", "empty reply"),
        ("no json here", "no JSON object"),
        ('{"primary": "q"}', "alternatives"),
        ('{"primary": "q", "alternatives": ', "no JSON object"),
        ("{{}}", "no JSON object"),  # a Python set of a dict: unhashable, still a parse error
        ('{[1], "primary"}', "no JSON object"),
    ],
)
def test_parse_json_reply_errors_say_why(reply, message):
    with pytest.raises(JSONReplyError, match=message):
        parse_json_reply(reply, Rewrite)


# ------------------------------------------------------------------------------------------------
# Fake chat models, metrics, cache
# ------------------------------------------------------------------------------------------------


def test_fake_chat_model_through_the_factory(tmp_settings):
    replies = iter([AIMessage('{"verdict": "safe", "reason": "r"}'), AIMessage("an answer")])
    seen_roles = []

    def factory(role):
        seen_roles.append(role)
        return GenericFakeChatModel(messages=replies)

    client = LLMClient(tmp_settings, llm_factory=factory)
    assert client.invoke(MSGS, role="injection", schema=Verdict).parsed.verdict == "safe"
    assert client.invoke([("user", "q")], role="synthesize").text == "an answer"
    assert seen_roles == ["injection", "synthesize"]
    summary = client.summary()
    assert summary["llm_calls"] == 2 and summary["parse_failures"] == 0
    assert summary["by_role"]["synthesize"]["llm_calls"] == 1
    rec = client.records[1]
    assert (rec.role, rec.provider, rec.in_chars, rec.out_chars) == ("synthesize", "local", 1, 9)


def test_cache_rerun_makes_zero_provider_calls_and_holds_no_key(tmp_settings, server, caplog):
    server.script = [{"body": completion('{"verdict": "safe", "reason": "ok"}')}]

    def run() -> LLMClient:
        client = make_client(tmp_settings, server, provider="groq", llm_cache=True)
        with caplog.at_level(logging.DEBUG):
            for _ in range(2):
                client.invoke(MSGS, role="injection", schema=Verdict)
            client.invoke(MSGS, role="injection", schema=Verdict, max_tokens=32)
        return client

    first = run()
    assert len(server.requests) == 2  # the repeat within the run was already cached
    assert [r.cached for r in first.records] == [False, True, False]
    second = run()  # a "rerun": new client, same cache file
    assert len(server.requests) == 2
    assert second.summary()["provider_calls"] == 0
    assert second.records[0].cached and second.records[0].json_mode == "prompt"
    cache_file = tmp_settings.llm.cache_path
    assert SECRET.encode() not in Path(cache_file).read_bytes()
    rows = sqlite3.connect(cache_file).execute("SELECT * FROM responses").fetchall()
    assert len(rows) == 2 and SECRET not in repr(rows)
    assert SECRET not in caplog.text


def test_a_cache_file_of_an_earlier_version_still_hits(tmp_settings):
    """The key (sha256 of the request) and the row format are pinned: a reply an earlier version
    stored is served again, with its token counts, and no model is asked."""
    settings = tmp_settings.replace(
        llm_provider="vllm", llm_base_url="http://127.0.0.1:9/v1", llm_model="fake-model",
        llm_cache=True,
    )  # fmt: skip
    db = sqlite3.connect(settings.llm.cache_path)
    db.execute(
        "CREATE TABLE responses (key TEXT PRIMARY KEY, provider TEXT, "
        "model TEXT, text TEXT, usage TEXT, created REAL)"
    )
    key = "59fb439490713c5c08265215719263d2138988a3c0d08e6634aa56e8567062e8"
    usage = '{"input_tokens": 5, "output_tokens": 2, "finish_reason": "stop"}'
    db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?)",
               (key, "vllm", "fake-model", "an earlier answer", usage, 0.0))  # fmt: skip
    db.commit()

    def no_model(role):
        raise AssertionError(f"cache miss for {role}")

    res = LLMClient(settings, llm_factory=no_model).invoke(MSGS, role="synthesize", max_tokens=32)
    assert (res.text, res.cached, res.input_tokens, res.output_tokens, res.finish_reason) == (
        "an earlier answer", True, 5, 2, "stop",
    )  # fmt: skip


def test_cache_off_by_default(tmp_settings, server):
    client = make_client(tmp_settings, server)
    client.invoke(MSGS, role="synthesize")
    client.invoke(MSGS, role="synthesize")
    assert len(server.requests) == 2


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def test_cli_lists_providers_and_key_status_without_the_key(
    monkeypatch, capsys, tmp_path, tmp_settings
):
    monkeypatch.chdir(tmp_path)  # no .env here
    monkeypatch.setenv("GROQ_API_KEY", SECRET)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("LLM_PROVIDER", raising=False)
    assert llm_config.main(["--json"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    data = json.loads(out)
    rows = {r["name"]: r for r in data["providers"]}
    assert rows["groq"]["key"] == "set" and rows["openai"]["key"] == "missing"
    assert rows["local"]["key"] == "not needed"
    assert data["selected"]["main"]["provider"] == "local"
    assert llm_config.main([]) == 0
    table = capsys.readouterr().out
    assert "GROQ_API_KEY: set" in table and "14,400" in table and SECRET not in table


def test_cli_lists_the_original_provider_names(monkeypatch, capsys, tmp_path, tmp_settings):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLM_PROVIDER", "gemma")
    monkeypatch.setenv("GOOGLE_API_KEY", SECRET)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    assert llm_config.main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["aliases"]["or-llama70b"] == "openrouter-llama-free"
    rows = {r["name"]: r for r in data["providers"]}
    assert rows["google-gemma"]["aliases"] == ["gemma"]
    assert rows["google-gemma"]["key"] == "set"
    assert data["selected"]["main"]["provider"] == "google-gemma"
    assert llm_config.main([]) == 0
    table = capsys.readouterr().out
    assert "google-gemma (gemma)" in table and "groq-llama70b = groq" in table
    assert "GEMINI_API_KEY/GOOGLE_API_KEY: set" in table and SECRET not in table


def test_cli_ping_goes_through_the_selected_provider(monkeypatch, capsys, tmp_path, server):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLM_PROVIDER", "vllm")
    monkeypatch.setenv("LLM_BASE_URL", server.url)
    monkeypatch.setenv("LLM_MODEL", "fake-model")
    server.script = [{"body": completion("ready")}]
    assert llm_config.main(["--ping", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ping"]["reply"] == "ready"
    server.script = [{"status": 404, "body": {"error": {"message": "no such model"}}}]
    assert llm_config.main(["--ping"]) == 1
    assert "404" in capsys.readouterr().out
    server.script = [{"body": completion("")}]  # said "ok, replied ''" though the agent fails
    assert llm_config.main(["--ping"]) == 1
    assert "ping: failed: empty reply" in capsys.readouterr().out


def test_local_provider_without_its_packages_is_a_config_error(tmp_settings, tmp_path, monkeypatch):
    import local_llm

    spec = local_llm.LocalModelSpec(
        "local", "x.gguf", "x", ("no_such_part_pkg1",), "0" * 64, "local"
    )
    monkeypatch.setitem(local_llm.LOCAL_MODELS, "local", spec)
    monkeypatch.setattr(local_llm, "_servers", {})
    settings = tmp_settings.replace(local_model_dir=str(tmp_path / "models"))
    with pytest.raises(LLMConfigError, match=r'pip install -e "\.\[local\]"'):
        LLMClient(settings).invoke(MSGS, role="synthesize")


# ------------------------------------------------------------------------------------------------
# Faulty replies: not a chat completion, empty, broken or off-schema JSON
# ------------------------------------------------------------------------------------------------

HTML_PAGE = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


@pytest.mark.parametrize(
    "bad_step",
    [
        {"raw": HTML_PAGE, "content_type": "text/html"},  # a proxy's error page
        {"raw": HTML_PAGE},  # ... sent as application/json
        {"raw": '{"id": "x", "choices": [{"message": {"content": "cut'},  # truncated body
        {"body": {"error": {"message": "upstream overloaded"}}},  # error object with 200
        {"body": {"id": "x", "object": "chat.completion", "choices": []}},
    ],
    ids=["html", "html-as-json", "truncated-json", "error-object", "no-choices"],
)
def test_a_200_that_is_not_a_chat_completion_is_retried_like_a_5xx(tmp_settings, server, bad_step):
    server.script = [bad_step, {"body": completion("recovered")}]
    client = make_client(tmp_settings, server)
    res = client.invoke(MSGS, role="synthesize")
    assert res.text == "recovered" and res.retries == 1
    assert len(server.requests) == 2


def test_a_persistent_html_200_fails_with_a_clear_reason(tmp_settings, server):
    server.script = [{"raw": HTML_PAGE, "content_type": "text/html"}]
    client = make_client(tmp_settings, server, llm_max_retries=1)
    with pytest.raises(LLMCallError, match="not a chat completion: '<html>") as info:
        client.invoke(MSGS, role="synthesize")
    assert not isinstance(info.value, LLMDeadlineError)
    assert info.value.attempts == 2 and len(server.requests) == 2
    assert "malformed response" in client.records[-1].error


@pytest.mark.parametrize("content", ["", None, "  \n "])
def test_empty_content_is_visible_and_never_cached(tmp_settings, server, content):
    server.script = [{"body": completion(content)}]
    client = make_client(tmp_settings, server, llm_cache=True)
    res = client.invoke(MSGS, role="synthesize")
    assert res.empty and res.finish_reason == "stop"
    schema_res = client.invoke(MSGS, role="injection", schema=Verdict)
    assert (
        schema_res.empty and schema_res.parsed is None and schema_res.parse_error == "empty reply"
    )
    summary = client.summary()
    assert summary["empty_replies"] == 2 and summary["parse_failures"] == 1
    assert [r.empty for r in client.records] == [True, True]
    # Asked again, the client goes back to the server instead of replaying the empty reply.
    server.script = [{"body": completion('{"verdict": "safe", "reason": "fine"}')}]
    assert client.invoke(MSGS, role="injection", schema=Verdict).parsed.verdict == "safe"
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ('{"verdict": "safe", "reason": ', "no JSON object found"),  # broken JSON
        ('{"verdict": "maybe", "reason": "x"}', "does not match Verdict"),  # off-schema enum
        ('{"answer": "safe"}', "does not match Verdict"),  # off-schema fields
    ],
)
def test_broken_or_off_schema_json_is_a_parse_failure_and_never_cached(
    tmp_settings, server, reply, error
):
    server.script = [{"body": completion(reply)}]
    client = make_client(tmp_settings, server, llm_cache=True)
    res = client.invoke(MSGS, role="injection", schema=Verdict)
    assert res.parsed is None and error in res.parse_error and not res.empty
    assert client.records[-1].parse_failed
    client.invoke(MSGS, role="injection", schema=Verdict)
    assert len(server.requests) == 2  # not served from the cache
    assert not client.records[-1].cached


def test_a_multiple_choice_reply_with_no_letter_is_never_cached(tmp_settings, server):
    """With LLM_CACHE=1 a reply naming no letter was replayed to every later run, also after the
    server was fixed: '**Answer: none**' for good."""
    import mc

    choices = {"A": "Yes", "B": "No"}
    server.script = [{"body": completion("I think the court would probably agree.")}] * 2
    client = make_client(tmp_settings, server, llm_cache=True)
    assert mc.select_answer(client, "Is it hearsay?", choices, None).letter is None
    server.script = [{"body": completion("**Answer: (B)**")}]
    assert mc.select_answer(client, "Is it hearsay?", choices, None).letter == "B"
    assert len(server.requests) == 3  # asked again, not replayed from the cache
    assert mc.select_answer(client, "Is it hearsay?", choices, None).letter == "B"
    assert len(server.requests) == 3  # the good reply is cached


# ------------------------------------------------------------------------------------------------
# Deadlines and timeouts
# ------------------------------------------------------------------------------------------------


def test_slow_server_call_ends_at_the_deadline_not_after_retries(tmp_settings, server):
    """Each attempt would time out after 5 s and be retried 3 times (20 s and more); the
    deadline 0.8 s away ends the call at 0.8 s with one request."""
    server.script = [{"delay": 3.0, "body": completion("too late")}]
    client = make_client(tmp_settings, server, llm_timeout=5.0, llm_max_retries=3)
    t0 = time.monotonic()
    client.deadline = t0 + 0.8
    with pytest.raises(LLMDeadlineError, match="deadline") as info:
        client.invoke(MSGS, role="synthesize")
    elapsed = time.monotonic() - t0
    assert 0.7 <= elapsed < 1.6, elapsed
    assert (info.value.role, info.value.provider, info.value.attempts) == ("synthesize", "vllm", 1)
    assert len(server.requests) == 1
    assert [r.error is not None for r in client.records] == [True]


def test_no_wait_the_provider_asks_for_runs_past_the_deadline(tmp_settings, server):
    server.script = [{"status": 503, "headers": {"Retry-After": "20"}}]
    client = make_client(tmp_settings, server, llm_max_retries=4)
    t0 = time.monotonic()
    client.deadline = t0 + 5.0  # the wait the server asks for would pass it
    with pytest.raises(LLMDeadlineError, match=r"after 1 attempt.*HTTP 503.*wait 20s"):
        client.invoke(MSGS, role="synthesize")
    assert time.monotonic() - t0 < 4.5  # failed at once, did not sleep into the deadline
    assert len(server.requests) == 1


def test_retries_continue_while_the_deadline_allows(tmp_settings, server):
    server.script = [{"status": 500}, {"status": 500}, {"body": completion("third")}]
    client = make_client(tmp_settings, server)
    client.deadline = time.monotonic() + 30
    res = client.invoke(MSGS, role="synthesize")
    assert res.text == "third" and res.retries == 2


def test_a_call_started_past_the_deadline_sends_nothing(tmp_settings, server):
    client = make_client(tmp_settings, server)
    client.deadline = time.monotonic() - 1
    with pytest.raises(LLMDeadlineError, match="not started") as info:
        client.invoke(MSGS, role="synthesize")
    assert info.value.attempts == 0 and server.requests == []


def test_the_client_deadline_applies_to_every_call(tmp_settings, server):
    server.script = [{"body": completion("ok")}]
    client = make_client(tmp_settings, server)
    client.deadline = time.monotonic() + 30
    assert client.invoke(MSGS, role="synthesize").text == "ok"
    client.deadline = time.monotonic() - 0.1
    with pytest.raises(LLMDeadlineError):
        client.invoke(MSGS, role="classify")
    assert len(server.requests) == 1


def test_the_deadline_also_bounds_the_rate_limit_wait(tmp_settings, server):
    server.script = [{"body": completion("ok")}]
    client = make_client(tmp_settings, server, llm_requests_per_minute=6)  # one per 10 s
    client.invoke(MSGS, role="synthesize")
    t0 = time.monotonic()
    client.deadline = t0 + 1.0
    with pytest.raises(LLMDeadlineError, match="rate-limit slot"):
        client.invoke(MSGS, role="synthesize")
    assert time.monotonic() - t0 < 0.5 and len(server.requests) == 1


def test_default_timeouts_long_on_this_machine_short_for_remote_apis(tmp_settings):
    env = {"GROQ_API_KEY": SECRET}
    auto = tmp_settings.replace(environ=env)
    assert auto.llm.timeout == 0  # the default is "auto"
    local = resolve(None, auto)
    groq = resolve(None, auto.replace(llm_provider="groq"))
    ollama = resolve(None, auto.replace(llm_provider="ollama"))
    vllm_remote = resolve(
        None,
        auto.replace(llm_provider="vllm", llm_model="m", llm_base_url="https://gpu.example/v1"),
    )
    assert providers.call_timeout(local, auto) == providers.LOCAL_TIMEOUT_S == 300
    assert providers.call_timeout(ollama, auto) == 300  # localhost: CPU inference
    assert providers.call_timeout(groq, auto) == providers.REMOTE_TIMEOUT_S == 60
    assert providers.call_timeout(vllm_remote, auto) == 60
    fixed = auto.replace(llm_timeout=12.5)
    assert providers.call_timeout(groq, fixed) == providers.call_timeout(local, fixed) == 12.5
    assert chat_model(groq, auto).request_timeout == 60


def test_run_timeout_setting(tmp_settings):
    from settings import Settings, SettingsError

    assert Settings.from_env(env={}).agent.run_timeout == 600
    assert Settings.from_env(env={"RUN_TIMEOUT": "0"}).agent.run_timeout == 0
    assert Settings.from_env(env={"RUN_TIMEOUT": "90"}).agent.run_timeout == 90
    with pytest.raises(SettingsError, match="RUN_TIMEOUT"):
        Settings.from_env(env={"RUN_TIMEOUT": "-5"})
    with pytest.raises(SettingsError, match="LLM_TIMEOUT"):
        Settings.from_env(env={"LLM_TIMEOUT": "-1"})


# ------------------------------------------------------------------------------------------------
# Credentials in URLs
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://user:secret@host:8000/v1", "http://***@host:8000/v1"),
        ("https://tok3n@api.example.com/v1", "https://***@api.example.com/v1"),
        ("https://h/v1?key=AIzaSECRET&alt=json", "https://h/v1?key=***&alt=json"),
        (
            "https://h/v1?api_key=s1&access_token=s2&x=1",
            "https://h/v1?api_key=***&access_token=***&x=1",
        ),
        ("http://u:p@[::1]:9/v1?Token=t#sig=abc", "http://***@[::1]:9/v1?Token=***#sig=***"),
        ("http://localhost:8000/v1", "http://localhost:8000/v1"),
        ("https://h/v1?monkey=1", "https://h/v1?monkey=***"),  # errs on the safe side
        (None, None),
        ("", ""),
        ("not a url", "not a url"),
    ],
)
def test_redact_url(url, expected):
    assert providers.redact_url(url) == expected


def test_credentials_in_the_base_url_reach_no_record_log_or_error(tmp_settings, server):
    import io

    password, token = "pa55-SECRET-word", "QUERY-SECRET-token"
    host = server.url.split("://", 1)[1]
    url = f"http://alice:{password}@{host}?key={token}"
    settings = tmp_settings.replace(
        llm_provider="vllm", llm_model="fake-model", llm_base_url=url, llm_max_retries=0
    )
    cfg = resolve(None, settings)
    assert cfg.base_url == url  # the real URL is still used for the calls
    assert password not in repr(cfg) and password not in cfg.display_url
    assert password not in json.dumps(providers.listing(settings)["selected"])

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    loggers = [root, logging.getLogger("httpx"), logging.getLogger("httpx2")]
    old_levels = [lg.level for lg in loggers]
    for lg in loggers:  # an eval CLI run earlier in the session may have quietened httpx
        lg.setLevel(logging.DEBUG)
    try:
        providers.install_log_redaction()
        server.script = [{"body": completion("ok")}]
        client = LLMClient(settings)
        assert client.invoke(MSGS, role="synthesize").text == "ok"
        server.script = [{"status": 400, "body": {"error": {"message": f"bad url {url}"}}}]
        with pytest.raises(LLMCallError) as info:
            client.invoke([("user", "again")], role="synthesize")
    finally:
        root.removeHandler(handler)
        for lg, level in zip(loggers, old_levels, strict=True):
            lg.setLevel(level)
    logged = stream.getvalue()
    assert "HTTP Request" in logged and "alice" not in logged  # httpx logged the request
    for secret in (password, token):
        assert secret not in logged
        assert secret not in str(info.value)
        assert secret not in json.dumps([dataclasses.asdict(r) for r in client.records])


def test_check_config_covers_every_role_before_any_work(tmp_settings, monkeypatch, server):
    import local_llm

    providers.check_config(tmp_settings.replace(llm_provider="vllm", llm_model="m"))
    with pytest.raises(LLMConfigError, match="LLM_PROVIDER_FAST=groq needs an API key") as info:
        providers.check_config(
            tmp_settings.replace(llm_provider="vllm", llm_model="m", llm_provider_fast="groq")
        )
    assert "LLM_API_KEY" not in str(info.value)  # the main provider's key: no help here
    with pytest.raises(LLMConfigError, match="not a known provider"):
        providers.check_config(tmp_settings.replace(llm_provider="nope-provider"))
    # The embedded model's packages are looked up, nothing is started or assembled.
    spec = local_llm.LocalModelSpec(
        "local", "x.gguf", "x", ("no_such_part_pkg1",), "0" * 64, "local"
    )
    monkeypatch.setitem(local_llm.LOCAL_MODELS, "local", spec)
    monkeypatch.setattr(local_llm, "_start", lambda *a, **k: pytest.fail("started the model"))
    with pytest.raises(LLMConfigError, match=r'no_such_part_pkg1.*pip install -e "\.\[local\]"'):
        providers.check_config(tmp_settings)
    assert server.requests == []
