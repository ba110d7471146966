"""The research as tools: the LangChain tool, and the MCP server driven by the official `mcp` client
over stdio, as another assistant would use it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from test_filters import PASSAGES

import load_corpus
import mcp_server
from settings import Settings

REPO = Path(__file__).resolve().parent.parent


def test_search_passages_is_a_langchain_tool_whose_bad_input_names_the_problem(
    tmp_settings, fake, monkeypatch
):
    load_corpus.load_passages(PASSAGES, tmp_settings, progress=False)
    monkeypatch.setattr(mcp_server, "_settings", lambda: tmp_settings)
    tool = mcp_server.search_passages
    assert tool.name == "search_passages" and "jurisdiction" in tool.args
    assert "Texas" in tool.args["jurisdiction"]["description"]
    found = tool.invoke({"query": "expectation damages", "k": 3, "jurisdiction": "Texas"})
    assert len(found) == 3 and all(d["id"].startswith("tx_case_") for d in found)
    with pytest.raises(ValueError, match="query is empty"):
        mcp_server.search("  ")
    with pytest.raises(ValueError, match="k=0"):
        mcp_server.search("damages", 0)
    with pytest.raises(ValueError, match="FILTER_JURISDICTION"):
        mcp_server.search("damages", jurisdiction="Narnia")


@pytest.mark.slow
def test_the_mcp_server_over_stdio_lists_its_tools_searches_with_a_filter_and_reports_errors(
    tmp_path,
):
    """A real MCP client (the `mcp` SDK) starts `python mcp_server.py` and talks to it over stdio;
    the passages are indexed with the real embedder."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = {**os.environ, "CHROMA_DIR": str(tmp_path / "chroma"), "LLM_CACHE": "0"}
    settings = Settings.from_env(env=env)
    load_corpus.load_passages(PASSAGES, settings, progress=False)
    params = StdioServerParameters(
        command=sys.executable, args=[str(REPO / "mcp_server.py")], env=env, cwd=str(tmp_path)
    )

    async def session_calls():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            found = await session.call_tool(
                "search_passages",
                {"query": "expectation damages for breach", "k": 4, "jurisdiction": "TX"},
            )
            empty = await session.call_tool("search_passages", {"query": ""})
            return tools, found, empty

    tools, found, empty = asyncio.run(session_calls())
    assert {t.name for t in tools.tools} == {"search_passages", "research"}
    research = next(t for t in tools.tools if t.name == "research")
    assert {"question", "thread", "issues"} <= set(research.inputSchema["properties"])
    assert not found.isError
    passages = found.structuredContent["result"]
    assert len(passages) == 4 and all(p["id"].startswith("tx_case_") for p in passages)
    assert json.loads(found.content[0].text)["id"].startswith("tx_case_")
    assert empty.isError and "query is empty" in empty.content[0].text


@pytest.mark.slow
@pytest.mark.local_llm
def test_a_research_over_mcp_reports_its_steps_and_leaves_the_server_answering(tmp_path):
    """`research` ran on the server's event loop: for the whole run (seconds to minutes) the server
    answered nothing else (no ping, no other call) and said nothing of its progress.  Now a client
    that asks gets each step as progress, and a search made meanwhile comes back before it ends."""
    pytest.importorskip("xllamacpp")
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = {**os.environ, "CHROMA_DIR": str(tmp_path / "chroma"), "LLM_CACHE": "0",
           "LLM_PROVIDER": "local", "CHECKPOINTS": str(tmp_path / "threads.sqlite")}  # fmt: skip
    load_corpus.ensure_starter_index(Settings.from_env(env=env))
    params = StdioServerParameters(
        command=sys.executable, args=[str(REPO / "mcp_server.py")], env=env, cwd=str(tmp_path)
    )
    steps: list[str] = []
    ended: dict[str, float] = {}

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append(message or "")

    async def session_calls():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await session.call_tool("search_passages", {"query": "mailbox rule"})  # warm

            async def research():
                result = await session.call_tool(
                    "research", {"question": "What is the mailbox rule?"},
                    progress_callback=on_progress,
                )  # fmt: skip
                ended["research"] = asyncio.get_running_loop().time()
                return result

            async def search():
                await asyncio.sleep(1.0)  # the research is under way
                await session.send_ping()
                found = await session.call_tool("search_passages", {"query": "battery"})
                ended["search"] = asyncio.get_running_loop().time()
                return found

            return await asyncio.gather(research(), search())

    record, found = asyncio.run(session_calls())
    assert not record.isError and not found.isError
    answer = record.structuredContent
    assert answer["thread_id"] and answer["citations"] and "Mailbox rule" in answer["text"]
    assert ended["search"] < ended["research"]
    assert any(s.startswith("planner: ") for s in steps) and any(
        s.startswith("answer: ") for s in steps
    )


@pytest.mark.slow
@pytest.mark.local_llm
def test_a_research_the_client_cancels_stops_at_the_end_of_its_step_and_can_be_resumed(tmp_path):
    """A cancelled `research` went on to its end in the server (a minute of both cores on a
    laptop): it now stops when the step under way ends, kept on its thread for `--resume`."""
    pytest.importorskip("xllamacpp")
    from mcp import ClientSession, StdioServerParameters, types
    from mcp.client.stdio import stdio_client
    from mcp.shared.exceptions import McpError

    import main

    env = {**os.environ, "CHROMA_DIR": str(tmp_path / "chroma"), "LLM_CACHE": "0",
           "LLM_PROVIDER": "local", "CHECKPOINTS": str(tmp_path / "threads.sqlite")}  # fmt: skip
    settings = Settings.from_env(env=env)
    load_corpus.ensure_starter_index(settings)
    params = StdioServerParameters(
        command=sys.executable, args=[str(REPO / "mcp_server.py")], env=env, cwd=str(tmp_path)
    )
    question = (
        "Officer Reyes arrested Dan for driving with a suspended license, handcuffed him, and "
        "locked him in her patrol car. She then searched his car and found cocaine under the "
        "seat. Can Dan have the cocaine suppressed?"
    )

    async def session_calls():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            planning = asyncio.Event()

            async def on_progress(progress: float, total: float | None, message: str | None):
                if (message or "").startswith("classifier"):  # the planner's call is under way
                    planning.set()

            request_id = session._request_id  # the id call_tool sends next
            call = asyncio.create_task(
                session.call_tool(
                    "research",
                    {"question": question, "thread": "t-cancel"},
                    progress_callback=on_progress,
                )  # fmt: skip
            )
            await planning.wait()
            cancel = types.CancelledNotification(
                params=types.CancelledNotificationParams(requestId=request_id)
            )
            await session.send_notification(types.ClientNotification(cancel))
            with pytest.raises(McpError, match="cancelled"):
                await call
            await asyncio.sleep(25)  # the answer stage alone takes longer than this
            return await session.call_tool("search_passages", {"query": "search incident"})

    found = asyncio.run(session_calls())
    assert not found.isError  # the server still answers
    with main.open_checkpointer(settings) as checkpointer:
        saved = main.thread_state(main.build_graph(checkpointer=checkpointer),
                                  main.thread_config("t-cancel"))  # fmt: skip
    assert saved.values.get("planning_table") and not saved.values.get("answer")
    assert main._unfinished(saved)  # `main.py --resume t-cancel` goes on from there
