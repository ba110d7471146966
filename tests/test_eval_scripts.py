"""The three eval scripts end to end on small fixtures, with a fake LLM and a temporary Chroma.

The fake is a scripted 'reader': it answers a fixture question correctly only when that
question's gold passage is in its prompt, so each mode's accuracy shows which evidence it got.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from fakes import Script, ScriptedChat
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult

import eval_common
import eval_comprehensive
import eval_reranker
import eval_trace
import load_corpus
import rag_utils
from llm_config import LLMClient
from settings import Settings

FIXTURES = Path(__file__).resolve().parent / "fixtures"
QA = FIXTURES / "eval_qa.jsonl"
PASSAGES = FIXTURES / "eval_passages.jsonl"
LETTERS = "ABCD"
SECRET = "sk-test-never-written-0123456789"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


QA_ROWS = _rows(QA)
PASSAGE_ROWS = {p["idx"]: p for p in _rows(PASSAGES)}
INDEXED_ITEMS = [q for q in QA_ROWS if q["gold_idx"] in PASSAGE_ROWS]  # evq_7's gold is absent


def _fill(schema: dict, defs: dict) -> Any:
    """A minimal valid instance of a JSON schema (structured-output calls of the agent)."""
    if "$ref" in schema:
        return _fill(defs[schema["$ref"].split("/")[-1]], defs)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return _fill(options[0], defs)
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return {k: _fill(v, defs) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        item = schema.get("items", {"type": "string"})
        return [_fill(item, defs) for _ in range(max(1, schema.get("minItems", 1)))]
    if kind == "string":
        return "battery intent contact"
    if kind == "integer":
        return max(1, schema.get("minimum", 1))
    if kind == "number":
        return 0.5
    if kind == "boolean":
        return False
    return None


class ReaderFake(BaseChatModel):
    """Answers 'Answer: <gold letter>' when the item's gold passage is in the prompt, else the
    next (wrong) letter; structured calls get a minimal instance of the requested schema."""

    calls: Any = None
    lock: Any = None
    fail_after: int | None = None
    down: bool = False  # every call fails, as an API that is down

    @property
    def _llm_type(self) -> str:
        return "reader-fake"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        # the client sends JSON-schema mode's response_format in the request body (extra_body)
        fmt = kwargs.get("response_format") or (kwargs.get("extra_body") or {}).get(
            "response_format"
        )
        with self.lock:
            if self.fail_after is not None and len(self.calls) >= self.fail_after:
                raise KeyboardInterrupt  # the user pressing Ctrl-C mid-run
            if self.down:
                raise RuntimeError("the API is down")
            self.calls.append(fmt is not None)
        text = "\n".join(str(m.content) for m in messages)
        if fmt is not None:
            schema = fmt["json_schema"]["schema"]
            reply = json.dumps(_fill(schema, schema.get("$defs", {})))
        else:
            reply = _answer(text)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=reply))])


def _answer(prompt: str) -> str:
    for item in QA_ROWS:
        if item["question"][:60] in prompt:
            gold = PASSAGE_ROWS.get(item["gold_idx"])
            if gold is not None and gold["text"][:60] in prompt:
                return f"Answer: {item['answer']}"
            return f"Answer: {LETTERS[(LETTERS.index(item['answer']) + 1) % 4]}"
    return "Answer: A"


def reader(fail_after: int | None = None, down: bool = False) -> tuple[Any, list]:
    calls: list = []
    lock = threading.Lock()

    def factory(role: str) -> ReaderFake:
        return ReaderFake(calls=calls, lock=lock, fail_after=fail_after, down=down)

    return factory, calls


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Scripts build their settings from the environment: point them at tmp_path."""
    monkeypatch.chdir(tmp_path)  # no .env, results and case studies below tmp_path
    for var in ("LLM_PROVIDER", "LLM_MODEL", "LLM_BASE_URL", "RERANKER", "LLM_PROVIDER_FAST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CHROMA_DIR", str(tmp_path / "chroma"))
    monkeypatch.setenv("LLM_CACHE_PATH", str(tmp_path / "llm_cache.sqlite"))
    monkeypatch.setenv("LLM_API_KEY", SECRET)
    yield tmp_path


def comprehensive(args: list[str], factory: Any, tmp: Path) -> int:
    base = ["--qa", str(QA), "--passages", str(PASSAGES), "--results-dir", str(tmp / "res")]
    return eval_comprehensive.main([*args, *base], llm_factory=factory)


def _read_rows(tmp: Path, run_id: str) -> list[dict]:
    return _rows(tmp / "res" / run_id / "results.jsonl")


# ------------------------------------------------------------------------------------------------
# CLI parsing (fast)
# ------------------------------------------------------------------------------------------------


def test_positional_phase_and_n_in_any_order():
    a = eval_comprehensive.parse_args(["20"])
    assert (a.phase, a.n) == ("both", 20)
    a = eval_comprehensive.parse_args(["retrieval", "5", "--modes", "rag,llm_only"])
    assert (a.phase, a.n, a.mode_list) == ("retrieval", 5, ["rag", "llm_only"])


@pytest.mark.parametrize("argv", [["bogus"], ["--modes", "oracle"], ["--workers", "0"]])
def test_bad_arguments_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        eval_comprehensive.parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        (eval_comprehensive, []),
        (eval_comprehensive, ["answers"]),
        (eval_comprehensive, ["injection"]),
        (eval_trace, []),
        (eval_reranker, []),
    ],
)
def test_help(module, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        module.main([*argv, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage" in out
    assert "%%" not in out  # a description is printed as written, not %-formatted


def test_help_names_every_phase_with_flags_its_own_parser_accepts(capsys):
    with pytest.raises(SystemExit):
        eval_comprehensive.main(["--help"])
    out = capsys.readouterr().out
    ec = eval_comprehensive
    assert list(ec.PHASES) == [*ec.MC_PHASES, *ec.SUBCOMMANDS]  # every phase main dispatches
    parsers = {"answers": ec.build_answers_parser(), "injection": ec.build_injection_parser()}
    for phase, (flags, measures) in ec.PHASES.items():
        assert f"  {phase} {flags}\n      {measures}\n" in out
        known = parsers.get(phase, ec.build_parser())._option_string_actions
        for flag in re.findall(r"--[a-z][a-z-]*", flags):
            assert flag in known, (phase, flag)
    assert "answers [N] [--facts] [--split tune|report|all] [--modes research,evidence" in out


def test_a_subcommand_after_another_argument_is_a_usage_error_that_says_where_it_goes(capsys):
    with pytest.raises(SystemExit) as exc:
        eval_comprehensive.parse_args(["5", "answers"])
    assert exc.value.code == 2
    assert "answers must be the first argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        (eval_comprehensive, ["pipeline", "1", "--modes", "llm_only"]),
        (eval_comprehensive, ["retrieval", "1", "--rewrite"]),
        (eval_trace, ["1"]),
        (eval_trace, []),
    ],
)
@pytest.mark.parametrize(
    ("provider", "message"),
    [
        ("groq", "error: LLM_PROVIDER=groq needs an API key: set GROQ_API_KEY"),
        ("gemma-nope", "error: LLM_PROVIDER='gemma-nope' is not a known provider"),
    ],
)
def test_provider_configuration_error_is_one_line_exit_2_and_no_output(
    module, argv, provider, message, env, monkeypatch, capsys
):
    monkeypatch.delenv("LLM_API_KEY")
    monkeypatch.delenv("GROQ_API_KEY", raising=False)
    monkeypatch.setenv("LLM_PROVIDER", provider)
    assert module.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message)
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    assert "Traceback" not in captured.err and not (env / "eval_results").exists()
    assert not (env / "chroma").exists()  # checked before any work


def test_bad_setting_is_a_one_line_error(env, monkeypatch, capsys):
    monkeypatch.setenv("RERANKER", "colbert")
    assert eval_reranker.main([]) == 2
    assert capsys.readouterr().err.startswith("error: RERANKER='colbert'")


# ------------------------------------------------------------------------------------------------
# eval_comprehensive
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_modes_get_the_evidence_they_claim_and_rerun_costs_no_calls(env, capsys):
    factory, calls = reader()
    modes = "llm_only,rag,gold_passage"
    rc = comprehensive(["both", "--modes", modes, "--run-id", "first", "--json"], factory, env)
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    n = len(INDEXED_ITEMS)
    assert summary["config"]["n_items"] == n  # the item whose gold is not indexed is left out
    mc = summary["mc"]
    # closed book the reader is always wrong; with the gold passage always right
    assert (mc["llm_only"]["accuracy"], mc["gold_passage"]["accuracy"]) == (0.0, 1.0)
    assert mc["gold_passage"]["vs_llm_only"]["only_b"] == n
    assert mc["gold_passage"]["vs_llm_only"]["p_value"] == pytest.approx(2 / 2**n)
    # rag is right exactly when its retrieval brought the gold passage
    rows = _read_rows(env, "first")
    rag = [r for r in rows if r["mode"] == "rag"]
    assert all(r["correct"] == r["gold_in_evidence"] for r in rag)
    assert mc["rag"]["accuracy"] == pytest.approx(mc["rag"]["gold_in_evidence_rate"])
    assert mc["llm_only"]["strategies"] == {"answer_format": n}
    assert mc["llm_only"]["llm_calls_per_q"] == 1.0
    assert len(calls) == 3 * n
    # phase 1 on the same items, both query variants
    assert set(summary["retrieval"]) == {"question", "question+choices"}
    for name, variant in summary["retrieval"].items():
        assert variant["n"] == n
        rr = [r["rr"] for r in rows if r.get("variant") == name]
        assert variant["mrr"] == pytest.approx(sum(rr) / n)
        assert variant["recall@10"] == 1.0  # 10 passages indexed
        assert variant["recall@1"] <= variant["recall@5"] <= variant["recall@10"]
    run_dir = env / "res" / "first"
    for name in ("summary.json", "summary.md", "config.json", "accuracy.png", "recall_at_k.png"):
        assert (run_dir / name).stat().st_size > 0
    assert "gold_passage" in (run_dir / "summary.md").read_text()
    assert summary["config"]["llm"]["mc_select"]["provider"] == "local"
    for f in run_dir.iterdir():
        if f.suffix in (".json", ".jsonl", ".md"):
            assert SECRET not in f.read_text()

    # a new run of the same configuration is served by the response cache
    factory2, calls2 = reader()
    rc = comprehensive(
        ["pipeline", "--modes", modes, "--run-id", "second", "--json"], factory2, env
    )
    assert rc == 0
    again = json.loads(capsys.readouterr().out)["mc"]
    assert calls2 == []
    assert all(again[m]["provider_calls_per_q"] == 0 for m in again)
    assert {m: again[m]["accuracy"] for m in again} == {m: mc[m]["accuracy"] for m in mc}


@pytest.mark.slow
def test_interrupted_run_resumes_without_repeating_rows(env, capsys):
    factory, calls = reader(fail_after=4)
    rc = comprehensive(
        ["pipeline", "--modes", "llm_only,gold_passage", "--run-id", "r"], factory, env
    )
    assert rc == 130  # interrupted
    rows = _read_rows(env, "r")
    assert len(rows) == 4
    assert (env / "res" / "r" / "summary.json").exists()

    # as the interrupt message says: --resume alone, the run's phase and modes come from the run
    factory2, calls2 = reader()
    rc = comprehensive(["--resume", "r"], factory2, env)
    assert rc == 0
    assert "resuming with the run's command: pipeline --modes llm_only,gold_passage" in (
        capsys.readouterr().err
    )
    rows = _read_rows(env, "r")
    keys = [(r["item"], r["mode"]) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * len(INDEXED_ITEMS)
    assert len(calls2) == 2 * len(INDEXED_ITEMS) - 4  # only the missing rows were run
    summary = json.loads((env / "res" / "r" / "summary.json").read_text())
    assert summary["mc"]["gold_passage"]["accuracy"] == 1.0
    assert summary["interrupted"] is False


def test_an_interrupted_run_says_so_and_how_many_items_it_evaluated(env, capsys):
    factory, _ = reader(fail_after=1)
    assert (
        comprehensive(["pipeline", "--modes", "llm_only", "--run-id", "cut"], factory, env) == 130
    )
    page = (env / "res" / "cut" / "summary.md").read_text()
    assert f"1 of {len(INDEXED_ITEMS)} items evaluated" in page and "interrupted" in page


@pytest.mark.slow
def test_a_retrieval_run_with_no_gold_passage_in_the_store_is_refused(env, capsys, tmp_path):
    """It used to report "0 items evaluated", empty tables, exit 0."""
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({**r, "gold_idx": "absent"}) + "\n" for r in QA_ROWS))
    args = ["retrieval", "--qa", str(qa), "--passages", str(PASSAGES), "--results-dir", "res"]
    assert eval_comprehensive.main(args, llm_factory=reader()[0]) == 2
    assert "has its gold passage in the store" in capsys.readouterr().err


@pytest.mark.slow
def test_evidence_mode_reports_coverage_and_accuracy_on_grounded_items(env, capsys):
    factory, _ = reader()
    args = ["pipeline", "2", "--modes", "llm_only,evidence", "--run-id", "ev", "--json"]
    assert comprehensive(args, factory, env) == 0
    mc = json.loads(capsys.readouterr().out)["mc"]
    rows = [r for r in _read_rows(env, "ev") if r["mode"] == "evidence"]
    assert len(rows) == 2 and all(isinstance(r["grounded"], bool) for r in rows)
    ev = mc["evidence"]
    assert ev["coverage"] == pytest.approx(sum(r["grounded"] for r in rows) / 2)
    grounded = [r["correct"] for r in rows if r["grounded"]]
    expected = sum(grounded) / len(grounded) if grounded else None
    assert ev["accuracy_grounded"] == (pytest.approx(expected) if grounded else None)
    assert "vs_llm_only" in ev


@pytest.mark.slow
def test_n_limits_items_and_extending_n_runs_only_new_items(env):
    factory, calls = reader()
    assert (
        comprehensive(["pipeline", "2", "--modes", "llm_only", "--run-id", "x"], factory, env) == 0
    )
    assert len(calls) == 2
    assert (
        comprehensive(["pipeline", "4", "--modes", "llm_only", "--run-id", "x"], factory, env) == 0
    )
    assert len(calls) == 4
    assert [r["item"] for r in _read_rows(env, "x")] == [q["idx"] for q in INDEXED_ITEMS[:4]]


@pytest.mark.slow
def test_resume_with_another_model_is_refused(env, monkeypatch, capsys):
    factory, _ = reader()
    assert (
        comprehensive(["pipeline", "1", "--modes", "llm_only", "--run-id", "m"], factory, env) == 0
    )
    rc = comprehensive(
        ["pipeline", "2", "--modes", "llm_only", "--run-id", "m", "--model", "other-model"],
        factory,
        env,
    )
    assert rc == 2
    assert "different configuration" in capsys.readouterr().err


@pytest.mark.slow
def test_indexing_passages_for_an_evaluation_says_that_main_py_answers_from_them_too(env, caplog):
    """An evaluation over the shared corpus, run without a CHROMA_DIR of its own, put 2,476 bar
    passages into the starter index that the demos answer from, and said nothing about it."""
    factory, _ = reader()
    assert comprehensive(["retrieval", "2", "--run-id", "a"], factory, env) == 0
    assert (
        "are now in the index at CHROMA_DIR" in caplog.text and str(env / "chroma") in caplog.text
    )
    caplog.clear()
    assert comprehensive(["retrieval", "2", "--run-id", "b"], factory, env) == 0
    assert "are now in the index" not in caplog.text  # nothing new was added


@pytest.mark.slow
def test_a_run_is_not_continued_on_another_corpus_or_phase(env, capsys):
    """Rows measured on one store are not mixed with rows measured after passages were added,
    nor a pipeline run's rows with a retrieval run's under the same --run-id."""
    factory, _ = reader()
    assert comprehensive(["retrieval", "2", "--run-id", "c"], factory, env) == 0
    capsys.readouterr()
    extra = env / "extra.jsonl"
    extra.write_text(json.dumps({"idx": "extra_1", "text": "Adverse possession needs hostility."}))
    assert load_corpus.main(["--passages", str(extra), "--no-progress"]) == 0
    assert comprehensive(["retrieval", "3", "--run-id", "c"], factory, env) == 2
    assert "corpus_count" in capsys.readouterr().err
    assert (
        comprehensive(["pipeline", "1", "--modes", "llm_only", "--run-id", "c"], factory, env) == 2
    )
    assert "phase: 'retrieval' -> 'pipeline'" in capsys.readouterr().err


@pytest.mark.slow
def test_pipeline_mode_runs_the_agent_and_leaves_the_users_qa_memory_alone(env, capsys):
    """The memory is the user's: an evaluation neither reads it (a cached answer would stand in
    for the research) nor clears it nor writes to it."""
    settings = Settings.from_env()
    rag_utils.write_to_memory("What is my own question?", "My own answer.", 0.9, settings)
    factory, calls = reader()
    rc = comprehensive(
        ["pipeline", "2", "--modes", "llm_only,pipeline", "--run-id", "p", "--json"], factory, env
    )
    assert rc == 0
    assert rag_utils.check_memory("What is my own question?", settings=settings) is not None
    assert rag_utils._memory_collection(settings).count() == 1
    summary = json.loads(capsys.readouterr().out)
    pipe = summary["mc"]["pipeline"]
    assert pipe["n"] == 2
    assert pipe["llm_calls_per_q"] > 1  # the agent makes several calls per question
    rows = [r for r in _read_rows(env, "p") if r["mode"] == "pipeline"]
    assert all(r["predicted"] in (None, *LETTERS) for r in rows)
    assert all("memory_hit" in r and "steps" in r for r in rows)
    # Whether the letter stood on evidence is recorded per item and summarised.
    assert all(isinstance(r["closed_book"], bool) for r in rows)
    assert pipe["closed_book_share"] == sum(r["closed_book"] for r in rows) / 2


@pytest.mark.slow
def test_a_cross_encoder_that_cannot_load_stops_the_run_in_one_line(env, monkeypatch, capsys):
    """The agent's hybrid steps rank with RERANKER=cross-encoder, so a model that is not there
    stops the run with one line (exit 2) before any work, instead of failing every item."""
    monkeypatch.setenv("RERANKER_MODEL", str(env / "no-such-cross-encoder"))
    monkeypatch.setenv("SEARCH_STRATEGY", "hybrid")  # this fake planner asks for dense steps
    factory, _ = reader()
    argv = ["pipeline", "2", "--modes", "pipeline", "--reranker", "cross-encoder", "--run-id", "x"]
    assert comprehensive(argv, factory, env) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("error: cannot load cross-encoder")
    assert "RERANKER=hybrid" in err[0] and captured.out == ""
    assert not (env / "res" / "x").exists() and not (env / "chroma").exists()  # before any work


# ------------------------------------------------------------------------------------------------
# eval_reranker
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_reranker_comparison(env, capsys):
    rc = eval_reranker.main(
        [
            "--qa", str(QA), "--passages", str(PASSAGES), "--results-dir", str(env / "res"),
            "--rerankers", "none,hybrid,cross-encoder", "--run-id", "rr", "--json",
        ]
    )  # fmt: skip
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    n = len(INDEXED_ITEMS)
    got = summary["rerankers"]
    assert {"none", "hybrid"} <= set(got)
    # the cross-encoder is either measured or reported unavailable (offline), never dropped silently
    assert ("cross-encoder" in got) != ("cross-encoder" in summary["unavailable"])
    for name, m in got.items():
        assert m["n"] == n
        assert m["latency_mean_s"] > 0
        if name != "none":
            vs = m["vs_none"]
            assert vs["wins"] + vs["losses"] + vs["ties"] == n
    rows = _read_rows(env, "rr")
    assert {r["mode"] for r in rows} == set(got)


def test_a_reranker_comparison_stopped_by_ctrl_c_keeps_its_rows_and_resumes(
    env, fake, capsys, monkeypatch
):
    """Ctrl-C ended `eval_reranker.py` in a KeyboardInterrupt traceback with no summary; it now
    summarizes the rows it saved, exits 130, and the same run id finishes the run."""
    measured = eval_reranker.run_item
    seen: list[str] = []

    def ctrl_c_at_the_second_item(item: dict, reranker: str, **kw: Any) -> dict:
        seen.append(item["idx"])
        if len(seen) == 2:
            raise KeyboardInterrupt
        return measured(item, reranker, **kw)

    monkeypatch.setattr(eval_reranker, "run_item", ctrl_c_at_the_second_item)
    argv = ["--qa", str(QA), "--passages", str(PASSAGES), "--results-dir", str(env / "res"),
            "--rerankers", "none", "--run-id", "rr", "--json"]  # fmt: skip
    assert eval_reranker.main(argv) == 130
    summary = json.loads(capsys.readouterr().out)
    assert summary["interrupted"] and summary["rerankers"]["none"]["n"] == 1
    assert eval_reranker.main(argv) == 0  # resumed: the other items only
    assert json.loads(capsys.readouterr().out)["rerankers"]["none"]["n"] == len(INDEXED_ITEMS)


# ------------------------------------------------------------------------------------------------
# eval_trace
# ------------------------------------------------------------------------------------------------


GRAPH_NODES = ["detect_injection", "classifier", "planner", "executor", "evaluator", "answer",
               "mc_select", "memory_writeback", "observability"]  # fmt: skip
"""The nodes a question the agent researches passes through, in order (main.build_graph)."""


def _roles_seen(factory: Any) -> tuple[Any, list[str]]:
    """``factory`` that also records the role of every chat model the agent asks for."""
    roles: list[str] = []

    def wrapped(role: str) -> Any:
        roles.append(role)
        return factory(role)

    return wrapped, roles


@pytest.fixture
def fake_trace_env(env, fake, monkeypatch):
    """eval_trace with the fake embedder (no model loads) and no cross-encoder."""
    monkeypatch.setenv("RERANKER", "hybrid")
    return env


def test_a_trace_shows_the_pipeline_that_runs_and_saves_it_as_a_case_study(fake_trace_env, capsys):
    """What a user reads: one line per graph node, then each research step's search type,
    queries, passages (gold starred) and evidence score against the gate, the answer record per
    issue, lean's retrieval for the letter; no query rewrite, which the agent does not run."""
    env = fake_trace_env
    factory, roles = _roles_seen(reader()[0])
    argv = ["2", "--qa", str(QA), "--passages", str(PASSAGES), "--save", "--case-dir", str(env / "cs")]  # fmt: skip
    assert eval_trace.main(argv, llm_factory=factory) == 0
    out = capsys.readouterr().out
    assert "[1/2] QUERY [" in out and "[2/2] QUERY [" in out
    for line in ("planner: ", "executor: step 1 [", "research steps", "query: What are the rule",
                 "answer stage", "lean retrieval for the letter", "MC accuracy"):  # fmt: skip
        assert line in out, line
    assert "rewrite" not in out.lower() and "raw retrieval" not in out
    assert "rewrite" not in roles  # skills/query_rewrite.md is not part of the agent
    files = sorted((env / "cs").glob("*.json"))
    assert len(files) == 2
    case = json.loads(files[0].read_text())
    assert case["item"] == INDEXED_ITEMS[0]["idx"]
    assert [e["node"] for e in case["trace"]] == GRAPH_NODES
    assert case["agent_s"] >= case["trace"][-1]["t_s"] > 0
    (step,) = case["steps"]
    assert step["ran"] and step["status"] == "completed" and step["phase"] == "rule"
    assert step["search_type"] == "hybrid+keyword" and step["issue"] == case["issues"][0]
    assert step["queries"][0] == f"What are the rule and elements of {step['issue']}?"
    assert [p["rank"] for p in step["passages"]] == [1, 2, 3, 4, 5]
    assert all(p["id"] in PASSAGE_ROWS and p["title"] for p in step["passages"])
    assert [p["gold"] for p in step["passages"]] == [
        p["id"] in case["gold"] for p in step["passages"]
    ]
    assert step["evidence_score"] >= 0.33 and step["gated"] is False
    record = case["answer_record"]
    assert record["kind"] == "multiple_choice" and record["issues"][0]["issue"] == step["issue"]
    roles_written = {s["role"] for s in record["issues"][0]["sentences"]}
    assert {"rule", "application", "conclusion"} <= roles_written
    assert case["lean"]["route"] == "rag" and case["lean"]["gate"] == 0.33
    assert case["mc"]["answer"] == INDEXED_ITEMS[0]["answer"]
    # The fake reader answers right exactly when the gold passage reached the MC prompt.
    assert case["mc"]["correct"] is case["mc"]["gold_in_sources"]
    assert case["mc"]["gold_in_lean"] is any(p["gold"] for p in case["lean"]["passages"])
    # plan, apply, mc_select: no injection call (embedded), no classify call (multiple choice)
    assert case["llm"]["llm_calls"] == 3
    assert all({"id", "preview"} <= set(s) for s in case["sources"])
    assert "rewrite" not in case and "raw_retrieval" not in case


def test_a_trace_of_a_declined_question_says_why_and_shows_no_research(fake_trace_env, capsys):
    """--json: the cases on stdout as JSON; a question the planner declines has no steps."""
    factory, _ = reader()
    argv = ["--query", "Is a practical joke that injures someone a battery?", "--json"]
    assert eval_trace.main([*argv, "--passages", str(PASSAGES)], llm_factory=factory) == 0
    (case,) = json.loads(capsys.readouterr().out)
    assert case["kind"] == "query" and "mc" not in case
    assert case["steps"] == [] and case["abstained"] and case["decline"].startswith("off topic")
    assert case["decline"] in case["answer_record"]["why"]
    assert [e["node"] for e in case["trace"]][:3] == ["detect_injection", "classifier", "planner"]
    assert "executor" not in [e["node"] for e in case["trace"]]


def test_a_trace_of_an_open_question_shows_each_steps_search_and_the_answer(fake_trace_env, capsys):
    """A fact pattern the classifier reads as law is researched: its step searches the issue's
    names and facts, and the answer record applies the rule to the facts."""
    script = Script({"classify": [json.dumps({"topic": "battery", "area": "torts", "legal": True,
                                              "query_type": "simple"})]})  # fmt: skip
    base, _ = reader()

    def factory(role: str) -> Any:
        return ScriptedChat(role=role, script=script) if role == "classify" else base(role)

    question = ("Tom pulled a chair out from under Ann as a joke, and she fell and broke her "
                "wrist. Is Tom liable to Ann for battery?")  # fmt: skip
    argv = ["--query", question, "--json", "--passages", str(PASSAGES)]
    assert eval_trace.main(argv, llm_factory=factory) == 0
    (case,) = json.loads(capsys.readouterr().out)
    assert not case["decline"] and case["steps"] and case["lean"] is None
    step = case["steps"][0]
    assert step["facts"] and any(step["facts"][0] in q for q in step["queries"])
    assert step["passages"] and all(p["id"] in PASSAGE_ROWS for p in step["passages"])
    assert case["answer_record"]["kind"] == "fact_pattern"
    assert case["researched_issues"] == [s["issue"] for s in case["steps"] if s["phase"] == "rule"]


def test_a_trace_traces_the_research_even_when_the_memory_holds_the_answer(
    fake_trace_env, capsys, monkeypatch
):
    """A cached answer in the user's QA memory must not stand in for the research traced."""
    hit = {"question": "q", "answer": "cached", "confidence": 0.99, "similarity": 1.0,
           "timestamp": "", "sources": []}  # fmt: skip
    monkeypatch.setattr(rag_utils, "check_memory", lambda *a, **k: hit)
    factory, _ = reader()
    argv = ["1", "--qa", str(QA), "--json", "--passages", str(PASSAGES)]
    assert eval_trace.main(argv, llm_factory=factory) == 0
    case = json.loads(capsys.readouterr().out)[0]
    assert not case["memory_hit"] and case["steps"], case


def test_a_missing_qa_file_is_reported_before_any_indexing(env, capsys, monkeypatch):
    def no_indexing(*args, **kwargs):
        raise AssertionError("indexed before the QA file was read")

    monkeypatch.setattr(eval_comprehensive.load_corpus, "load_passages", no_indexing)
    monkeypatch.setattr(eval_comprehensive.load_corpus, "ensure_starter_index", no_indexing)
    for extra in ([], ["--passages", str(PASSAGES)]):
        argv = ["retrieval", "2", "--qa", str(env / "nope.jsonl"), "--results-dir", str(env / "res"), *extra]  # fmt: skip
        assert eval_comprehensive.main(argv) == 2
        assert "QA file not found" in capsys.readouterr().err
        assert not (env / "res").exists() or not any((env / "res").iterdir())


BROKEN_QA = {
    "missing": (None, "not found"),
    "empty": ("", "no questions"),
    "not JSONL": ("question: is it hearsay?\n", "row 1: invalid JSON"),
    "not an object": ('["a", "list"]\n', "row 1: expected a JSON object"),
    "no id": ('{"question": "Is it hearsay?"}\n', "row 1: no question id"),
}
"""A QA file every script refuses, and what its one-line error says."""
NO_CHOICES = ('{"idx": "q1", "question": "Is it hearsay?"}\n', "no multiple-choice item")
"""A QA file without choice_a..choice_d and an answer: nothing an MC eval can score."""
BROKEN_ANSWER_SETS = {
    "missing": (None, "QA file not found"),
    "empty": ("", "no questions"),
    "not JSONL": ("question: is it hearsay?\n", "row 1: invalid JSON"),
    "no fields": ('{"id": "o1", "question": "Is it hearsay?"}\n', "lacks ['category'"),
}


def _broken_file(env: Path, content: str | None) -> Path:
    path = env / "qa.jsonl"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    return path


def _no_index(monkeypatch) -> None:
    """Building or opening an index fails the test: the input check must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("an index was opened before the input file was checked")

    for name in ("load_passages", "ensure_starter_index"):
        monkeypatch.setattr(load_corpus, name, refuse)
    monkeypatch.setattr(rag_utils, "get_store", refuse)


def _assert_one_line_error_before_any_index(rc: int, capsys, env: Path, path: Path, says: str):
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""
    assert captured.err.startswith("error: ") and len(captured.err.strip().splitlines()) == 1
    assert str(path) in captured.err and says in captured.err, captured.err
    assert not (env / "chroma").exists()  # no store was created, let alone indexed
    assert not (env / "res").exists()  # no run folder either


@pytest.mark.parametrize(
    ("script", "argv"),
    [
        ("comprehensive", ["retrieval", "5"]),
        ("comprehensive", ["pipeline", "1", "--modes", "rag"]),
        ("comprehensive", ["both", "--passages", str(PASSAGES)]),
        ("trace", ["1"]),
        ("trace", ["1", "--passages", str(PASSAGES)]),
        ("reranker", ["3"]),
    ],
)
@pytest.mark.parametrize("kind", [*BROKEN_QA, "no choices"], ids=[*BROKEN_QA, "no choices"])
def test_a_missing_or_broken_qa_file_fails_in_one_line_before_any_index(
    script, argv, kind, env, capsys, monkeypatch
):
    content, says = NO_CHOICES if kind == "no choices" else BROKEN_QA[kind]
    path = _broken_file(env, content)
    _no_index(monkeypatch)
    factory, calls = reader()
    qa, res = ["--qa", str(path)], ["--results-dir", str(env / "res")]
    if script == "comprehensive":
        rc = eval_comprehensive.main([*argv, *qa, *res], llm_factory=factory)
    elif script == "trace":
        rc = eval_trace.main([*argv, *qa], llm_factory=factory)
    else:
        rc = eval_reranker.main([*argv, *qa, *res])
    _assert_one_line_error_before_any_index(rc, capsys, env, path, says)
    assert calls == []


@pytest.mark.parametrize("facts", [False, True], ids=["open questions", "fact patterns"])
@pytest.mark.parametrize("kind", list(BROKEN_ANSWER_SETS))
def test_a_missing_or_broken_answer_set_fails_in_one_line_before_any_index(
    kind, facts, env, capsys, monkeypatch
):
    content, says = BROKEN_ANSWER_SETS[kind]
    if facts and kind == "no fields":
        says = "lacks ['answer'"
    path = _broken_file(env, content)
    _no_index(monkeypatch)
    factory, calls = reader()
    argv = ["answers", "2", "--qa", str(path), "--results-dir", str(env / "res")]
    rc = eval_comprehensive.main([*argv, *(["--facts"] if facts else [])], llm_factory=factory)
    if facts and kind == "empty":
        says = "no fact patterns"
    _assert_one_line_error_before_any_index(rc, capsys, env, path, says)
    assert calls == []


def test_a_fact_pattern_split_with_no_item_is_refused_before_any_index(env, capsys, monkeypatch):
    item = {"id": "f1", "question": "Q?", "answer": "yes", "issues": [], "conclusion_keys": []}
    path = _broken_file(env, json.dumps({**item, "split": "report"}) + "\n")
    _no_index(monkeypatch)
    argv = ["answers", "--facts", "--split", "tune", "--qa", str(path)]
    rc = eval_comprehensive.main([*argv, "--results-dir", str(env / "res")])
    _assert_one_line_error_before_any_index(
        rc, capsys, env, path, "no fact patterns in split 'tune'"
    )


def test_reranker_comparison_refuses_n_below_one(env, capsys):
    assert eval_reranker.main(["0", "--qa", str(QA)]) == 2
    assert capsys.readouterr().err.startswith("error: N must be at least 1")


@pytest.mark.parametrize("query", ["", "   \n\t"])
def test_trace_refuses_an_empty_query(query, env, capsys):
    factory, calls = reader()
    assert eval_trace.main(["--query", query], llm_factory=factory) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and calls == []
    assert captured.err.startswith("error: --query is empty")
    assert len(captured.err.strip().splitlines()) == 1
    assert not (env / "chroma").exists()  # refused before anything was indexed


def test_builtin_trace_questions_cover_the_starter_corpus():
    """6 bar-style MC questions decided by starter passages, 1 multi-hop open question whose
    passages are all in the starter corpus, 1 question the corpus cannot answer."""
    starter = {
        json.loads(line)["idx"]: json.loads(line)
        for line in (eval_trace.TRACE_QUESTIONS.parent / "starter" / "passages.jsonl")
        .read_text(encoding="utf-8")
        .splitlines()
        if line.strip()
    }
    rows = eval_trace.load_trace_questions()
    kinds = [r["kind"] for r in rows]
    assert len(rows) == 8
    assert kinds.count("mc") == 6 and kinds.count("multi_hop") == kinds.count("out_of_corpus") == 1
    mc = [r for r in rows if r["kind"] == "mc"]
    assert len({r["subject"] for r in mc}) == 6  # six different subjects
    assert len({r["answer"] for r in mc}) >= 2  # the right letter is not always the same
    for r in mc:
        assert r["gold_idx"] in starter and starter[r["gold_idx"]]["subject"] == r["subject"]
    (hop,) = [r for r in rows if r["kind"] == "multi_hop"]
    hop_gold = hop["gold_idx"].split(";")
    assert len(hop_gold) >= 3 and all(g in starter for g in hop_gold)
    (out,) = [r for r in rows if r["kind"] == "out_of_corpus"]
    assert not out.get("gold_idx") and out["subject"] not in {
        p["subject"] for p in starter.values()
    }


def test_trace_questions_file_is_validated(tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text(json.dumps({"idx": "x", "kind": "mc", "question": "Q?"}) + "\n")
    with pytest.raises(ValueError, match=r"q.jsonl:1: an mc row"):
        eval_trace.load_trace_questions(bad)


@pytest.mark.slow
def test_trace_without_arguments_traces_the_builtin_questions(env, fake, capsys, monkeypatch):
    """No arguments: the starter index is built and the 8 built-in questions are traced (fake
    embedder and fake LLM: this checks the harness, not the answers)."""
    monkeypatch.setenv("RERANKER", "hybrid")  # no cross-encoder download attempt
    factory, calls = reader()
    assert eval_trace.main(["--json"], llm_factory=factory) == 0
    cases = json.loads(capsys.readouterr().out)
    rows = eval_trace.load_trace_questions()
    assert [c["item"] for c in cases] == [r["idx"] for r in rows]
    for case, row in zip(cases, rows, strict=True):
        assert case["kind"] == row["kind"]
        assert ("mc" in case) == (row["kind"] == "mc")
        assert case["trace"] and "steps" in case and case["answer_record"]
    mc_cases = [c for c in cases if c["kind"] == "mc"]
    assert all(c["mc"]["answer"] == c["answer"] and len(c["choices"]) == 4 for c in mc_cases)
    hop = next(c for c in cases if c["kind"] == "multi_hop")
    assert len(hop["gold"]) == 4 and "choices" not in hop
    assert calls  # the agent ran through the injected model


@pytest.mark.slow
def test_phase_3_answers_scores_both_answer_modes_on_the_open_questions(env, capsys):
    """The agent answers open questions in research and evidence mode (fake LLM, starter index):
    one row per question and mode, metrics per mode, and a resumed run repeats nothing."""
    factory, calls = reader()
    args = ["answers", "3", "--run-id", "ans", "--json", "--results-dir", str(env / "res")]
    assert eval_comprehensive.main(args, llm_factory=factory) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["answers"]) == {"research", "evidence"}
    rows = _read_rows(env, "ans")
    assert (
        sorted((r["item"], r["mode"]) for r in rows)
        == sorted((q, m) for q in {r["item"] for r in rows} for m in ("research", "evidence"))
        and len(rows) == 6
    )
    for r in rows:
        assert r["valid_cited_sentences"] <= r["cited_sentences"] <= r["sentences"]
    # The two modes of a question run one after the other, so a run cut short stays paired.
    assert [r["mode"] for r in rows[:2]] == ["research", "evidence"]
    assert rows[0]["item"] == rows[1]["item"]
    n_calls = len(calls)
    assert eval_comprehensive.main(args, llm_factory=factory) == 0
    assert len(calls) == n_calls  # resumed: nothing re-run
    # as an interrupted run's log says: --resume RUN_ID alone replays its command (an answers
    # run had saved none, and was resumed as the default phase, whose config it refused)
    resume = ["--resume", "ans", "--json", "--results-dir", str(env / "res")]
    assert eval_comprehensive.main(resume, llm_factory=factory) == 0
    assert len(calls) == n_calls and len(_read_rows(env, "ans")) == 6
    capsys.readouterr()
    # --grade on the finished run grades its answers (one judge call per distinct answer: a
    # question both modes declined the same way is graded once, through the response cache)
    # without re-answering, and a second --grade finds nothing left to grade.
    distinct = len({(r["item"], r["answer"]) for r in rows})
    assert eval_comprehensive.main([*args, "--grade"], llm_factory=factory) == 0
    graded = json.loads(capsys.readouterr().out)["answers"]
    assert len(calls) == n_calls + distinct
    assert all(graded[m]["a_or_b"]["n"] == 3 for m in ("research", "evidence"))
    assert eval_comprehensive.main([*args, "--grade"], llm_factory=factory) == 0
    assert len(calls) == n_calls + distinct


@pytest.mark.slow  # indexes the starter corpus
def test_answers_the_api_failed_are_not_scored_and_a_rerun_retries_them(env, capsys):
    """With the API down, phase 3 reported abstention 0/1 and key points 0.00, as if the agent
    had answered badly, and exited 0."""
    args = ["answers", "2", "--modes", "research", "--run-id", "down", "--results-dir", "res"]
    assert eval_comprehensive.main(args, llm_factory=reader(down=True)[0]) == 1
    assert "2 (item, mode) pair(s) failed" in capsys.readouterr().err
    assert not (env / "res" / "down" / "results.jsonl").exists()  # nothing scored
    assert len(_rows(env / "res" / "down" / "errors.jsonl")) == 2
    assert eval_comprehensive.main(args, llm_factory=reader()[0]) == 0  # the API is back
    assert len(_read_rows(env, "down")) == 2


@pytest.mark.slow
def test_a_pipeline_item_the_api_failed_is_retried_not_scored_wrong(env, capsys):
    args = ["pipeline", "--modes", "lean", "--run-id", "mcdown"]
    assert comprehensive(args, reader(down=True)[0], env) == 1
    summary = json.loads((env / "res" / "mcdown" / "summary.json").read_text())
    assert summary["mc"] == {} and summary["unresolved_errors"] == len(INDEXED_ITEMS)
    assert comprehensive(args, reader()[0], env) == 0
    assert len(_read_rows(env, "mcdown")) == len(INDEXED_ITEMS)


@pytest.mark.slow
def test_phase_1_columns_score_each_retriever(env, capsys):
    """--columns adds the question alone through dense, BM25 and hybrid, each scored against the
    gold passages like the other variants."""
    factory, calls = reader()
    args = ["retrieval", "--columns", "dense,bm25,hybrid", "--run-id", "cols", "--json"]
    assert comprehensive(args, factory, env) == 0
    retrieval = json.loads(capsys.readouterr().out)["retrieval"]
    assert {"dense", "bm25", "hybrid"} <= set(retrieval)
    n = len(INDEXED_ITEMS)
    for name in ("dense", "bm25", "hybrid"):
        assert retrieval[name]["n"] == n
        assert 0.0 <= retrieval[name]["recall@1"] <= retrieval[name]["recall@10"] <= 1.0
    assert calls == []  # no LLM in phase 1 without --rewrite
    assert "NaN" not in json.dumps(retrieval)  # strict JSON: no MC rows, no letter baseline
    summary = (env / "res" / "cols" / "summary.json").read_text()
    assert json.loads(summary, parse_constant=pytest.fail)["constant_letter_baseline"] is None
    with pytest.raises(SystemExit) as info:
        comprehensive(["retrieval", "--columns", "nope"], factory, env)
    assert info.value.code == 2


@pytest.mark.slow
@pytest.mark.parametrize("gate", ["0", "1"])
def test_lean_mode_uses_the_evidence_only_above_the_gate(gate, env, capsys, monkeypatch):
    monkeypatch.setenv("LEAN_GATE", gate)
    factory, calls = reader()
    args = ["pipeline", "--modes", "llm_only,lean", "--run-id", "lean" + gate, "--json"]
    assert comprehensive(args, factory, env) == 0
    mc = json.loads(capsys.readouterr().out)["mc"]
    rows = [r for r in _read_rows(env, "lean" + gate) if r["mode"] == "lean"]
    assert len(rows) == len(INDEXED_ITEMS)
    # the product's lean route: the letter alone (the embedded model gives no injection verdict)
    assert mc["lean"]["llm_calls_per_q"] == 1.0
    if gate == "0":  # every item reads its evidence: right exactly when the gold was retrieved
        assert all(r["route"] == "rag" for r in rows) and mc["lean"]["rag_share"] == 1.0
        assert all(r["correct"] == r["gold_in_evidence"] for r in rows)
        assert any(r["correct"] for r in rows)
    else:  # no cosine reaches 1: every item is answered closed-book, like llm_only
        assert all(r["route"] == "closed_book" and r["evidence_ids"] == [] for r in rows)
        assert mc["lean"]["accuracy"] == mc["llm_only"]["accuracy"] == 0.0
        assert all(r["evidence_score"] < 1.0 for r in rows)


@pytest.mark.slow
def test_phase_1_query_variants_hyde_and_per_choice(env, capsys):
    """--variants: HyDE asks the model once per item (cached on rerun) and embeds its paragraph;
    per_choice retrieves once per answer choice and fuses the rankings, with no LLM call."""
    factory, calls = reader()
    args = ["retrieval", "--variants", "hyde,hyde+question,per_choice", "--run-id", "v", "--json"]
    assert comprehensive(args, factory, env) == 0
    retrieval = json.loads(capsys.readouterr().out)["retrieval"]
    n = len(INDEXED_ITEMS)
    assert {"question", "question+choices", "hyde", "hyde+question", "per_choice"} <= set(retrieval)
    assert all(retrieval[v]["n"] == n for v in ("hyde", "hyde+question", "per_choice"))
    rows = _read_rows(env, "v")
    per_choice = [r for r in rows if r["variant"] == "per_choice"]
    assert all("llm_calls" not in r for r in per_choice)
    hyde = [r for r in rows if r["variant"] == "hyde"]
    # the fake model's reply ("Answer: X") is the paragraph that was embedded
    assert all(r["llm_calls"] == 1 and r["queries"][0].startswith("Answer: ") for r in hyde)
    fused = [r for r in rows if r["variant"] == "hyde+question"]
    assert all(len(r["queries"]) == 2 and r["queries"][1].startswith("Answer: ") for r in fused)
    # one paragraph per item: hyde+question gets hyde's from the cache; per_choice calls no model
    assert len(calls) == n
    factory2, calls2 = reader()
    args = ["retrieval", "--variants", "hyde", "--run-id", "v2", "--json"]
    assert comprehensive(args, factory2, env) == 0
    assert calls2 == []  # the HyDE paragraphs come from the response cache
    with pytest.raises(SystemExit) as info:
        comprehensive(["retrieval", "--variants", "colbert"], factory, env)
    assert info.value.code == 2


def test_a_trace_of_the_adaptive_policy_shows_the_rewrite_the_leads_and_the_next_move(
    fake_trace_env, capsys
):
    """`eval_trace.py --policy adaptive`: each step's rewritten queries (searched with the
    issue's, pooled), the leads its passages point to, and the replanner's move."""
    script = Script(
        {
            "rewrite": [
                json.dumps({"primary": "battery harmful contact", "alternatives": ["intent"]})
            ],
            "replan": [
                json.dumps({"action": "complete", "why": "the battery issue is researched"})
            ],
        }
    )
    base, _ = reader()

    def factory(role: str) -> Any:
        return ScriptedChat(role=role, script=script) if role in script.replies else base(role)

    argv = ["1", "--qa", str(QA), "--passages", str(PASSAGES), "--policy", "adaptive", "--json"]
    assert eval_trace.main(argv, llm_factory=factory) == 0
    (case,) = json.loads(capsys.readouterr().out)
    (step,) = case["steps"]
    assert step["rewritten"] == ["battery harmful contact", "intent"]
    assert step["next_steps"] == ["complete (the battery issue is researched)"]
    replanner = [e for e in case["trace"] if e["node"] == "replanner"]
    assert replanner and replanner[0]["decision"].startswith("complete: the battery issue")
    assert script.roles() == ["rewrite", "replan"]


@pytest.mark.slow
def test_a_passed_over_doctrine_whose_step_finds_the_gold_passage_counts_as_a_steer(tmp_settings):
    """The blasting pattern's answer researched liability insurance and named "Abnormally
    dangerous activities" as not researched: the search a step for it runs finds the gold
    passage (the real embedder on the starter corpus), the researched doctrine's does not."""
    load_corpus.ensure_starter_index(tmp_settings)
    path = eval_trace.TRACE_QUESTIONS.parent / "fact_patterns.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    item = next(r for r in rows if r["id"] == "fp_torts_blasting_damage")
    named = ["Liability insurance", "Abnormally dangerous activities"]
    context = eval_common.agent_context(tmp_settings, LLMClient(tmp_settings))
    hits = eval_comprehensive.steer_hits(context, item, named)
    assert hits == ["Abnormally dangerous activities"]
    # a gold passage the answer cites already is nothing a steer finds
    gold = [g for issue in item["issues"] for g in issue["gold_ids"]]
    assert eval_comprehensive.steer_hits(context, item, named, cited=gold) == []


def test_a_trace_stopped_by_ctrl_c_shows_what_it_traced(
    fake_trace_env, capsys, caplog, monkeypatch
):
    """Ctrl-C during the second question ended `eval_trace.py --json` in a KeyboardInterrupt
    traceback and printed nothing of the question already traced."""
    traced = eval_trace.trace_query

    def ctrl_c_at_the_second(query: str, **kw: Any) -> dict:
        if kw["position"].startswith("[2/"):
            raise KeyboardInterrupt
        return traced(query, **kw)

    monkeypatch.setattr(eval_trace, "trace_query", ctrl_c_at_the_second)
    argv = ["3", "--qa", str(QA), "--passages", str(PASSAGES), "--json"]
    assert eval_trace.main(argv, llm_factory=reader()[0]) == 130
    captured = capsys.readouterr()
    assert [c["item"] for c in json.loads(captured.out)] == ["evq_1"]
    assert "Traceback" not in captured.err
    assert "interrupted: 1 of 3 question(s) traced" in caplog.text


@pytest.mark.slow  # indexes the starter corpus
def test_document_fact_patterns_load_their_documents_into_a_store_of_the_run(env, capsys):
    """`answers --facts --qa datasets/document_patterns.jsonl`: the patterns are about user
    documents, loaded beside the starter corpus into the run's own store (the user's CHROMA_DIR,
    which main.py answers from, gets none of them), their gold found by the words of its
    sentences."""
    qa = Path(eval_comprehensive.__file__).parent / "datasets" / "document_patterns.jsonl"
    args = ["answers", "2", "--facts", "--split", "all", "--qa", str(qa), "--modes", "research"]
    args += ["--run-id", "docs", "--results-dir", "res"]
    assert eval_comprehensive.main(args, llm_factory=reader()[0]) == 0
    config = json.loads((env / "res" / "docs" / "config.json").read_text())
    assert config["documents"] == ["riverbend_dog_ordinance.txt"]
    rows = _read_rows(env, "docs")
    assert [r["issues"] for r in rows] == [2, 3]
    run_store = rag_utils.get_store(
        Settings.from_env().replace(chroma_dir=str(env / "res/docs/chroma"))
    )
    assert run_store.holds_documents()
    assert not rag_utils.get_store(Settings.from_env()).holds_documents()
