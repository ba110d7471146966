"""Threads and their checkpoint store (CHECKPOINTS): each run kept on a thread, a new question on
a thread starting clean, a stopped run resumed — on a SQLite file and on a PostgreSQL server this
file starts — and what a store shared by processes, or written by another version, does."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Script, ScriptedChat

# The graph's fake world, and its autouse fixture (synthetic passages share no word with facts).
from test_graph import (  # noqa: F401
    APPLY,
    BOTTOM,
    CHOICES,
    COMPARE,
    FACTS,
    LAW,
    FakeRetriever,
    J,
    _facts_relate_to_synthetic_rules,
    fact_replies,
    fake_context,
    run,
)

import answer
import main
import nodes
from llm_config import LLMClient
from question import InputError, Question

REPO = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------------------------
# The stores: a SQLite file, a PostgreSQL server of the test's own
# ------------------------------------------------------------------------------------------------


def _postgres_bin() -> Path | None:
    """The folder of PostgreSQL's initdb and pg_ctl: on PATH, else where Debian installs them
    (/usr/lib/postgresql/<version>/bin, off PATH), the newest version first."""
    on_path = shutil.which("pg_ctl")
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    folders = [Path(on_path).resolve().parent] if on_path else []
    return next((f for f in folders + debian if (f / "initdb").exists()), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(folder: Path) -> list[str]:
    """The command prefix that runs PostgreSQL's programs: the server refuses to run as root, so
    a root test (CI) runs them as Debian's ``postgres`` user, which then owns ``folder``."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    user = next((u for u in pwd.getpwall() if u.pw_name == "postgres"), None)
    if not (runuser and user):
        pytest.skip("running as root, with no 'postgres' user (or no runuser) to run the server")
    os.chown(folder, user.pw_uid, user.pw_gid)
    return [runuser, "-u", "postgres", "--"]


def _ok(command: list[str], cwd: Path) -> None:
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{command} failed: {proc.stdout}{proc.stderr}"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A throwaway PostgreSQL server on a free port of 127.0.0.1 (its data in a temporary folder,
    trust authentication), stopped and deleted afterwards: the URL of its ``postgres`` superuser,
    without a database."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (no pg_ctl on PATH or in /usr/lib/postgresql)")
    # Not below pytest's tmp_path: its root-owned 0700 parents would shut out the postgres user.
    folder = Path(tempfile.mkdtemp(prefix="lra-pg-"))
    port, data, started = _free_port(), str(folder / "data"), False
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    try:
        as_user = _as_server_user(folder)
        pg_ctl = [*as_user, str(bin_dir / "pg_ctl"), "-D", data]
        initdb = [*as_user, str(bin_dir / "initdb"), "-D", data, "-U", "postgres", "-A", "trust"]
        _ok([*initdb, "--no-sync"], folder)
        _ok([*pg_ctl, "-l", str(folder / "log"), "-w", "-o", options, "start"], folder)
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        if started:
            subprocess.run([*pg_ctl, "-m", "immediate", "stop"], cwd=folder, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path) -> str:
    """CHECKPOINTS for the test: a SQLite file, or a new database on the PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "threads.sqlite")
    import psycopg

    server = request.getfixturevalue("postgres_server")
    name = f"threads_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"{server}/{name}"


def _agent(tmp_settings, store: str, replies: dict) -> tuple:
    """Settings on ``store``, a scripted client answering ``replies`` and the fake context."""
    settings = tmp_settings.replace(
        llm_max_retries=0, skip_injection_check=True, verdict_support=0.0, checkpoints=store
    )
    script = Script(replies)
    client = LLMClient(settings, llm_factory=lambda role: ScriptedChat(role=role, script=script))
    ctx = fake_context(settings, client=client, retrieve=FakeRetriever(LAW, ranked=True))
    return settings, script, ctx


# ------------------------------------------------------------------------------------------------
# Threads: a checkpointed thread keeps each run's state, and a new question starts clean
# ------------------------------------------------------------------------------------------------


SPANISH = "¿Cuáles son los elementos de una demanda por negligencia en Estados Unidos?"


def _two_questions_replies() -> dict:
    replies = fact_replies()
    spanish = J(topic="negligence", area="torts", legal=True, query_type="simple")
    replies["classify"] = [spanish, *replies["classify"]]
    return replies


def test_a_second_question_on_a_thread_gets_its_own_answer_not_the_first_ones_decline(
    tmp_settings, monkeypatch, store
):
    """Reproduced with the graph compiled with a checkpointer, as the LangGraph dev server runs
    it: a question declined as off topic, then on the same thread an answerable one, was declined
    with the first one's reason (the thread kept ``decline``, and the trace held both runs)."""
    settings, _, ctx = _agent(tmp_settings, store, _two_questions_replies())
    monkeypatch.setattr(nodes, "default_context", lambda: ctx)
    with main.open_checkpointer(settings) as saver:
        graph = main.build_graph(context_schema=None, checkpointer=saver)
        config = {"configurable": {"thread_id": "t1"}}
        first = graph.invoke({"question": SPANISH}, config, context={})
        assert first["answer"]["abstained"] and "not in English" in first["reading"]["decline"]
        second = graph.invoke({"question": FACTS}, config, context={})
        history = list(graph.get_state_history(config))
    assert not second["answer"]["abstained"] and "decline" not in second["reading"]
    assert "Is the store liable to Paula? Yes. Negligence:" in second["answer"]["text"]
    assert second["stop_reason"] == "" and second["parsed"].text == FACTS
    nodes_of_second = [e["node"] for e in second["trace"]]
    assert (
        nodes_of_second.count("detect_injection") == 1 and nodes_of_second[0] == "detect_injection"
    )
    assert [s["step_id"] for s in second["planning_table"]] == [1, 2]
    # the thread keeps both runs in its history
    assert {SPANISH, FACTS} <= {h.values.get("question") for h in history}


def test_a_cli_run_is_checkpointed_on_a_thread_in_the_store(tmp_settings, store):
    """Every run is kept on a thread in CHECKPOINTS: the id comes back with the result, and the
    thread's state loads again in a new connection, the question read as it was."""
    settings, _, ctx = _agent(tmp_settings, store, _two_questions_replies())
    with main.open_checkpointer(settings) as saver:
        first = main.run_agent(SPANISH, context=ctx, checkpointer=saver)
        thread = first["thread_id"]
        second = main.run_agent(FACTS, context=ctx, checkpointer=saver, thread_id=thread)
    assert thread and second["thread_id"] == thread and not second["answer"]["abstained"]
    with main.open_checkpointer(settings) as saver:
        saved = main.build_graph(checkpointer=saver).get_state(main.thread_config(thread))
    assert saved.values["parsed"] == Question.read(FACTS)
    assert saved.values["answer"]["text"] == second["answer"]["text"]
    with main.open_checkpointer(settings.replace(checkpoints="off")) as saver:
        assert saver is None


def test_a_run_stopped_mid_research_resumes_from_its_last_checkpoint(tmp_settings, store):
    """Ctrl-C during the first application: `--resume ID` goes on from the last checkpoint, so
    classify and plan (and the searches) are not repeated, and the answer is the one an
    uninterrupted run gives.  A thread with nothing to continue is refused with one clear line."""
    replies = fact_replies()
    replies["apply"] = [KeyboardInterrupt(), *replies["apply"]]
    settings, script, ctx = _agent(tmp_settings, store, replies)
    with main.open_checkpointer(settings) as saver:
        stopped = main.run_agent(FACTS, context=ctx, checkpointer=saver, keep_on_interrupt=True)
        assert stopped["stop_reason"] == "interrupted"
        done = len(script.roles())
    with main.open_checkpointer(settings) as saver:  # as a later process resumes it
        resumed = main.resume_agent(stopped["thread_id"], context=ctx, checkpointer=saver)
        with pytest.raises(InputError, match="is finished"):
            main.resume_agent(stopped["thread_id"], context=ctx, checkpointer=saver)
        with pytest.raises(InputError, match="no run is kept on thread nope"):
            main.resume_agent("nope", context=ctx, checkpointer=saver)
    assert script.roles()[:done] == ["classify", "plan", "apply"]
    assert script.roles()[done:] == ["apply", "apply", "bottom_line"]
    fresh, *_ = run(tmp_settings, fact_replies())
    assert resumed["answer"]["text"] == fresh["answer"]["text"] and not resumed.get("error")


def test_ctrl_c_that_lands_while_a_step_ends_resumes_after_that_step(tmp_settings, store, request):
    """Ctrl-C reaches the CLI's main thread while LangGraph runs the answer stage in a worker,
    which ends and keeps its writes with no next checkpoint: `--resume` had refused the run as
    finished, and the answer computed was lost.  It now goes on from those writes."""
    import _thread
    import signal
    import time

    # Python's own Ctrl-C handler, as a terminal gives it: a shell's background job (`pytest &`)
    # starts with SIGINT ignored, and the simulated Ctrl-C would then do nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))

    replies = fact_replies()
    last = replies["apply"][-1]

    def interrupted(text: str) -> str:
        _thread.interrupt_main()  # the user's Ctrl-C, while this call ends
        time.sleep(1.0)  # time for the main thread to take it, even on a loaded machine
        return last

    replies["apply"][-1] = interrupted
    settings, script, ctx = _agent(tmp_settings, store, replies)
    with main.open_checkpointer(settings) as saver:
        stopped = main.run_agent(FACTS, context=ctx, checkpointer=saver, keep_on_interrupt=True)
        assert stopped["stop_reason"] == "interrupted"
        resumed = main.resume_agent(stopped["thread_id"], context=ctx, checkpointer=saver)
    fresh, *_ = run(tmp_settings, fact_replies())
    assert resumed["answer"]["text"] == fresh["answer"]["text"] and not resumed.get("error")


def test_a_question_on_a_thread_whose_last_run_stopped_says_to_resume_it_first(
    tmp_settings, tmp_path, store, monkeypatch, capsys
):
    """A follow-up asked after Ctrl-C started over as a new question: the stopped run's research
    was dropped, and "What if the restaurant had made the soup itself?" was declined as asking
    no question of law.  The CLI now says to resume the stopped run first."""
    replies = fact_replies()
    replies["apply"] = [KeyboardInterrupt(), *replies["apply"]]
    settings, script, ctx = _agent(tmp_settings, store, replies)
    with main.open_checkpointer(settings) as saver:
        tid = main.run_agent(FACTS, context=ctx, checkpointer=saver, keep_on_interrupt=True)[
            "thread_id"
        ]
    monkeypatch.setenv("CHECKPOINTS", store)
    monkeypatch.setenv("CHROMA_DIR", str(tmp_path / "chroma"))
    monkeypatch.setattr(main.rag_utils, "corpus_count", lambda settings: 1)
    monkeypatch.setattr(main, "_stream", lambda *a, **k: pytest.fail("a run started"))
    assert main.main(["--no-index", "-q", "--thread", tid, "What if he had looked?"]) == 2
    assert f"stopped before its end: go on with --resume {tid}" in capsys.readouterr().err


def test_a_run_stopped_at_the_letter_resumes_at_the_letter(tmp_settings, store):
    """The answer stage keeps its own checkpoints: Ctrl-C during a multiple-choice question's
    letter, after its research answer was written, resumes with the letter call alone."""
    replies = {**fact_replies(classify=[], bottom_line=[]), "mc_select": [KeyboardInterrupt()]}
    replies["mc_select"].append("**Answer: (B)**")
    research = tmp_settings.replace(answer_mode="research")
    settings, script, ctx = _agent(research, store, replies)
    with main.open_checkpointer(settings) as saver:
        stopped = main.run_agent(
            FACTS, CHOICES, context=ctx, checkpointer=saver, keep_on_interrupt=True
        )
        done = len(script.roles())
        assert stopped["stop_reason"] == "interrupted" and "Rule:" in stopped["answer"]["text"]
        resumed = main.resume_agent(stopped["thread_id"], context=ctx, checkpointer=saver)
    assert script.roles()[done - 1 :] == ["mc_select", "mc_select"]
    assert resumed["answer"]["letter"] == "B" and not resumed.get("error")
    assert resumed["answer"]["issues"] == stopped["answer"]["issues"]


# ------------------------------------------------------------------------------------------------
# Follow-ups and plan review: a thread's later questions build on its facts and research
# ------------------------------------------------------------------------------------------------


def tmp_path_of(settings) -> Path:
    return Path(settings.retrieval.chroma_dir).parent / "threads.sqlite"


WHAT_IF = "What if store employees met their duty to inspect with reasonable care?"
"""A follow-up on FACTS whose new fact bears on the negligence rule ("A store owes its invitees
reasonable care and a duty to inspect.") and not on comparative negligence's."""


def test_a_follow_up_reads_the_threads_facts_and_redoes_only_what_its_new_fact_bears_on(
    tmp_settings, monkeypatch, store
):
    """`main.py --thread ID "What if ...?"`: the thread's last question asked again on its facts
    and the new one (listed as stated later), with no classify or plan call, no search and no QA
    memory; the issue the new fact bears on is applied again, the other keeps its application."""
    monkeypatch.setattr(answer, "FACT_FIT", 0.2)  # the facts of LAW raise both its issues
    replies = fact_replies()
    replies["apply"] += [
        J(checks=[{"n": 1, "fact": 4, "met": "no"}, {"n": 2, "fact": 4, "met": "no"}])
    ]
    replies["bottom_line"] += [J(answer="no", conclusion=1)]
    settings, script, ctx = _agent(tmp_settings, store, replies)
    retriever = ctx.retrieve
    with main.open_checkpointer(settings) as saver:
        first = main.run_agent(FACTS, context=ctx, checkpointer=saver)
        searches, asked_first = len(retriever.calls), len(script.roles())
        ctx = dataclasses.replace(
            ctx, check_memory=lambda q: pytest.fail("a follow-up consulted the QA memory")
        )
        second = main.run_agent(
            WHAT_IF, context=ctx, checkpointer=saver, thread_id=first["thread_id"]
        )
    assert script.roles()[asked_first:] == ["apply", "bottom_line"]
    assert len(retriever.calls) == searches  # the thread's passages, not a new search
    new_fact = "Store employees met their duty to inspect with reasonable care."
    assert second["parsed"]["facts"] == [*first["parsed"]["facts"], new_fact]
    assert second["parsed"]["asked"] == "Is the store liable to Paula?"
    assert second["reading"]["follow_up"] == "hypothetical"
    assert f"F4.{answer.LATER_FACT} {new_fact}" in script.prompts("apply")[-1]
    assert second["answer"]["reused"] == ["Comparative negligence"]
    kept = [
        i["checks"] for i in second["answer"]["issues"] if i["issue"] == "Comparative negligence"
    ]
    assert kept == [
        i["checks"] for i in first["answer"]["issues"] if i["issue"] == "Comparative negligence"
    ]
    assert second["run_metrics"]["follow_up"] == "hypothetical"
    assert "skip: a follow-up" in next(
        e["decision"] for e in second["trace"] if e["node"] == "memory_writeback"
    )
    assert [t["question"] for t in second["turns"]] == [FACTS, WHAT_IF]
    # the CLI says the agenda is the thread's, and how to research another issue
    assert main._follow_up_note(second).startswith(
        "(A follow-up: 3 fact(s) from earlier on the thread; its issues again (Negligence; "
        "Comparative negligence): --issues 'A; B' researches others; the application of "
        "Comparative negligence is the thread's earlier one"
    )


def test_a_follow_up_applies_again_the_issue_its_question_names(tmp_settings, monkeypatch, store):
    """A user's "What if Dana had planned to keep the laptop?" kept larceny's earlier application
    because the embedder put the new fact nearer another issue's rule: an issue the question
    names ("Is Dana guilty of larceny?") is applied to the new facts whatever the embedder says."""
    monkeypatch.setattr(answer, "FACT_FIT", 0.2)  # the facts of LAW raise both its issues
    asks = FACTS.replace("Is the store liable to Paula?", "Does comparative negligence bar Paula?")
    replies = fact_replies()
    replies["apply"] += [J(checks=[{"n": 1, "fact": 4, "met": "no"}])] * 2
    replies["bottom_line"] += [J(answer="no", conclusion=1)]
    settings, script, ctx = _agent(tmp_settings, store, replies)
    with main.open_checkpointer(settings) as saver:
        first = main.run_agent(asks, context=ctx, checkpointer=saver)
        asked_first = len(script.roles())
        second = main.run_agent(
            WHAT_IF, context=ctx, checkpointer=saver, thread_id=first["thread_id"]
        )
    assert second["parsed"]["asked"] == "Does comparative negligence bar Paula?"
    assert script.roles()[asked_first:] == ["apply", "apply", "bottom_line"]
    assert second["answer"]["reused"] == []


def test_history_prints_a_threads_questions(tmp_settings, monkeypatch, capsys):
    settings, _, ctx = _agent(tmp_settings, str(tmp_path_of(tmp_settings)), fact_replies())
    with main.open_checkpointer(settings) as saver:
        thread = main.run_agent(FACTS, context=ctx, checkpointer=saver)["thread_id"]
    monkeypatch.setenv("CHECKPOINTS", settings.agent.checkpoints)
    assert main.main(["--thread", thread, "--history"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"1. {FACTS}\n   issues: Negligence; Comparative negligence\n   answer: ")
    # how the answer ended, not its first issue's heading ("1. Negligence")
    assert out.splitlines()[2].startswith("   answer: Bottom line: ")
    assert main.main(["--thread", "nope", "--history"]) == 2
    assert "no question has been answered on thread nope" in capsys.readouterr().err
    assert main.main(["--history"]) == 2


def test_a_question_on_a_thread_nothing_was_asked_on_says_it_is_no_follow_up(
    tmp_settings, monkeypatch, capsys
):
    """A mistyped --thread id answered "What if the offer had been revoked?" as a new question,
    with no word that the thread it named held nothing."""
    settings, _, ctx = _agent(tmp_settings, str(tmp_path_of(tmp_settings)), fact_replies())
    with main.open_checkpointer(settings) as saver:
        thread = main.run_agent(FACTS, context=ctx, checkpointer=saver)["thread_id"]
    monkeypatch.setenv("CHECKPOINTS", settings.agent.checkpoints)
    monkeypatch.setattr(main, "AgentContext", type("C", (), {"from_settings": staticmethod(id)}))
    monkeypatch.setattr(main.rag_utils, "corpus_count", lambda settings: 1)
    monkeypatch.setattr(main, "run_agent", lambda *a, **k: {"answer": {"text": "x [1]"}})
    for given, new in ((thread + "x", True), (thread, False)):
        assert main.main(["--no-index", "-q", "--thread", given, "What if it rained?"]) == 0
        said = f"thread: {given} is new (nothing was asked on it): not a follow-up"
        assert (said in capsys.readouterr().err) is new


def test_a_passed_over_doctrine_is_researched_on_the_thread_without_asking_again(
    tmp_settings, monkeypatch, capsys
):
    """An answer names the candidates it did not research and how to research one more on its
    thread: `--thread ID --issues "ITS ISSUES; NAME"` with no question asks the thread's last
    question again on that agenda (a user had to paste a blasting fact pattern again to research
    "Abnormally dangerous activities"), and the issues it researched before are neither searched,
    classified nor applied again (the hint once named the candidate alone, and the answer lost
    the thread's issues)."""
    replies = fact_replies(plan=[J(issues=["Negligence"])], apply=[APPLY, APPLY])
    replies = {role: queue * 3 if role != "plan" else queue for role, queue in replies.items()}
    # MAX_STEPS bounds new research: the issue the thread researched does not count
    one_step = tmp_settings.replace(max_steps=1)
    settings, script, ctx = _agent(one_step, str(tmp_path_of(tmp_settings)), replies)
    with main.open_checkpointer(settings) as saver:
        first = main.run_agent(FACTS, context=ctx, checkpointer=saver)
    main._print_result(first, print)
    thread, other = first["thread_id"], first["answer"]["others"][0]
    hint = f'(To research one more: --thread {thread} --issues "Negligence; {other}"'
    assert hint in capsys.readouterr().out
    asked_first = len(script.roles())
    monkeypatch.setattr(main, "AgentContext", type("C", (), {"from_settings": lambda s: ctx}))
    monkeypatch.setattr(main.rag_utils, "corpus_count", lambda settings: 1)
    monkeypatch.setenv("CHECKPOINTS", settings.agent.checkpoints)
    assert main.main(["-q", "--json", "--thread", thread, "--issues", f"Negligence; {other}"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["thread_id"] == thread and again["reading"]["agenda"] == ["Negligence", other]
    assert again["answer"]["reused"] == ["Negligence"]
    assert script.roles()[asked_first:] == ["apply", "bottom_line"]  # the new issue's only
    assert again["parsed"]["facts"] == first["parsed"]["facts"]
    assert again["parsed"]["asked"] == first["parsed"]["asked"]
    assert main.main(["--thread", "nope", "--issues", other]) == 2
    assert "no question has been answered on thread nope" in capsys.readouterr().err
    # A "What if" on the thread keeps its last agenda: the issue its first question researched is
    # no doctrine "not researched" (it was named so, in a user's landlord-tenant thread).
    with main.open_checkpointer(settings) as saver:
        what_if = main.run_agent(WHAT_IF, context=ctx, checkpointer=saver, thread_id=thread)
    assert what_if["reading"]["agenda"] == ["Negligence", other]
    assert not what_if["answer"]["abstained"] and "Negligence" not in what_if["answer"]["others"]


def test_the_hint_for_a_doctrine_whose_name_holds_a_semicolon_researches_that_doctrine():
    """A contracts answer hinted `--issues "Termination of offers; option contracts and firm
    offers"`, a passage title; --issues splits at ";", so pasting the hint researched two issues
    of the user's words.  The hint gives the name with a comma, which names the candidate, and so
    does the list of doctrines not researched, itself split by ";"."""
    name = "Termination of offers; option contracts and firm offers"
    lines: list[str] = []
    record = {"text": "1. Offer", "others": [name, "Mailbox rule"]}
    main._print_result({"thread_id": "t1", "parsed": {}, "answer": record}, lines.append)
    listed = "Other doctrines the sources hold, not researched: Termination of offers, option"
    assert f"{listed} contracts and firm offers; Mailbox rule." in "\n".join(lines)
    hint = next(line for line in lines if line.startswith("(To research one more:"))
    given = hint.split('--issues "')[1].split('"')[0]
    assert main.nodes.user_agenda(given.split(";"), ["Offer", name]) == [name]


def test_plan_review_pauses_after_the_planner_and_researches_the_agenda_the_user_sets(
    tmp_settings, store
):
    """`--review`: the run pauses (LangGraph's interrupt) with the agenda and the other candidates;
    the reply's numbers and names set the agenda, and only it is searched and applied.  On a
    server the same pause is resumed with ``Command(resume=...)``."""
    from langgraph.types import Command

    replies = fact_replies(apply=[COMPARE], bottom_line=[BOTTOM])
    settings, script, ctx = _agent(tmp_settings, store, replies)
    pauses: list[dict] = []

    def reply(pause: dict) -> str:
        pauses.append(pause)
        return "2"

    with main.open_checkpointer(settings) as saver:
        result = main.run_agent(FACTS, context=ctx, checkpointer=saver, review=reply)
    assert pauses[0]["agenda"] == ["Negligence", "Comparative negligence"]
    assert "Press Enter to keep the agenda" in pauses[0]["how"]
    assert result["reading"]["agenda"] == ["Comparative negligence"]
    assert [s["issue"] for s in result["planning_table"]] == ["Comparative negligence"]
    assert script.roles() == ["classify", "plan", "apply", "bottom_line"]
    review = next(e for e in result["trace"] if e["node"] == "review")
    assert "reviewed by the user: Comparative negligence" in review["decision"]

    # the server's way: the run ends paused, and a Command resumes it
    settings, script, ctx = _agent(tmp_settings, store, fact_replies())
    with main.open_checkpointer(settings) as saver:
        graph = main.build_graph(checkpointer=saver)
        config = {"configurable": {"thread_id": "t-review"}}
        paused = graph.invoke({"question": FACTS, "review": True}, config, context=ctx)
        assert paused["__interrupt__"][0].value["agenda"] == [
            "Negligence",
            "Comparative negligence",
        ]
        done = graph.invoke(Command(resume=""), config, context=ctx)  # Enter: the agenda kept
        assert done["reading"]["agenda"] == ["Negligence", "Comparative negligence"]
        assert not done["answer"]["abstained"] and done["review"] is False


def test_a_piped_review_reply_is_echoed_so_the_progress_starts_on_its_own_line(monkeypatch, capsys):
    """`printf '1; Mitigation of damages\\n' | main.py --review ...` printed the next progress line
    right after the "issues> " prompt."""
    import io

    monkeypatch.setattr(main.sys, "stdin", io.StringIO("1; Mitigation of damages\n"))
    pause = {"agenda": ["Landlord and tenant"], "candidates": ["Mitigation of damages"], "how": ""}
    assert main.ask_review(pause) == "1; Mitigation of damages"
    assert capsys.readouterr().err.endswith("issues> 1; Mitigation of damages\n")


def test_a_review_reply_names_issues_by_number_or_in_the_users_words():
    listed = ["Negligence", "Comparative negligence (Comparative fault)", "Conversion"]
    assert nodes.reviewed_agenda("", listed) == []
    assert nodes.reviewed_agenda(" 3 ; 1", listed) == ["Conversion", "Negligence"]
    assert nodes.reviewed_agenda("comparative negligence; Trespass to chattels; 9", listed) == [
        "Comparative negligence (Comparative fault)",
        "Trespass to chattels",
    ]
    assert nodes.reviewed_agenda({"issues": ["2"]}, listed) == [listed[1]]
    # "1" is the first listed item even where a later one is of the same doctrine (it was the later)
    same = ["Arrest", "Arrest (Exceptions to the warrant requirement)"]
    assert nodes.reviewed_agenda("1", same) == ["Arrest"]
    assert nodes.reviewed_agenda("2; 1", same) == [same[1], "Arrest"]
    assert nodes.reviewed_agenda("Arrest", same) == ["Arrest"]  # by name too


# ------------------------------------------------------------------------------------------------
# The store as the command line meets it
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path, monkeypatch) -> Path:
    """``main.main`` in this process with an index of one passage and a context it never uses
    (the checks tested here come first); CHECKPOINTS is the returned SQLite file."""
    monkeypatch.setattr(main.rag_utils, "corpus_count", lambda settings: 1)
    monkeypatch.setattr(main, "AgentContext", type("C", (), {"from_settings": staticmethod(id)}))
    monkeypatch.setenv("CHROMA_DIR", str(tmp_path / "chroma"))
    monkeypatch.setenv("CHECKPOINTS", str(tmp_path / "threads.sqlite"))
    return tmp_path / "threads.sqlite"


def test_a_postgres_server_that_cannot_be_reached_is_one_line_naming_it_without_password(
    cli_env, monkeypatch, capsys
):
    """Before any work (the index is not looked at), exit status 2, and the password stays out
    of the line."""
    url = f"postgresql://lra:s3cret@127.0.0.1:{_free_port()}/threads"  # nothing listens there
    monkeypatch.setenv("CHECKPOINTS", url)
    monkeypatch.setattr(main.rag_utils, "corpus_count", lambda settings: pytest.fail("indexed"))
    assert main.main(["--no-index", "What is negligence?"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s3cret" not in err[0], err
    assert err[0].startswith(
        f"main.py: error: CHECKPOINTS={url.replace('lra:s3cret', '***')}: cannot connect to the "
        "PostgreSQL server: connection failed:"
    )


def _stopped_thread(tmp_settings, store: str) -> str:
    """A run on ``store`` stopped by Ctrl-C in its first application: its thread's id."""
    replies = fact_replies(apply=[KeyboardInterrupt()], bottom_line=[])
    settings, _, ctx = _agent(tmp_settings, store, replies)
    with main.open_checkpointer(settings) as saver:
        stopped = main.run_agent(FACTS, context=ctx, checkpointer=saver, keep_on_interrupt=True)
    return stopped["thread_id"]


def test_a_thread_another_state_version_wrote_is_refused_with_one_line(
    tmp_settings, cli_env, monkeypatch, capsys
):
    """A thread kept by an older version: --resume and --thread say so in one line (exit 2)
    instead of running on a state this version would misread."""
    thread = _stopped_thread(tmp_settings, str(cli_env))
    now = main.STATE_VERSION
    monkeypatch.setattr(main, "STATE_VERSION", now + 1)
    line = (
        f"main.py: error: thread {thread} was written by an older version of LegalRagAgent "
        f"(state v{now}; this is v{now + 1}): start a new thread"
    )
    for args in (["--resume", thread], ["--thread", thread, "What is negligence?"]):
        assert main.main(["--no-index", *args]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [line]


def test_a_thread_of_this_version_loads_unless_its_question_does_not(tmp_settings, store):
    """A thread of this state version loads while its question reads back as a Question; one
    whose question comes back as the serializer's fallback (a dict: a Question of another shape)
    is refused.  One with no version recorded was written by v1, an older version."""
    with main.open_checkpointer(tmp_settings.replace(checkpoints=store)) as saver:
        graph = main.build_graph(checkpointer=saver)
        for thread, parsed in (("kept", Question.read(FACTS)), ("other", {"text": FACTS})):
            config = main.thread_config(thread)
            graph.update_state(config, {"question": FACTS, "parsed": parsed}, as_node="planner")
        assert main.thread_state(graph, main.thread_config("kept")).values["parsed"].text == FACTS
        with pytest.raises(InputError, match="thread other cannot be read: its question does not"):
            main.thread_state(graph, main.thread_config("other"))
        graph.update_state(
            {"configurable": {"thread_id": "v1"}}, {"question": FACTS}, as_node="planner"
        )
        with pytest.raises(InputError, match=r"older version of LegalRagAgent \(state v1;"):
            main.thread_state(graph, main.thread_config("v1"))


def test_a_checkpoint_that_does_not_load_is_one_line_and_exit_2(tmp_settings, cli_env, capsys):
    """A broken store (or one no version of LegalRagAgent wrote) stops --resume with one line
    naming the thread and what failed, not a traceback."""
    thread = _stopped_thread(tmp_settings, str(cli_env))
    with contextlib.closing(sqlite3.connect(cli_env)) as conn, conn:
        conn.execute("UPDATE checkpoints SET checkpoint = x'c1'")  # 0xc1: never valid msgpack
    assert main.main(["--no-index", "--resume", thread]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("): start a new thread"), err
    assert err[0].startswith(f"main.py: error: thread {thread} cannot be read (ValueError: ")


# ------------------------------------------------------------------------------------------------
# Reliability: processes sharing one SQLite store
# ------------------------------------------------------------------------------------------------


WRITER = """
import sys
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

import answer
import main
from settings import Settings

store, name, steps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


class Count(TypedDict):
    n: int


graph = StateGraph(Count)
graph.add_node("step", lambda state: {"n": state["n"] + 1})
graph.add_edge(START, "step")
graph.add_conditional_edges("step", lambda state: "step" if state["n"] < steps else END)
with main.open_checkpointer(Settings.from_env(env={}, checkpoints=store)) as saver:
    app = graph.compile(checkpointer=saver)
    print("ready", flush=True)
    sys.stdin.readline()  # both writers start together
    for i in range(threads):
        app.invoke({"n": 0}, main.thread_config(f"{name}-{i}") | {"recursion_limit": steps + 9})
"""
"""A process that checkpoints ``threads`` runs of a counting graph (``steps`` steps each) into
the SQLite ``store``, each on thread ``name-i``."""


def test_a_store_another_process_is_switching_to_wal_mode_is_waited_for():
    """Two runs opening a new store at once: SQLite answered the second's switch to WAL mode with
    "database is locked" at once (5 of 40 rounds of 4 processes), and that run failed."""

    class Busy:
        def __init__(self, fails: int, error: str = "database is locked") -> None:
            self.fails, self.error, self.calls = fails, error, 0

        def execute(self, sql: str) -> None:
            self.calls += 1
            if self.calls <= self.fails:
                raise sqlite3.OperationalError(self.error)

    conn = Busy(fails=3)
    main._wal_mode(conn)
    assert conn.calls == 4
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        main._wal_mode(Busy(fails=1000), wait=0.2)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        main._wal_mode(Busy(fails=1, error="disk I/O error"))  # not waited for


def test_two_processes_writing_one_sqlite_store_at_once_lose_nothing(tmp_path):
    """Two CLI runs (or an eval beside a run) checkpoint into one file at the same moment: a
    writer waits for the other's transaction instead of failing with "database is locked", and
    every checkpoint of both is kept."""
    steps, threads = 40, 15
    store = str(tmp_path / "threads.sqlite")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, store, name, str(steps), str(threads)],
                         env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for name in ("a", "b")
    ]  # fmt: skip
    for w in writers:
        assert w.stdout.readline() == "ready\n", w.communicate()[1]
    for w in writers:
        w.stdin.write("go\n")
        w.stdin.flush()
    for w in writers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err[-2000:]
    settings = main.Settings.from_env(env={}, checkpoints=store)
    with main.open_checkpointer(settings) as saver:
        for name in ("a", "b"):
            for i in range(threads):
                config = main.thread_config(f"{name}-{i}")
                assert saver.get_tuple(config).checkpoint["channel_values"]["n"] == steps
                assert len(list(saver.list(config))) == steps + 2  # the input, then each step


def test_a_what_if_asked_again_on_its_thread_does_not_state_its_fact_twice():
    """Asking "What if ...?" again (to set its issues with --issues) listed its new fact twice."""
    first = Question.read("Dan was arrested. The police searched his car. Was the search lawful?")
    what_if = "What if the police saw the drugs in plain view?"
    once = Question.read(what_if).after(first.facts, first.asked)
    again = Question.read(what_if).after(once.facts, once.asked)
    assert once.new_facts == ("The police saw the drugs in plain view.",)
    assert again.facts == once.facts and again.new_facts == ()
    assert again.asked == first.asked and again.hypothetical
