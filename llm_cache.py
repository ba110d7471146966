"""The SQLite response cache of :class:`llm_config.LLMClient` (``LLM_CACHE``, ``LLM_CACHE_PATH``):
a rerun with the same requests costs no provider calls.  The client decides what is cached (only
good replies) and what a request is; this module stores and finds the replies."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.caches import BaseCache
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration


class ResponseCache(BaseCache):
    """langchain-core's cache interface over our SQLite file: one row per reply (text and token
    usage, never a key), keyed by the sha256 of the request (messages, provider, display URL,
    model, parameters) as one sorted JSON object, so older cache files still hit.  Not
    langchain-community's SQLiteCache: that keys on the model's serialized form, key and URL."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, provider TEXT, "
            "model TEXT, text TEXT, usage TEXT, created REAL)"
        )
        self._db.commit()

    @staticmethod
    def _key(prompt: str, llm_string: str) -> str:
        payload = {**json.loads(llm_string), "messages": json.loads(prompt)}
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def lookup(self, prompt: str, llm_string: str) -> list[Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT text, usage FROM responses WHERE key = ?",
                (self._key(prompt, llm_string),),
            ).fetchone()
        if row is None:
            return None
        usage = json.loads(row[1] or "{}")
        tokens = usage.get("input_tokens"), usage.get("output_tokens")
        message = AIMessage(
            content=row[0],
            usage_metadata=None if None in tokens else {
                "input_tokens": tokens[0], "output_tokens": tokens[1],
                "total_tokens": tokens[0] + tokens[1],
            },
            response_metadata={"finish_reason": usage.get("finish_reason")},
        )  # fmt: skip
        return [ChatGeneration(message=message)]

    def update(self, prompt: str, llm_string: str, return_val: Sequence[Any]) -> None:
        message = return_val[0].message
        tokens = message.usage_metadata or {}
        usage = {k: tokens.get(k) for k in ("input_tokens", "output_tokens")}
        usage["finish_reason"] = message.response_metadata.get("finish_reason")
        about = json.loads(llm_string)
        row = (self._key(prompt, llm_string), about["provider"], about["model"], message.text)
        with self._lock, self._db:  # the connection commits on leaving
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                (*row, json.dumps(usage), time.time()),
            )

    def clear(self, **kwargs: Any) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM responses")
