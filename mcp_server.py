"""Serve the research to an MCP client over stdio: search_passages (a search of the corpus with the
passage filters; also a LangChain tool) and research (the agent's answer record as JSON, optionally
on a thread). Start it from the client's configuration, e.g. {"command": "python", "args":
["mcp_server.py"], "cwd": "<this folder>"}; settings come from the environment and .env, read when
the server starts. A bad input (an empty query, k out of range, an unknown filter value) is a tool
error the client sees, not a crash of the server. The tools run in a worker thread, so the server
answers pings and other calls while a research runs, and it reports each step of the research as
progress to a client that asks for it; a research the client cancels stops at the end of the
step under way (`main.py --resume` goes on with it when it was given a thread).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
from langchain_core.tools import tool
from mcp.server.fastmcp import Context, FastMCP

import filters
import rag_utils
from settings import Settings, load_dotenv_file

MAX_K = 50  # the most passages one search returns
PREVIEW_CHARS = 1500  # characters of a passage's text a search returns


@functools.cache
def _settings() -> Settings:
    load_dotenv_file()
    return Settings.from_env()


def search(
    query: str,
    k: int = 5,
    jurisdiction: str = "",
    court: str = "",
    source_type: str = "",
    after: str = "",
    before: str = "",
) -> list[dict[str, Any]]:
    """Search the legal corpus for passages that answer ``query`` (hybrid search): each passage's
    id, title, source, authority metadata and text.

    Args:
        query: what to search for, in words a source would use.
        k: how many passages (1-50).
        jurisdiction: US (federal) or a state, e.g. TX or Texas (comma-separated).
        court: courts-db ids, e.g. scotus, ca9 (comma-separated).
        source_type: constitution, statute, regulation, court_rule, case or secondary.
        after: only passages dated on or after YYYY[-MM[-DD]].
        before: only passages dated on or before YYYY[-MM[-DD]].
    """
    query = " ".join(str(query or "").split())
    if not query:
        raise ValueError("query is empty: give the words to search for")
    if not 1 <= int(k) <= MAX_K:
        raise ValueError(f"k={k}: must be between 1 and {MAX_K}")
    given = dict(
        jurisdiction=jurisdiction, court=court, source_type=source_type, after=after, before=before
    )
    settings = _settings().replace(**{f"filter_{n}": v or "" for n, v in given.items()})
    filters.passage_filter(settings)  # SettingsError (a ValueError) names a bad filter value
    docs = rag_utils.retrieve_documents(query, k=int(k), settings=settings)
    return [
        {
            "id": d["id"],
            "title": d.get("title") or "",
            "source": d.get("source") or "",
            "metadata": d.get("metadata") or {},
            "text": str(d.get("text") or "")[:PREVIEW_CHARS],
        }
        for d in docs
    ]


search_passages = tool("search_passages", parse_docstring=True)(search)


def _threaded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as an async tool (``fn``'s parameters and docstring) run in a worker thread, off the
    server's event loop.  A request the client cancelled meanwhile gets no reply: the SDK has
    answered it ("Request cancelled"), and a second reply ended the server (an AssertionError in
    mcp 1.30)."""

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> Any:
        result = await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
        await anyio.lowlevel.checkpoint()  # raises here when the request was cancelled
        return result

    return tool


async def research(
    question: str, thread: str = "", issues: str = "", ctx: Context | None = None
) -> dict[str, Any]:
    """Research a legal question with the agent and return its answer record: the rules quoted
    and cited, their application to the facts, conclusions, a bottom line or a letter, or why it
    abstained.  ``thread``: keep the run on that thread (the record says which); a question on a
    thread that answered one before is a follow-up on its facts and research.  ``issues``: the
    doctrines to research instead of the planner's picks, separated by ';' (for one the record's
    ``others`` names: candidates the research passed over)."""
    import main  # the agent's graph: imported on first use, not to list the tools
    from context import AgentContext
    from question import parse

    steps = itertools.count(1)

    def progress(event: dict) -> None:  # in the worker thread, after each node
        # a request the client cancelled stops here, at a step's end: its thread can be resumed
        anyio.from_thread.check_cancelled()
        if ctx is not None:
            message = f"{event['node']}: {event['decision']}"
            anyio.from_thread.run(ctx.report_progress, next(steps), None, message)

    def run() -> dict[str, Any]:
        settings = _settings()
        with main.open_checkpointer(settings) as checkpointer:
            result = main.run_agent(
                *parse(question),
                context=AgentContext.from_settings(settings),
                checkpointer=checkpointer,
                thread_id=thread or None,
                issues=issues.split(";"),
                on_event=progress,
            )
        if result.get("error"):
            raise RuntimeError(result["error"])
        return {"thread_id": result.get("thread_id"), **(result.get("answer") or {})}

    return await _threaded(run)()


def build_server() -> FastMCP:
    """The MCP server (the official SDK's FastMCP) with the two tools, each run in a worker thread
    (a research takes seconds to minutes; the server keeps answering meanwhile)."""
    server = FastMCP("legalragagent")
    server.add_tool(_threaded(search), name="search_passages")
    server.add_tool(research, name="research")
    return server


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="mcp_server.py", description=__doc__).parse_args(argv)
    logging.basicConfig(level=logging.WARNING)  # stdout carries the protocol: logs go to stderr
    build_server().run("stdio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
