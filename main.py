"""LegalRagAgent: the research agent's graph and its command line.

    python main.py simple | multi_hop | medium     demo questions
    python main.py "What is adverse possession?"   any question (MC choices as "(A) ..." lines)
    python main.py - < question.txt                read the question from stdin
    python main.py --graph                         the graph as Mermaid
    python main.py --help                          every option and setting

Graph: detect_injection -> classifier -> planner -> executor <-> evaluator <-> replanner ->
answer -> mc_select -> memory_writeback -> observability.  Nodes live in ``nodes.py``, types in ``state.py``,
prompts in ``skills/*.md`` (loaded by ``prompts.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import re
import sqlite3
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from langgraph.errors import GraphRecursionError
from langgraph.types import Command
from pydantic_core import to_jsonable_python

import answer as answer_stage
import context
import filters
import load_corpus
import mc
import nodes
import providers
import rag_utils
from context import AgentContext
from llm_config import LLMCallError, LLMDeadlineError
from providers import LLMConfigError, check_config, check_reachable, install_log_redaction
from question import MAX_QUESTION_CHARS, InputError, Question, from_row, parse
from settings import SEARCH_TYPES, VARIABLES, Settings, SettingsError, load_dotenv_file, run_script
from state import STATE_VERSION, AgentState, AnswerStageInput, AnswerStageOutput

logger = logging.getLogger(__name__)

DEMOS: dict[str, str] = {
    "simple": "What are the elements of a negligence claim?",
    "multi_hop": (
        "A public university suspended a student for a speech at a campus rally in which she "
        "criticized the government on religious grounds, without giving her notice or a hearing. "
        "Which constitutional rights were violated, and what must she show for each claim?"
    ),
    "medium": "What must a party show to obtain a preliminary injunction?",
}


def build_answer_stage(context_schema: type | None = AgentContext) -> Any:
    """The answer stage, one node: the record, then a multiple-choice letter; nothing after it
    edits the record.  It outputs ``AnswerStageOutput``: the state would add the trace twice."""
    from langgraph.graph import START, StateGraph

    g = StateGraph(
        AgentState,
        context_schema=context_schema,
        input_schema=AnswerStageInput,
        output_schema=AnswerStageOutput,
    )
    g.add_sequence([("record", nodes.answer_node), ("letter", nodes.mc_select)])
    g.add_edge(START, "record")
    return g.compile()


def build_graph(
    answer_mode: str | None = None,
    *,
    context_schema: type | None = AgentContext,
    checkpointer: Any = None,
) -> Any:
    """A freshly compiled graph (nothing heavy happens here).  ``answer_mode``: None = the input's
    or ANSWER_MODE; ``context_schema`` None: the LangGraph server's (make_graph)."""
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(AgentState, context_schema=context_schema)
    for name in ("detect_injection", "classifier", "planner", "review", "executor"):
        g.add_node(name, getattr(nodes, name))
    g.add_node(
        "evaluator",
        nodes.make_evaluator(answer_mode),
        destinations=("executor", "replanner", "answer"),
    )
    g.add_node("replanner", nodes.replanner, destinations=("executor", "answer"))
    g.add_sequence(
        [
            ("answer", build_answer_stage(context_schema)),
            ("memory_writeback", nodes.memory_writeback),
            ("observability", nodes.observability),
        ]
    )
    g.add_edge(START, "detect_injection")
    g.add_conditional_edges("detect_injection", nodes.route_after_injection)
    g.add_conditional_edges("classifier", nodes.route_after_classifier)
    g.add_conditional_edges("planner", nodes.route_after_planner)
    g.add_edge("review", "executor")
    g.add_edge("executor", "evaluator")
    g.add_edge("observability", END)
    return g.compile(checkpointer=checkpointer)


@contextlib.contextmanager
def open_checkpointer(settings: Settings) -> Iterator[Any]:
    """CHECKPOINTS' store, open for the block: LangGraph's PostgreSQL saver for a postgresql:// URL
    (several machines can share it), else its SQLite saver; None when off."""
    store = settings.agent.checkpoints.strip()
    if store.lower() in ("", "off", "none", "0"):
        yield None
        return
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    types = [("question", "Question"), ("question", "StateLaw")]  # ours a checkpoint may load
    serde = JsonPlusSerializer(allowed_msgpack_modules=types)
    postgres = store.lower().startswith(("postgresql://", "postgres://"))
    opener = _open_postgres if postgres else _open_sqlite
    with opener(store, serde) as saver:
        saver.setup()
        yield saver


@contextlib.contextmanager
def _open_sqlite(path: str, serde: Any) -> Iterator[Any]:
    """A SQLite store several processes can write at once (two CLI runs, an eval beside a run):
    WAL mode, and a writer waits up to 30 s for another's transaction, not "database is locked"."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    file = Path(path).expanduser()
    file.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(file, timeout=30, check_same_thread=False)) as conn:
        _wal_mode(conn)
        yield SqliteSaver(conn, serde=serde)


def _wal_mode(conn: sqlite3.Connection, wait: float = 30.0) -> None:
    """WAL mode.  While another process switches a new file, SQLite says "database is locked" at
    once (the busy timeout does not cover it): retry for ``wait`` s (two runs starting together
    failed 1 time in 3 suites)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def _open_postgres(url: str, serde: Any) -> Iterator[Any]:
    """A PostgreSQL store on ``url``'s server; one that cannot be reached is a SettingsError (the
    URL without its password) before any work, after 10 s unless the URL sets connect_timeout."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.rows import dict_row

    try:  # the connection PostgresSaver.from_conn_string opens, which takes no serializer
        params = {"connect_timeout": 10, **conninfo_to_dict(url)}
        conn = psycopg.connect(**params, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    except psycopg.Error as exc:
        reason = providers.redact_urls_in_text(" ".join(str(exc).split()))
        raise SettingsError(
            f"CHECKPOINTS={providers.redact_url(url)}: cannot connect to the PostgreSQL server: "
            f"{reason}"
        ) from None
    with conn:
        yield PostgresSaver(conn, serde=serde)


def make_graph() -> Any:
    """Graph factory for ``langgraph dev``: the default context, which indexes the starter corpus
    into an empty store.  No context schema: LangGraph would build one from the server's ``{}``."""
    context.prepare_store = load_corpus.ensure_starter_index
    return build_graph(context_schema=None)


def make_evidence_graph() -> Any:
    """The same agent answering in evidence mode (langgraph.json's ``evidence_agent``)."""
    context.prepare_store = load_corpus.ensure_starter_index
    return build_graph("evidence", context_schema=None)


def recursion_limit(settings: Settings) -> int:
    """3 supersteps before the loop, 3 per executor iteration, 3 after, plus slack (the
    evaluator's iteration cap ends the loop long before)."""
    return 3 * int(settings.agent.max_iterations) + 10


def _jsonable(value: Any) -> Any:
    """``value`` in JSON types (dataclasses as dicts); a numpy number as its Python number."""
    return to_jsonable_python(value, fallback=lambda v: v.item() if hasattr(v, "item") else str(v))


def run_agent(
    question: str,
    choices: Mapping[str, str] | None = None,
    *,
    context: AgentContext,
    on_event: Callable[[dict], None] | None = None,
    keep_on_interrupt: bool = False,
    checkpointer: Any = None,
    thread_id: str | None = None,
    issues: Sequence[str] = (),
    review: Callable[[dict], Any] | None = None,
    resume_first: bool = False,
) -> dict:
    """Research ``question`` (``issues``: the agenda instead of the model's picks); the final state,
    JSON-able (``error``: why the run ended early, its research kept).  RUN_TIMEOUT starts now;
    ``on_event`` gets {node, decision, seconds, t_s} per node; ``keep_on_interrupt``: Ctrl-C ends
    the run like a failure.  A ``checkpointer`` keeps the run on ``thread_id`` (default: a new one),
    where a later question is a follow-up.  ``review(pause)`` returns the agenda after the planner.
    ``resume_first``: InputError, naming --resume, when the thread's last run stopped before its
    end (a new question would drop its research)."""
    if not (question or "").strip():  # Question.read normalizes its spaces
        raise InputError("the question is empty")
    if review is not None and checkpointer is None:
        raise InputError("plan review pauses the run on its thread: CHECKPOINTS is off")
    graph = build_graph(checkpointer=checkpointer)
    config: dict[str, Any] = {}
    if checkpointer is not None:
        config = thread_config(thread_id or uuid.uuid4().hex)
        if thread_id:  # a thread this version cannot go on with stops here
            saved = thread_state(graph, config)
            if resume_first and _unfinished(saved):
                raise InputError(
                    f"the last run on thread {thread_id} stopped before its end: go on with "
                    f"--resume {thread_id}, then ask on the thread"
                )
    parsed = Question.read(question, choices, context.state_law, issues)
    initial: AgentState = {
        "question": parsed.objective,
        "parsed": parsed,
        "answer_mode": context.settings.agent.answer_mode,
        "review": review is not None,
    }
    return _stream(graph, initial, config, context, initial, on_event, keep_on_interrupt, review)


def thread_config(thread_id: str) -> dict[str, Any]:
    """The config of a run on ``thread_id``; its metadata marks each checkpoint's state version."""
    return {"configurable": {"thread_id": thread_id}, "metadata": {"state_version": STATE_VERSION}}


def thread_state(graph: Any, config: dict[str, Any]) -> Any:
    """The state kept on ``config``'s thread (empty for a new one); InputError naming the thread
    when another state version wrote it or it does not load: a run would fail or misread it."""
    thread = config["configurable"]["thread_id"]
    try:
        saved = graph.get_state(config)
    except Exception as exc:  # noqa: BLE001 - whatever the store or the serializer raises
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # on one line
        raise InputError(f"thread {thread} cannot be read ({reason}): start a new thread") from None
    if not saved.values:
        return saved
    version = (saved.metadata or {}).get("state_version", 1)  # none recorded: v1
    if version != STATE_VERSION:
        older = isinstance(version, int) and version < STATE_VERSION
        raise InputError(
            f"thread {thread} was written by {'an older' if older else 'another'} version of "
            f"LegalRagAgent (state v{version}; this is v{STATE_VERSION}): start a new thread"
        )
    if not isinstance(saved.values.get("parsed"), Question):  # the serializer's fallback: a dict
        raise InputError(
            f"thread {thread} cannot be read: its question does not load as this version's "
            "(written by another version of LegalRagAgent?): start a new thread"
        )
    return saved


def resume_agent(
    thread_id: str,
    *,
    context: AgentContext,
    checkpointer: Any,
    on_event: Callable[[dict], None] | None = None,
    keep_on_interrupt: bool = False,
    review: Callable[[dict], Any] | None = None,
) -> dict:
    """Continue the run kept on ``thread_id`` (stopped, killed, or paused for ``review``) from its
    last checkpoint; InputError when the thread holds no run, a finished or unreadable one."""
    graph = build_graph(checkpointer=checkpointer)
    config = thread_config(thread_id)
    saved = thread_state(graph, config)
    if not saved.values:
        raise InputError(f"no run is kept on thread {thread_id}")
    if not _unfinished(saved):
        raise InputError(
            f"the run on thread {thread_id} is finished: ask a new question with --thread"
        )
    # a paused review node runs again up to its pause, which _stream hands to ``review``
    return _stream(graph, None, config, context, saved.values, on_event, keep_on_interrupt, review)


def _unfinished(saved: Any) -> bool:
    """Whether a thread's last run stopped before its end (or paused).  A step that ended as
    Ctrl-C reached the CLI has its writes kept but no checkpoint after them: LangGraph's ``next``
    is then empty, its task still listed, and the run goes on from those writes."""
    return bool(saved.next or saved.tasks)


def _stream(
    graph: Any,
    initial: AgentState | None,
    config: dict[str, Any],
    ctx: AgentContext,
    state: Mapping[str, Any],
    on_event: Callable[[dict], None] | None,
    keep_on_interrupt: bool,
    review: Callable[[dict], Any] | None = None,
) -> dict:
    """Run ``graph`` from ``initial`` (None: from the thread's last checkpoint, values ``state``) to
    its end or first failure: :func:`run_agent`'s result (``paused``: what no review answered)."""
    ctx.start_run()
    config["recursion_limit"] = recursion_limit(ctx.settings)
    state = {**state, "error": None}
    # A new question's state on a thread holds the last question's run until the first node has
    # reset it: a failure before then reports this run's input alone.
    current = not isinstance(initial, dict)
    # subgraphs: the answer stage's steps as they end, its record once written.  On a thread,
    # each step is on disk before the next starts: a killed run loses no completed node
    # (LangGraph's default writes while the next step runs, and a kill then lost the plan).
    options = {"context": ctx, "stream_mode": ["updates", "values"], "subgraphs": True}
    if "configurable" in config:
        options["durability"] = "sync"
    t0 = time.perf_counter()
    try:
        while True:
            paused = None
            for inside, mode, chunk in graph.stream(initial, config, **options):
                if mode == "values":
                    if not inside:
                        state = dict(chunk) if current else state
                    elif current:  # a letter whose call fails leaves the stage's record standing
                        state.update({k: v for k, v in chunk.items() if k != "trace"})
                    continue
                current = True
                paused = chunk["__interrupt__"][0].value if "__interrupt__" in chunk else paused
                for node, update in chunk.items():
                    if node == "__interrupt__" or (node == "answer" and not inside):
                        continue  # the stage's events came from inside it
                    events = (update or {}).get("trace", [])
                    for event in getattr(events, "value", events):  # an Overwrite's too
                        if on_event is not None:
                            on_event({**event, "t_s": round(time.perf_counter() - t0, 3)})
            if paused is None or review is None:
                state["paused"] = paused
                break
            initial = Command(resume=review(paused))
    except LLMDeadlineError as exc:  # RUN_TIMEOUT, not a failing model
        state = _partial(state, ctx, f"run deadline reached: {exc}")
    except (LLMCallError, LLMConfigError) as exc:
        state = _partial(state, ctx, f"LLM failure: {exc}")
    except GraphRecursionError as exc:
        state = _partial(state, ctx, f"graph recursion limit reached: {exc}")
    except KeyboardInterrupt:
        if not keep_on_interrupt:
            raise
        state = _partial(state, ctx, "interrupted (Ctrl-C)", "interrupted")
    state["wall_s"] = round(time.perf_counter() - t0, 3)
    if thread_id := config.get("configurable", {}).get("thread_id"):
        state["thread_id"] = thread_id
    return _jsonable(state)


def _partial(state: dict, ctx: AgentContext, message: str, reason: str = "") -> dict:
    """The run so far after a failure (``reason``: the stop_reason, else deadline or error)."""
    logger.info("run stopped early: %s", message)
    left = nodes.unresearched_issues(state)  # type: ignore[arg-type]
    found = [  # the research done before the failure: what each issue's search found
        f"{r.issue}: {', '.join(d['title'] for d in r.docs[:3])}"
        for r in nodes.issue_research(state, "")  # type: ignore[arg-type]
        if r.docs
    ]
    note = f" Found before it stopped: {'; '.join(found)}." if found else ""
    note += f" Not researched: {'; '.join(left)}." if left else ""
    state["error"] = message
    state["stop_reason"] = reason or ("deadline" if "deadline" in message.lower() else "error")
    if not (state.get("answer") or {}).get("text"):  # --json always carries the record
        text = f"[No answer — {message}]{note}"
        record = answer_stage.AnswerRecord.declined(state["parsed"].kind, text, message)
        state["answer"] = record.to_dict()
    state["run_metrics"] = nodes.compute_metrics(state, ctx)  # type: ignore[arg-type]
    return state


ENV_HELP = """\
settings (environment variables or .env; a flag above wins over its variable):
  LLM_PROVIDER            LLM provider (default: local = embedded Qwen2.5-Coder-1.5B, offline);
                          `python llm_config.py` lists them. Keys: GEMINI_API_KEY, GROQ_API_KEY, ...
  LLM_MODEL, LLM_BASE_URL, LLM_API_KEY   override the provider's model / endpoint / key
  LLM_PROVIDER_FAST, LLM_MODEL_FAST      provider/model for cheap calls (classify, rewrite, injection)
  LLM_TIMEOUT (0 = auto)  seconds per call attempt: auto = 300 for the embedded model and servers on
                          this machine, 60 for remote APIs
  RUN_TIMEOUT (600)       seconds a whole question may take (the run deadline); 0 = none
  LLM_MAX_RETRIES, LLM_TEMPERATURE, LLM_CACHE, LLM_CACHE_PATH, LLM_JSON_MODE (auto|schema|prompt)
  LEAN_GATE (0.33)        the evidence gate: a research step whose best passage (cosine to its issue)
                          is below it fails; a question whose every sentence is below it is off topic
  MAX_STEPS (3)           issues researched (one step each; the rest are named as not answered)
  MAX_ITERATIONS (6)      executor runs per question (hard cap)
  SKIP_INJECTION_CHECK    1 = skip the LLM injection check, 0 = run it (the pattern screens always
                          run); unset: skipped on the embedded model, run with an API model
  ANSWER_MODE (auto)      auto | research | evidence | lean (--mode); auto = lean with choices
  RESEARCH_POLICY (agenda) agenda | adaptive (--policy): the planner's issues, or the model's next
                          step after each step's findings
  SEARCH_STRATEGY (auto)  auto | dense | keyword | hybrid (--strategy)
  RETRIEVAL_K (5)         passages per research step
  MEMORY_THRESHOLD (0.92) cosine at which a cached answer (QA memory) is reused
  CHECKPOINTS             where the runs' threads are kept: a SQLite file
                          (~/.cache/legalragagent/checkpoints.sqlite), or a postgresql:// URL
                          (postgresql://user:password@host:5432/db) to use a PostgreSQL server; off = none
  CHROMA_DIR, CHROMA_HOST, CHROMA_PORT   vector store; EMBEDDING_MODEL (default all-MiniLM-L6-v2)
  RERANKER (auto|cross-encoder|hybrid|none), LOCAL_MODEL_DIR, LOCAL_THREADS, LOCAL_CTX_SIZE

input: at most {limit} characters of UTF-8 text; multiple-choice answers as lines "(A) ..." to
"(D) ..." after the question (2 to 4, in order; "A. ..." or "A) ..." lines too), or 3 to 4 inline
after it on one line. The starter index (datasets/starter) is built on first use when the store
is empty.

exit status: 0 answer printed; 1 run failed (LLM/provider error or RUN_TIMEOUT reached: the
partial research is printed); 2 bad input, a bad setting or an unusable provider configuration
(unknown provider, missing API key, embedded model not installed, RERANKER=cross-encoder with a
model that does not load), checked before any work: one line on stderr, nothing on stdout; 3 no
answer (the request was rejected as a prompt injection, or the answer abstained: the question is
off topic as asked, or no issue's research found a rule; "abstained": true and "why" in --json);
130 interrupted (Ctrl-C: the research so far is printed, as for a failed run). With --batch: 0
every question answered or declined, 1 one failed, 130 interrupted (run it again to go on).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="main.py",
        description="Agentic legal research: plans research steps, retrieves passages, answers "
        "per issue the rule quoted from its source ([N] citations), its application to the facts "
        "and a bottom line, and picks the answer of multiple-choice questions.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=ENV_HELP.format(limit=MAX_QUESTION_CHARS),
    )
    add, flag = parser.add_argument, functools.partial(parser.add_argument, action="store_true")
    add(
        "query",
        nargs="?",
        help="'simple', 'multi_hop' or 'medium' (demo questions: "
        + "; ".join(f"{k}: {v[:60]}..." for k, v in DEMOS.items())
        + "), a question in quotes, or '-' to read it from stdin",
    )
    flag("--json", help="print the whole result as JSON on stdout (progress still goes to stderr)")
    flag("--graph", help="print the graph as Mermaid and exit")
    flag(
        "--clear-memory",
        help="delete every cached answer of the QA memory (for the current embedding model), "
        "say how many, and exit",
    )
    add("--provider", dest="llm_provider", metavar="PROVIDER", help="LLM_PROVIDER for this run")
    add("--max-steps", type=int, help="MAX_STEPS for this run")
    add("--max-iterations", type=int, help="MAX_ITERATIONS for this run")
    add(
        "--mode",
        dest="answer_mode",
        choices=["auto", "research", "evidence", "lean"],
        help="ANSWER_MODE for this run: auto (default) = lean for a multiple-choice question, research for any other; research = the issues researched and applied to the facts ([N] citations); evidence = the same, "
        "each rule sentence first verified by the grounding gate (one more call per issue); lean "
        "(multiple choice only) = one retrieval, the LEAN_GATE on its evidence, one answer: at "
        "most 3 LLM calls",
    )
    add(
        "--policy",
        dest="research_policy",
        choices=["agenda", "adaptive"],
        help="RESEARCH_POLICY for this run: agenda (default) = the planner's issues, one step each, "
        "fixed before any search; adaptive = after each step the model reads the findings "
        "(evidence, passages, leads) and picks the next step, a retry or the end",
    )
    add(
        "--strategy",
        dest="search_strategy",
        choices=["auto", *SEARCH_TYPES],
        help="SEARCH_STRATEGY for this run: force one search type for every research step",
    )
    flag(
        "--show-memory",
        help="print the working memory (one line per research iteration: search type, results, "
        "leads, dead ends, next steps)",
    )
    add(
        "--deadline",
        dest="run_timeout",
        type=float,
        metavar="SECONDS",
        help="RUN_TIMEOUT for this run: the whole question must end within this many seconds "
        "(research stops early so a multiple-choice letter can still be picked; 0 = no limit)",
    )
    flag(
        "--skip-injection-check",
        default=None,
        help="skip the LLM injection check (SKIP_INJECTION_CHECK=1)",
    )
    flag("--no-index", help="do not build the starter index when the store is empty")
    add(
        "--issues",
        metavar="'A; B'",
        help="research these issues (doctrine names, separated by ';') instead of the ones the "
        "model picks: each is the candidate it names (--review lists them), else searched as "
        "written and as the taxonomy doctrine it names ('propensity' also searches 'Character "
        "evidence'; up to MAX_STEPS new ones; a multiple-choice question is then researched, not "
        "answered in lean mode); with --thread ID and no question, the thread's last question "
        "(an issue the thread researched is not searched again)",
    )
    add(
        "--resume",
        metavar="ID",
        help="continue the run kept on thread ID from its last checkpoint (one stopped by "
        "RUN_TIMEOUT, a failed call, Ctrl-C or a killed process); the nodes that completed are "
        "not run again",
    )
    add(
        "--thread",
        metavar="ID",
        help="keep this run on thread ID (the id another run printed; default: a new thread). "
        "Each run's state is checkpointed in CHECKPOINTS; a question on a thread is a follow-up: "
        "it is read after the thread's facts (a 'What if ...?' asks the last question again on "
        "its new fact), and reuses the research of the issues researched on it",
    )
    flag(
        "--review",
        help="pause after the planner: show the agenda and the other candidate issues, and read "
        "from stdin the issues to research (Enter keeps the agenda)",
    )
    flag("--history", help="with --thread ID: print the questions asked on the thread and exit")
    add(
        "--batch",
        metavar="FILE",
        help="answer every question of FILE, each on a new thread: JSON lines with a 'question' "
        "(and an 'id'), or text with the questions separated by blank lines (ids 1, 2, ...); each "
        "result is a line of --out as it ends, and the same command again skips the questions "
        "answered (not those that failed)",
    )
    add("--out", metavar="FILE", help="with --batch: where the results go (FILE.answers.jsonl)")
    flag("-q", "--quiet", help="do not stream the per-node progress lines")
    flag("-v", "--verbose", help="debug logging (and tracebacks on unexpected errors)")
    filters.add_arguments(parser)
    return parser


def read_input(query: str) -> str:
    """The question text: a demo name, '-' (stdin, strict UTF-8) or the argument itself."""
    if query in DEMOS:
        return DEMOS[query]
    if query == "-":
        try:
            return sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("stdin is not valid UTF-8 text") from None
    return query


LEAN_NEEDS_CHOICES = "--mode lean answers multiple-choice questions: give choices (A) ... (D)"


def read_batch(path: str, lean: bool = False) -> list[tuple[str, str]]:
    """The (id, question) pairs of a --batch file, each question checked as the CLI checks one,
    with its choices under ``lean`` (InputError names the file, the line or id, and what is
    wrong)."""
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--batch {path}: {exc}") from None
    items: list[tuple[str, str]] = []
    if path.endswith(".jsonl"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{n}: not a JSON line ({exc.msg})") from None
            if not isinstance(row, dict) or not str(row.get("question") or "").strip():
                raise InputError(f'{path}:{n}: a line needs a "question"')
            qid = row.get("id", row.get("idx", len(items) + 1))  # idx: Bar Exam QA's
            items.append((str(qid), from_row(row)))
    else:
        blocks = [b.strip() for b in re.split(r"\n\s*\n", text) if b.strip()]
        items = [(str(n), b) for n, b in enumerate(blocks, 1)]
        for qid, b in items:  # a question a line, with no blank line between: one question
            if (asks := sum(line.rstrip().endswith("?") for line in b.splitlines())) > 1:
                raise InputError(
                    f"--batch {path}, question {qid}: {asks} of its lines end in '?', as if each "
                    "were a question: separate questions with a blank line (or use JSON lines)"
                )
    if not items:
        raise InputError(f"--batch {path}: no question in it")
    for qid, count in Counter(i for i, _ in items).items():
        if count > 1:
            raise InputError(f"--batch {path}: the id {qid!r} is given {count} times")
    for qid, q in items:
        try:
            if not parse(q)[1] and lean:
                raise InputError(LEAN_NEEDS_CHOICES)
        except InputError as exc:
            raise InputError(f"--batch {path}, question {qid}: {exc}") from None
    return items


def outcome(result: dict) -> str:
    """How a run ended, as the CLI's exit status says: interrupted (130), failed (1), no_answer
    (3: an injection, or it abstained or wrote nothing to show) or answered (0)."""
    record = result.get("answer") or {}
    if result.get("stop_reason") == "interrupted":
        return "interrupted"
    if result.get("error"):
        return "failed"
    shown = answer_stage.AnswerRecord.shown(record) and not record.get("abstained")
    return "answered" if shown else "no_answer"


def _answered(lines: str, out: Path, items: Sequence[tuple[str, str]]) -> set[str]:
    """The ids of ``items`` whose last line in ``lines`` (``out``'s text) did not fail (a question
    asked again under the same id is InputError: the file belongs to another batch)."""
    asked = dict(items)
    last: dict[str, dict] = {}
    for line in lines.splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line a killed run cut short
            row = json.loads(line)
            last[str(row.get("id"))] = row
    for qid, row in last.items():
        if qid in asked and row.get("question") != asked[qid]:
            raise InputError(f"{out} holds another question under the id {qid}: give a new --out")
    return {qid for qid, row in last.items() if qid in asked and row.get("status") != "failed"}


def run_batch(
    args: argparse.Namespace, items: list[tuple[str, str]], settings: Settings, checkpointer: Any
) -> int:
    """Each question of ``items`` not yet in --out, appended to it as it ends (what --json prints,
    with ``id`` and ``status``: answered, no_answer or failed); exit status 1 when one failed."""
    out = Path(args.out or Path(args.batch).with_suffix(".answers.jsonl"))
    try:
        sink = out.open("a", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--out {out}: {exc.strerror or exc}") from None
    with sink:
        lines = out.read_text("utf-8")
        done = _answered(lines, out, items)
        todo = [(qid, q) for qid, q in items if qid not in done]
        say = functools.partial(print, file=sys.stderr, flush=True)
        say(
            f"batch: {len(items)} question(s), {len(done)} already answered in {out}; {len(todo)} to go"
        )
        ctx = AgentContext.from_settings(settings)
        failed = 0
        if lines and not lines.endswith("\n"):
            sink.write("\n")  # after a line a killed run cut short
        for n, (qid, q) in enumerate(todo, 1):
            result = run_agent(
                *parse(q), context=ctx, checkpointer=checkpointer, keep_on_interrupt=True
            )
            if (status := outcome(result)) == "interrupted":
                say(f"main.py: interrupted at question {qid}; the same command goes on from it")
                return 130
            failed += status == "failed"
            record = result.get("answer") or {}
            row = {"id": qid, "question": q, "status": status, **result}
            print(json.dumps(row, ensure_ascii=False), file=sink, flush=True)
            letter = f" ({record['letter']})" if record.get("letter") else ""
            if not args.quiet:
                say(f"[{n}/{len(todo)}] {qid}: {status}{letter} in {result.get('wall_s', 0):.1f}s")
    say(f"batch: {len(todo) - failed} of {len(todo)} done, {failed} failed; results in {out}")
    return 1 if failed else 0


def _unnamed_candidates(result: dict) -> bool:
    """Whether the planner listed candidates a fact pattern's answer neither researched nor quoted
    (:func:`nodes.left_off`, the test the named ones pass), none of which it named (never when the
    user set or reviewed the agenda, on a follow-up, or when it abstained)."""
    reading, parsed = result.get("reading") or {}, result.get("parsed") or {}
    record = result.get("answer") or {}
    if record.get("abstained") or record.get("others") or parsed.get("issues"):
        return False
    if not parsed.get("facts") or reading.get("follow_up") or reading.get("review"):
        return False
    quoted = {mc.doctrine_key(c["title"]) for c in record.get("citations") or []}
    return bool(
        nodes.left_off(reading.get("agenda") or [], reading.get("candidates") or [], quoted)
    )


def _print_result(result: dict, out: Callable[[str], None]) -> None:
    out("")
    out("=" * 78)
    parsed = result.get("parsed") or {}
    out(f"QUESTION: {parsed.get('text')}")
    for letter, text in (parsed.get("choices") or {}).items():
        out(f"  ({letter}) {text}")
    out("=" * 78)
    if saved := nodes.recalled(result):  # type: ignore[arg-type]
        out(
            f'(From the QA memory: the answer saved for "{saved.get("question")}", similarity '
            f"{saved.get('similarity') or 0:.2f}; `python main.py --clear-memory` forgets saved "
            "answers.)"
        )
    record = result.get("answer") or {}
    if note := _follow_up_note(result):
        out(note)
    if within := (result.get("reading") or {}).get("within"):
        out(f"(Searched {within} law only: the question asks what it provides.)")
    out(answer_stage.AnswerRecord.shown(record) or "(no answer)")
    if others := record.get("others"):
        on = f"--thread {result['thread_id']}" if result.get("thread_id") else "ask again with"
        # the issues answered and one more: on the thread, those it researched are not searched
        # or applied again (the hint's one name alone had dropped them from the answer)
        agenda = (result.get("reading") or {}).get("agenda") or []
        kept = [
            i["issue"]
            for i in record.get("issues") or []
            if i["issue"] in agenda and i["status"] == "answered"
        ]
        # --issues splits at ";": a name with one ("Termination of offers; option contracts and
        # firm offers") is given with a comma, which names the same candidate (mc.doctrine_key)
        names = "; ".join(n.replace(";", ",") for n in [*kept, others[0]])
        out(f'(To research one more: {on} --issues "{names}"; --review to pick.)')
    elif _unnamed_candidates(result):
        # none near enough the facts to be named, but the 1.5B's picks are often not the doctrine:
        # a dog that had bitten before got causation, its first candidate animal liability unnamed
        out("(The planner's other candidates are far from the stated facts; --review lists them.)")
    if flagged := result.get("flagged_passages"):
        ids = ", ".join(f["id"] for f in flagged[:5]) + (", ..." if len(flagged) > 5 else "")
        out(
            f"(Left out: {len(flagged)} passage(s) whose text gives instructions to an AI, a "
            f"possible prompt injection: {ids}.)"
        )
    if record.get("citations"):
        out("")
        out("SOURCES")
        for line in answer_stage.render_sources(record["citations"]):
            out(f"  {line}")
    if record.get("quotes"):  # the evidence policy's grounding gate
        verdicts = Counter(q["verdict"] for q in record["quotes"])
        out("")
        counts = ", ".join(f"{v} {n}" for v, n in verdicts.most_common())
        out(f"GROUNDING GATE: {counts} (candidate rule sentences judged; verified ones quoted)")
    if metrics := result.get("run_metrics") or {}:
        out("")
        out("METRICS")
        keys = (
            "llm_calls", "parse_failures", "input_tokens", "output_tokens",
            "iterations", "steps_completed", "steps_failed", "memory_hit", "abstained", "verdict",
            "injection_verdict", "stop_reason", "uncited_sentences", "guards", "mc_letter", "mc_closed_book",
        )  # fmt: skip
        for key in keys:  # a field with no value (no letter, no verdict) is not printed
            value = metrics.get(key)
            if key == "guards":
                value = ", ".join(f"{k} {n}" for k, n in (value or {}).items() if n) or "none fired"
            if value is not None:
                out(f"  {key}: {value}")
        out(f"  wall_s: {result.get('wall_s')}")
        lat = metrics.get("node_latency_s") or {}
        out("  node_latency_s: " + ", ".join(f"{k} {v:.2f}" for k, v in lat.items()))


def ask_review(pause: dict) -> str:
    """The plan review's question on stderr, the user's reply from stdin ("" at its end)."""
    agenda, others = pause.get("agenda") or [], pause.get("candidates") or []
    lines = ["", "PLAN REVIEW: the issues to research"]
    lines += [f"  {n}. {issue}" for n, issue in enumerate(agenda, 1)]
    if others:
        lines.append("other candidates:")
        lines += [f"  {n}. {c}" for n, c in enumerate(others, len(agenda) + 1)]
    lines.append(pause.get("how") or "")
    print("\n".join(lines), file=sys.stderr)
    print("issues> ", end="", file=sys.stderr, flush=True)
    reply = sys.stdin.readline().strip()
    if not sys.stdin.isatty():  # a piped reply echoes nothing: the progress goes on below it
        print(reply, file=sys.stderr)
    return reply


def print_history(turns: list[dict], out: Callable[[str], None]) -> None:
    """The questions asked on a thread, each with its agenda and its answer's bottom line (or its
    first line: "1. Seller's remedies under the UCC" said nothing of how it ended)."""
    for n, turn in enumerate(turns, 1):
        record = turn.get("answer") or {}
        said = [
            s["text"]
            for i in record.get("issues") or []
            for s in i.get("sentences") or []
            if s.get("role") == "bottom_line"
        ]
        shown = f"Bottom line: {said[0]}" if said else answer_stage.AnswerRecord.shown(record)
        first = (shown or "(no answer)").splitlines()[0]
        out(f"{n}. {turn.get('question')}")
        out(f"   issues: {'; '.join(turn.get('issues') or []) or 'none'}")
        out(f"   answer: {first}")


def _follow_up_note(result: dict) -> str:
    """What a follow-up took from its thread, in one line ("" for a thread's first question)."""
    parsed, record = result.get("parsed") or {}, result.get("answer") or {}
    reading = result.get("reading") or {}
    if not reading.get("follow_up"):
        return ""
    note = f"(A follow-up: {len(parsed.get('earlier') or [])} fact(s) from earlier on the thread"
    if reading.get("agenda_kept") and not reading.get("review"):  # the planner kept the agenda
        note += f"; its issues again ({'; '.join(reading.get('agenda') or [])}): --issues 'A; B'"
        note += " researches others"
    if reused := record.get("reused"):
        note += (
            f"; the application of {'; '.join(reused)} is the thread's earlier one: no new fact"
            " bears on its rule"
        )
    return note + ".)"


def _ensure_index(settings: Settings) -> None:
    if added := load_corpus.ensure_starter_index(settings):
        print(f"built the starter index: {added} passages", file=sys.stderr)


def thread_turns(checkpointer: Any, thread: str) -> list[dict]:
    """The questions answered on ``thread`` ([] for a new one; InputError when unreadable)."""
    saved = thread_state(build_graph(checkpointer=checkpointer), thread_config(thread))
    return (saved.values or {}).get("turns") or []


def _turns(checkpointer: Any, thread: str, flag: str) -> list[dict]:
    """The questions answered on ``thread`` (InputError when none was: ``flag`` needs one)."""
    if checkpointer is None:
        raise InputError(f"{flag} reads the checkpoint store: CHECKPOINTS is off")
    if not (turns := thread_turns(checkpointer, thread)):
        raise InputError(f"no question has been answered on thread {thread}")
    return turns


def _error(message: object, status: int = 2) -> int:
    """Print the first line of ``main.py: error: message`` on stderr; return ``status``."""
    print(f"main.py: error: {message}".splitlines()[0], file=sys.stderr)
    return status


def _index_problem(args: argparse.Namespace, settings: Settings) -> str | None:
    """Why no run can start (no passage indexed for this embedding model, or none the filters
    allow), before any model call; an empty store gets the starter index first (not --no-index)."""
    if not args.no_index:
        _ensure_index(settings)
    if rag_utils.corpus_count(settings) == 0:
        where = settings.retrieval.chroma_host or settings.retrieval.chroma_dir
        return (
            f"no passages are indexed for the embedding model "
            f"{rag_utils.embedder_name(settings)} in {where}: run `python load_corpus.py "
            "starter` (or load your own), or drop --no-index"
        )
    flt = filters.passage_filter(settings)
    if flt and not rag_utils.get_store(settings).allowed_ids(flt):
        return (
            f"no indexed passage matches the passage filters ({flt.describe()}): "
            "`python load_corpus.py status` shows what is indexed"
        )
    return None


def _print_event(event: dict) -> None:
    """A node's progress line on stderr."""
    line = f"{event['node']:<16} {event['decision']} ({event['seconds']:.1f}s)"
    print(f"[{event['t_s']:7.1f}s] {line}", file=sys.stderr, flush=True)


def _answer(
    args: argparse.Namespace,
    settings: Settings,
    checkpointer: Any,
    question: str,
    choices: Mapping[str, str] | None,
) -> dict:
    """``question`` on a new thread or on --thread, or the stopped run of --resume.  A new
    thread's id is printed first, so that a killed run can be resumed (--thread's is the user's)."""
    run: dict[str, Any] = {
        "context": AgentContext.from_settings(settings),
        "checkpointer": checkpointer,
        "on_event": None if args.quiet else _print_event,
        "keep_on_interrupt": True,
    }
    if args.resume:
        if checkpointer is None:
            raise InputError("--resume needs the checkpoint store: CHECKPOINTS is off")
        return resume_agent(args.resume, review=ask_review, **run)
    thread = args.thread or uuid.uuid4().hex
    if checkpointer is not None and not args.thread:
        print(f"thread: {thread}", file=sys.stderr, flush=True)
    elif checkpointer is not None and not thread_turns(checkpointer, thread):
        # a mistyped id starts a thread: its question is no follow-up
        print(f"thread: {thread} is new (nothing was asked on it): not a follow-up",
              file=sys.stderr, flush=True)  # fmt: skip
    issues = (args.issues or "").split(";")
    review = ask_review if args.review else None
    return run_agent(
        question, choices, thread_id=thread, issues=issues, review=review, resume_first=True, **run
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(  # on stderr
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    install_log_redaction()  # request URLs in debug logs lose any user:password / ?key=
    if args.graph:
        print(build_graph().get_graph(xray=True).draw_mermaid())
        return 0
    if args.clear_memory:
        if args.query is not None:
            return _error("--clear-memory forgets every saved answer; give it no question")
        try:
            load_dotenv_file()
            n = rag_utils.clear_memory(Settings.from_env())
        except SettingsError as exc:
            return _error(exc)
        print(f"cleared the QA memory: {n} cached answer(s) deleted")
        return 0
    if args.history and (not args.thread or args.query is not None or args.resume):
        return _error("--history prints a thread's questions: give --thread ID and no question")
    if args.review and args.query == "-":
        return _error("--review reads its reply from stdin: give the question as an argument")
    batch_with = [f for f in ("thread", "resume", "review", "history", "issues", "json") if
                  getattr(args, f)]  # fmt: skip
    if args.batch and (args.query is not None or batch_with):
        extra = f"--{batch_with[0]}" if batch_with else "question"
        return _error(f"--batch answers the questions of its file: give it no {extra}")
    if args.out and not args.batch:
        return _error("--out names where --batch writes its results: give --batch FILE")
    again = args.thread and args.issues and args.query is None  # the last question, on them
    if args.query is None and not (args.resume or args.history or again or args.batch):
        parser.print_usage(sys.stderr)
        return _error("give a question, a demo name (simple, multi_hop, medium) or '-'")
    if args.resume and (args.query is not None or args.thread):
        return _error("--resume ID continues a stopped run: give it no question and no --thread")
    try:
        question, choices = parse(read_input(args.query)) if args.query else ("", None)
        load_dotenv_file()
        flags = {k: v for k, v in vars(args).items() if k in VARIABLES}  # dest: the setting
        settings = Settings.from_env(**flags, **filters.overrides(args))
        filters.passage_filter(settings)  # a bad filter value stops here
        if args.answer_mode == "lean" and args.issues:
            raise InputError("--mode lean does no research: --issues needs --mode auto or research")
        items = read_batch(args.batch, args.answer_mode == "lean") if args.batch else []
        if args.answer_mode == "lean" and not (choices or items):
            raise InputError(LEAN_NEEDS_CHOICES)
        check_config(settings)  # every role's provider, before the index or any model loads
        check_reachable(settings)  # a server on this machine that is not running
        rag_utils.require_reranker(settings)  # a missing model stops here, not mid-research
    except (InputError, SettingsError, LLMConfigError, rag_utils.ModelLoadError) as exc:
        return _error(exc)

    try:
        with open_checkpointer(settings) as checkpointer:  # an unreachable server stops here
            if args.history:  # the thread's questions (exit 2 when it holds none)
                turns = _turns(checkpointer, args.thread, "--history")
                if args.json:
                    print(json.dumps(_jsonable(turns), indent=2, ensure_ascii=False))
                else:
                    print_history(turns, print)
                return 0
            if problem := _index_problem(args, settings):
                return _error(problem)
            if items:
                return run_batch(args, items, settings, checkpointer)
            if again:
                last = _turns(checkpointer, args.thread, "--thread ID --issues")[-1]["question"]
                question, choices = parse(last)
            result = _answer(args, settings, checkpointer, question, choices)
    except (InputError, SettingsError) as exc:
        return _error(exc)
    except KeyboardInterrupt:
        print("main.py: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI never shows a traceback unless asked
        if args.verbose:
            logger.exception("unexpected failure")
        return _error(f"{type(exc).__name__}: {exc}", 1)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        _print_result(result, print)
        if args.show_memory:
            print("\nWORKING MEMORY")
            print(nodes.memory_lines(result) or "  (no research iterations)")
    # the run is kept on its thread: it can go on from its last completed step
    tid = result.get("thread_id")
    resume = f"; to go on from where it stopped: python main.py --resume {tid}" if tid else ""
    status = outcome(result)
    if status == "interrupted":
        print(f"main.py: interrupted{resume}", file=sys.stderr)
        return 130
    if status == "failed":
        return _error(str(result["error"]).splitlines()[0] + resume, 1)
    metrics = result.get("run_metrics") or {}
    if (bad := metrics.get("parse_failures") or 0) >= max(2, (metrics.get("llm_calls") or 0) / 2):
        print(
            f"main.py: warning: {bad} of {metrics['llm_calls']} model replies were not the JSON "
            "asked for, and the answer rests on fallbacks: does this model follow JSON "
            "instructions? (`python llm_config.py` lists the providers)",
            file=sys.stderr,
        )
    if status == "no_answer":
        why = result.get("stop_reason") or "the research produced no usable answer"
        letter = (result.get("answer") or {}).get("letter")
        tail = f"; the letter ({letter}) is the model's closed-book pick" if letter else ""
        print(f"main.py: no answer ({why}){tail}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    run_script(main)
