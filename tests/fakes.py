"""Scripted chat models for unit tests: replies per role, in order, with every prompt recorded.

A reply is a string (a :class:`CutOff` string ran out of tokens), an exception (raised, as a transport failure would be) or a function of the
prompt text.  Role ``"*"`` answers any role without its own queue.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from llm_config import LLMClient


class CutOff(str):
    """A reply that ran out of tokens (``finish_reason`` "length", as a provider reports it)."""


class Script:
    """Replies per role, consumed in order (``repeat_last``: the last one repeats)."""

    def __init__(self, replies: dict[str, list[Any]], *, repeat_last: bool = False) -> None:
        self.replies = {k: list(v) for k, v in replies.items()}
        self.repeat_last = repeat_last
        self.calls: list[tuple[str, str]] = []

    def next(self, role: str, text: str) -> Any:
        self.calls.append((role, text))
        queue = self.replies.get(role) or self.replies.get("*")
        if not queue:
            raise AssertionError(f"unexpected LLM call for role {role!r}")
        reply = queue[0] if self.repeat_last and len(queue) == 1 else queue.pop(0)
        return reply(text) if callable(reply) else reply

    def roles(self) -> list[str]:
        return [r for r, _ in self.calls]

    def prompts(self, role: str | None = None) -> list[str]:
        return [t for r, t in self.calls if role is None or r == role]


class ScriptedChat(BaseChatModel):
    role: str
    script: Any

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        reply = self.script.next(self.role, "\n".join(str(m.content) for m in messages))
        if isinstance(reply, BaseException):
            raise reply
        meta = {"finish_reason": "length"} if isinstance(reply, CutOff) else {}
        message = AIMessage(content=str(reply), response_metadata=meta)
        return ChatResult(generations=[ChatGeneration(message=message)])

    @property
    def _llm_type(self) -> str:
        return "scripted"


def scripted_client(
    settings: Any, replies: dict[str, list[Any]], *, repeat_last: bool = False
) -> tuple[LLMClient, Script]:
    """An ``LLMClient`` (no retries) whose every role answers from ``replies``."""
    script = Script(replies, repeat_last=repeat_last)
    client = LLMClient(
        settings.replace(llm_max_retries=0),
        llm_factory=lambda role: ScriptedChat(role=role, script=script),
    )
    return client, script
