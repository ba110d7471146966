"""The agent behind LangGraph's dev server (`langgraph dev`, the `studio` extra), driven through the
LangGraph SDK as LangGraph Studio drives it: a thread, runs on it, the thread's state.

The server runs the embedded LLM on a small index built here (tests/test_filters.py's passages, with
the real embedder); its threads, checkpoints, QA memory and LLM cache all stay below a temporary
folder.  A scenario is a test that takes the module's ``dev_server`` and calls
``dev_server.ask(thread_id, input=...)`` or ``ask(thread_id, command={"resume": ...})``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_filters import PASSAGES

import legal_graph
import load_corpus
import rag_utils
from settings import Settings

REPO = Path(__file__).resolve().parent.parent
GRAPH = "legal_research_agent"
START_TIMEOUT_S = 240.0
"""Seconds the server may take to answer /ok (imports, the graphs of langgraph.json)."""
RUN_TIMEOUT_S = 900.0
"""Seconds a run may take: the embedded model (loaded by the first run) on a slow machine."""

pytestmark = [pytest.mark.slow, pytest.mark.local_llm]


@dataclass(frozen=True)
class Turn:
    """One run on a thread: what it returned and the thread's state after it."""

    values: dict[str, Any]
    """The run's final state values (``runs.wait``'s output)."""
    state: dict[str, Any]
    """The thread's state after the run (``threads.get_state``): values, next, tasks, interrupts."""

    @property
    def interrupts(self) -> list[dict[str, Any]]:
        """The interrupts the run is paused on (``interrupt()`` in a node), each {value, id}."""
        pending = list(self.state.get("interrupts") or [])
        for task in self.state.get("tasks") or []:
            pending += [i for i in task.get("interrupts") or [] if i not in pending]
        return pending

    @property
    def interrupted(self) -> bool:
        """The run is paused: resume it with ``ask(thread_id, command={"resume": ...})``."""
        return bool(self.interrupts or self.state.get("next"))


@dataclass
class DevServer:
    """A started `langgraph dev` and an SDK client for it."""

    url: str
    client: Any
    log: Path

    def log_tail(self, chars: int = 6000) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return f"--- dev server log (last {chars} characters) ---\n{text[-chars:]}"

    def new_thread(self) -> str:
        return self.client.threads.create()["thread_id"]

    def ask(
        self,
        thread_id: str,
        *,
        input: dict[str, Any] | None = None,
        command: dict[str, Any] | None = None,
    ) -> Turn:
        """Run the agent on ``thread_id`` with ``input`` (a new question) or ``command`` (e.g.
        ``{"resume": ...}`` for a paused run) and wait for it to finish or pause."""
        assert (input is None) != (command is None), "give exactly one of input= and command="
        values = self.client.runs.wait(
            thread_id, GRAPH, input=input, command=command, raise_error=False
        )
        assert isinstance(values, dict) and "__error__" not in values, (
            f"the run failed: {values}\n{self.log_tail()}"
        )
        return Turn(values, self.client.threads.get_state(thread_id))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config_in(folder: Path) -> Path:
    """langgraph.json with its paths made absolute, written to ``folder``: the server then runs
    there and keeps its threads and checkpoints (``.langgraph_api/``, in the folder it runs in)
    out of the project, where a developer's own `langgraph dev` keeps them."""
    config = json.loads((REPO / "langgraph.json").read_text(encoding="utf-8"))
    config["dependencies"] = [str((REPO / dep).resolve()) for dep in config["dependencies"]]
    for name, spec in config["graphs"].items():
        path, _, attr = spec.rpartition(":")
        config["graphs"][name] = f"{(REPO / path).resolve()}:{attr}"
    target = folder / "langgraph.json"
    target.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return target


def _wait_until_up(proc: subprocess.Popen, url: str, server: DevServer) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the dev server exited with {proc.returncode}\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ok", timeout=5).status_code == 200:
                return
        time.sleep(1)
    pytest.fail(
        f"the dev server did not answer {url}/ok in {START_TIMEOUT_S:.0f} s\n{server.log_tail()}"
    )


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, sig)  # the server and anything it started
        else:  # Windows: no process groups to signal
            proc.kill()


def _stop(proc: subprocess.Popen) -> None:
    """End the server's process group: SIGTERM, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _signal_group(proc, getattr(signal, "SIGKILL", signal.SIGTERM))
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """`langgraph dev` on a free port, answering from an index of test_filters.PASSAGES."""
    pytest.importorskip("xllamacpp", reason="the embedded LLM needs the 'local' extra")
    pytest.importorskip(
        "langgraph_api", reason="the LangGraph dev server needs the 'studio' extra (make setup)"
    )
    from langgraph_sdk import get_sync_client

    cli = shutil.which("langgraph", path=str(Path(sys.executable).parent))
    if cli is None:
        pytest.skip("the `langgraph` CLI is not installed (the 'studio' extra; make setup)")

    home = tmp_path_factory.mktemp("dev_server")
    env = {
        **os.environ,
        "CHROMA_DIR": str(home / "chroma"),  # the index and the QA memory
        "LLM_CACHE": "0",
        "LLM_CACHE_PATH": str(home / "llm_cache.sqlite"),
        "CHECKPOINTS": str(home / "checkpoints.sqlite"),
        "LLM_PROVIDER": "local",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
    }
    load_corpus.load_passages(PASSAGES, Settings.from_env(env=env), progress=False)
    rag_utils.reset_caches()  # the server opens the store itself
    legal_graph.reset_caches()

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = home / "server.log"
    args = [cli, "dev", "--config", str(_config_in(home)), "--host", "127.0.0.1"]
    args += ["--port", str(port), "--no-browser", "--no-reload"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    # api_key=None: send no LangSmith key from this environment to the local server
    client = get_sync_client(url=url, api_key=None, timeout=(10, RUN_TIMEOUT_S, 60, 10))
    server = DevServer(url, client, log)
    try:
        _wait_until_up(proc, url, server)
        yield server
    finally:
        client.close()
        _stop(proc)


OFF_TOPIC = "What is the federal capital gains tax rate on stock held for two years?"
ANSWERABLE = "What are expectation damages for breach of contract?"  # every passage's subject


def test_a_second_question_on_a_dev_server_thread_gets_its_own_answer(dev_server: DevServer):
    """Issue 54's leak, through the real server: a question declined as off topic, then on the
    same thread one the index answers, was declined with the first one's reason (the thread kept
    the planner's decline)."""
    thread = dev_server.new_thread()
    first = dev_server.ask(thread, input={"question": OFF_TOPIC})
    declined = first.values["answer"]
    assert declined["abstained"] and declined["why"].startswith("off topic"), (
        f"{declined}\n{dev_server.log_tail()}"
    )
    assert not first.interrupted

    second = dev_server.ask(thread, input={"question": ANSWERABLE})
    record = second.values["answer"]
    assert record["why"] != declined["why"] and "off topic" not in record["why"], (
        f"the second question was declined with the first one's reason: {record}"
    )
    assert "decline" not in second.values["reading"]
    assert not record["abstained"] and record["citations"], record
    assert not second.interrupted
    assert second.state["values"]["question"] == ANSWERABLE
    assert second.state["values"]["answer"] == record


BREACH = (
    "A seller promised to deliver a printing press to a buyer for $10,000 by March 1 and never "
    "delivered it, so the buyer lost the profits of a printing contract. "
    "What damages can the buyer recover for the breach of contract?"
)
WHAT_IF = "What if the buyer had bought a substitute press from another seller for $12,000?"


def test_a_follow_up_on_a_dev_server_thread_reads_the_earlier_facts(dev_server: DevServer):
    """A question on a thread after the first is a follow-up: the server's thread gives it the
    earlier facts, and the research of the issues researched before (no search, no plan call)."""
    thread = dev_server.new_thread()
    first = dev_server.ask(thread, input={"question": BREACH})
    second = dev_server.ask(thread, input={"question": WHAT_IF})
    parsed = second.values["parsed"]
    assert parsed["earlier"] == first.values["parsed"]["facts"], parsed
    assert parsed["facts"][-1] == (
        "The buyer had bought a substitute press from another seller for $12,000."
    )
    assert parsed["asked"] == first.values["parsed"]["asked"]
    assert second.values["reading"]["follow_up"] == "hypothetical"
    planner = next(e for e in second.values["trace"] if e["node"] == "planner")
    assert "the thread's last agenda" in planner["decision"], planner
    calls = [t.values["run_metrics"]["llm_calls"] for t in (first, second)]
    assert calls[1] < calls[0], calls
    assert [t["question"] for t in second.values["turns"]] == [BREACH, WHAT_IF]


def test_a_run_paused_for_plan_review_is_resumed_through_the_api(dev_server: DevServer):
    """`review: true` in the input pauses the run after the planner (LangGraph's interrupt, as
    Studio shows it); ``Command(resume=...)`` through the API goes on with the agenda it sets."""
    thread = dev_server.new_thread()
    paused = dev_server.ask(thread, input={"question": BREACH, "review": True})
    assert paused.interrupted, paused.state
    pause = paused.interrupts[0]["value"]
    assert pause["agenda"] and "Press Enter to keep the agenda" in pause["how"]
    done = dev_server.ask(thread, command={"resume": "1"})
    assert not done.interrupted
    assert done.values["reading"]["agenda"] == pause["agenda"][:1]
    review = next(e for e in done.values["trace"] if e["node"] == "review")
    assert (
        review["decision"] in ("agenda kept by the user",)
        or "reviewed by the user" in (review["decision"])
    ), review
    assert done.values["answer"], done.values
