"""eval_common: metrics against hand-computed values, run directory resume, task loop."""

from __future__ import annotations

import json
import math

import pytest

import eval_common as ec

RANKED = ["p3", "g1", "p7", "g2", "p9"]


def test_recall_at_k_counts_share_of_gold_in_top_k():
    assert ec.recall_at_k(RANKED, ["g1"], 1) == 0.0
    assert ec.recall_at_k(RANKED, ["g1"], 2) == 1.0
    assert ec.recall_at_k(RANKED, ["g1", "g2"], 2) == 0.5
    assert ec.recall_at_k(RANKED, ["g1", "g2"], 5) == 1.0
    assert ec.recall_at_k(RANKED, [], 5) == 0.0


def test_reciprocal_rank_uses_first_gold_hit():
    assert ec.retrieval_metrics(RANKED, ["g2"])["rr"] == pytest.approx(1 / 4)
    assert ec.retrieval_metrics(RANKED, ["g2", "g1"])["rr"] == pytest.approx(1 / 2)
    assert ec.retrieval_metrics(RANKED, ["zz"])["rr"] == 0.0
    assert ec.gold_rank(RANKED, ["p3"]) == 1


def test_ndcg_binary_relevance_hand_computed():
    # one gold at rank 2: (1/log2(3)) / 1
    assert ec.ndcg_at_k(RANKED, ["g1"]) == pytest.approx(1 / math.log2(3))
    # two gold at ranks 2 and 4: (1/log2 3 + 1/log2 5) / (1 + 1/log2 3)
    expected = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    assert ec.ndcg_at_k(RANKED, ["g1", "g2"]) == pytest.approx(expected)
    assert ec.ndcg_at_k(RANKED, ["g2"], k=3) == 0.0
    assert ec.ndcg_at_k(["g1"], ["g1"]) == 1.0


def test_retrieval_metrics_bundle():
    m = ec.retrieval_metrics(RANKED, ["g2"])
    assert m == {
        "recall@1": 0.0,
        "recall@5": 1.0,
        "recall@10": 1.0,
        "rr": 0.25,
        "ndcg@10": pytest.approx(1 / math.log2(5)),
    }


def test_recall_curve_from_ranks():
    assert ec.recall_curve([1, 3, None, 10], max_k=4) == [0.25, 0.25, 0.5, 0.5]


def test_accuracy_and_bootstrap_ci_is_seeded_and_brackets_mean():
    outcomes = [1] * 30 + [0] * 20
    assert ec.accuracy([bool(x) for x in outcomes]) == 0.6
    lo, hi = ec.bootstrap_ci(outcomes)
    assert lo < 0.6 < hi
    # normal approximation half-width is 1.96*sqrt(.6*.4/50) = 0.136
    assert 0.10 < (hi - lo) / 2 < 0.17
    assert ec.bootstrap_ci(outcomes) == (lo, hi)  # same seed, same interval
    assert ec.bootstrap_ci([1, 1, 1]) == (1.0, 1.0)
    assert all(math.isnan(x) for x in ec.bootstrap_ci([]))


def test_wilson_ci_hand_computed():
    # 0 of 10: upper = z^2/(n+z^2) = 3.8415/13.8415
    lo, hi = ec.wilson_ci(0, 10)
    assert lo == 0.0 and hi == pytest.approx(3.8415 / 13.8415, abs=1e-4)
    lo, hi = ec.wilson_ci(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))


def test_mcnemar_exact_matches_binomial_hand_computation():
    # A right & B wrong on 2 items, B right & A wrong on 6
    a = [True, False, False, False, False, False, False, True, True]
    b = [False, True, True, True, True, True, True, True, False]
    r = ec.mcnemar_exact(a, b)
    assert (r["only_a"], r["only_b"], r["discordant"]) == (2, 6, 8)
    # 2 vs 6 of 8: p = 2 * (1 + 8 + 28) / 256
    assert r["p_value"] == pytest.approx(2 * 37 / 256)
    assert ec.mcnemar_exact([True, False], [True, False])["p_value"] == 1.0
    with pytest.raises(ValueError):
        ec.mcnemar_exact([True], [True, False])


def test_paired_comparison_wins_losses_ties():
    base = [1.0, 0.5, 0.0, 1.0, 0.2]
    new = [1.0, 1.0, 0.5, 0.5, 0.25]
    r = ec.paired_comparison(base, new)
    assert (r["wins"], r["losses"], r["ties"]) == (3, 1, 1)
    assert r["sign_test_p"] == pytest.approx(2 * 5 / 16)  # 1 vs 3 of 4
    assert 0 < r["wilcoxon_p"] <= 1
    assert ec.paired_comparison([1.0], [1.0])["wilcoxon_p"] is None


def test_item_fields():
    item = {
        "idx": 7,
        "prompt": "Facts.",
        "question": "Q?",
        "choice_a": "a",
        "choice_b": "b",
        "choice_c": "c",
        "choice_d": "d",
        "answer": "c",
        "gold_idx": "x1; x2",
        "subject": None,
    }
    assert ec.item_id(item) == "7"
    assert ec.item_question(item) == "Facts.\n\nQ?"
    assert ec.item_choices(item) == {"A": "a", "B": "b", "C": "c", "D": "d"}
    assert ec.item_answer(item) == "C"
    assert ec.gold_ids(item) == ["x1", "x2"]
    assert ec.gold_ids({"gold_idx": float("nan")}) == []
    assert ec.item_subject(item) == "unknown"


def test_run_dir_resume_skips_written_rows_and_cuts_partial_line(tmp_path):
    run = ec.RunDir("r1", tmp_path)
    assert not run.resumed
    run.append({"item": "1", "mode": "rag", "correct": True})
    run.append({"item": "2", "mode": "rag", "correct": False})
    # simulate a kill in the middle of writing a third row
    with open(run.results_path, "a", encoding="utf-8") as fh:
        fh.write('{"item": "3", "mo')
    again = ec.RunDir("r1", tmp_path)
    assert again.resumed
    assert again.done() == {("1", "rag"), ("2", "rag")}
    again.append({"item": "3", "mode": "rag", "correct": True})
    lines = again.results_path.read_text().splitlines()
    assert [json.loads(x)["item"] for x in lines] == ["1", "2", "3"]


def test_open_run_resume_requires_existing_run(tmp_path):
    with pytest.raises(FileNotFoundError):
        ec.open_run("both", None, "nope", tmp_path)
    run = ec.open_run("both", "abc", None, tmp_path)
    run.check_config({"n": 1}, ["n"])  # cut before its first row: it resumes with none done
    assert ec.open_run("both", None, "abc", tmp_path).done() == set()
    run.append({"item": "1", "mode": "x"})
    assert ec.open_run("both", None, "abc", tmp_path).done() == {("1", "x")}


def test_config_mismatch_on_resume_is_refused(tmp_path):
    run = ec.RunDir("r", tmp_path)
    run.check_config({"model": "a", "n": 5}, keys=["model"])
    ec.RunDir("r", tmp_path).check_config({"model": "a", "n": 9}, keys=["model"])
    with pytest.raises(ec.ConfigMismatchError, match="model"):
        ec.RunDir("r", tmp_path).check_config({"model": "b"}, keys=["model"])


def test_settings_record_never_contains_api_key():
    s = ec.eval_settings(env={"LLM_API_KEY": "sk-secret-123"}, llm_provider="groq")
    assert s.llm.cache is True
    rec = ec.settings_record(s)
    assert "llm_api_key" not in rec
    assert "sk-secret-123" not in json.dumps(rec, default=str)
    assert rec["llm_provider"] == "groq"


def test_eval_records_keep_no_credentials_of_the_base_url():
    url = "http://alice:pa55word@llm.internal:8000/v1?api_key=k3y-SECRET"
    s = ec.eval_settings(env={"LLM_BASE_URL": url, "LLM_MODEL": "m"}, llm_provider="vllm")
    records = json.dumps([ec.settings_record(s), ec.llm_record(s)], default=str)
    assert "pa55word" not in records and "k3y-SECRET" not in records and "alice" not in records
    assert ec.settings_record(s)["llm_base_url"] == "http://***@llm.internal:8000/v1?api_key=***"
    assert ec.llm_record(s)["mc_select"]["base_url"].startswith("http://***@llm.internal:8000/v1")


@pytest.mark.parametrize("workers", [1, 3])
def test_run_tasks_yields_every_result_and_errors(workers):
    def fn(x):
        if x == 3:
            raise ValueError("boom")
        return x * 10

    out = {t: (r, e) for t, r, e in ec.run_tasks(fn, list(range(6)), workers=workers)}
    assert {t: r for t, (r, e) in out.items() if e is None} == {0: 0, 1: 10, 2: 20, 4: 40, 5: 50}
    assert isinstance(out[3][1], ValueError)


def test_run_tasks_fatal_error_stops():
    def fn(x):
        raise KeyError(x)

    with pytest.raises(KeyError):
        list(ec.run_tasks(fn, [1, 2], fatal=(KeyError,)))


def test_plots_are_written(tmp_path):
    modes = {
        "llm_only": {"accuracy": 0.3, "ci_low": 0.1, "ci_high": 0.5, "n": 10},
        "rag": {"accuracy": 0.6, "ci_low": 0.4, "ci_high": 0.8, "n": 10},
    }
    a = ec.plot_accuracy(modes, tmp_path / "acc.png")
    b = ec.plot_recall_curve({"question": [0.1, 0.2, 0.5]}, tmp_path / "recall.png")
    for p in (a, b):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_runs_have_no_run_deadline_unless_one_is_set():
    assert ec.eval_settings(env={}).agent.run_timeout == 0
    assert ec.eval_settings(env={"RUN_TIMEOUT": "120"}).agent.run_timeout == 120
    assert ec.eval_settings(env={}).llm.cache is True
