"""Helpers shared by the eval scripts and the benchmarks: QA items, metrics, run directories,
the CLI scaffolding, tables and plots."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

import filters
import load_corpus
import rag_utils
from context import AgentContext
from mc import format_choices
from providers import (
    LLMConfigError,
    check_config,
    check_reachable,
    install_log_redaction,
    redact_url,
    resolve,
)
from question import MC_LETTERS
from settings import Settings, load_dotenv_file

logger = logging.getLogger(__name__)

MC_KEYS = tuple(MC_LETTERS)  # a tuple: "" and "AB" are not answer letters
BOOTSTRAP_SEED = 20240607
BOOTSTRAP_RESAMPLES = 2000
DEFAULT_RESULTS_DIR = "eval_results"
_NOISY = ("httpx", "httpx2", "httpcore", "urllib3", "chromadb", "sentence_transformers", "openai")
"""Loggers the CLI keeps at WARNING."""
_SECRET_FIELD = re.compile(r"(api_key|secret|token|password)", re.IGNORECASE)
LLMFactory = Callable[[str], Any] | None
"""``LLMClient``'s ``llm_factory``: a test's chat models by role; None for the configured ones."""
TaskKey = Callable[[Any], tuple[str, str]]  # a task's (item id, mode): its row of a run


# --- QA items -----------------------------------------------------------------------------------


def load_qa(path: str | os.PathLike[str]) -> list[dict]:
    """The multiple-choice items of ``path`` (the others dropped with a warning)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"QA file not found: {path}")
    rows = load_corpus.read_qa(path)  # ids are unique
    items = [it for it in rows if item_answer(it) in MC_KEYS and all(item_choices(it).values())]
    if not items:
        raise ValueError(
            f"{path}: no multiple-choice item (each needs choice_a..choice_d and an answer A-D)"
        )
    if len(items) < len(rows):
        logger.warning(
            "%s: skipped %d item(s) without 4 choices and an answer letter",
            path,
            len(rows) - len(items),
        )
    return items


def read_inputs(qa: str | None, passages: str | None) -> tuple[Path, list[dict], list[dict] | None]:
    """The QA file's path and items (``--qa``, default the starter set) and the ``--passages``,
    read before any model loads or index is built, so a bad file stops the run in one line."""
    qa_path = Path(qa) if qa else load_corpus.starter_dir() / "qa.jsonl"
    return qa_path, load_qa(qa_path), load_corpus.read_passages(passages) if passages else None


def index_corpus(settings: Settings, passages: list[dict] | None, source: str | None) -> None:
    """Index the ``--passages`` read from ``source``, or the starter corpus when None."""
    if passages is None:
        load_corpus.ensure_starter_index(settings)
        return
    added = load_corpus.load_passages(passages, settings=settings)
    logger.info("indexed %s: %d passages (%d new)", source, len(passages), added)
    if added:  # the user's own index, unless CHROMA_DIR names another for this corpus
        logger.warning(
            "%d passages of %s are now in the index at CHROMA_DIR %s, which main.py answers "
            "from too; `make clean-index` removes them",
            added, source, settings.retrieval.chroma_host or settings.retrieval.chroma_dir
        )  # fmt: skip


def item_id(item: dict) -> str:
    return str(item.get("idx") if item.get("idx") is not None else item.get("id"))


def item_choices(item: dict) -> dict[str, str]:
    return {k: str(item.get(f"choice_{k.lower()}") or "").strip() for k in MC_KEYS}


def item_answer(item: dict) -> str:
    return str(item.get("answer") or "").strip().upper()


def item_question(item: dict) -> str:
    """The question as the model sees it: the shared fact pattern (``prompt``), then the stem."""
    prompt = str(item.get("prompt") or "").strip()
    question = str(item.get("question") or "").strip()
    return f"{prompt}\n\n{question}" if prompt else question


def _missing(value: Any) -> bool:
    """None or NaN (an empty cell of a CSV or Parquet file)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def item_subject(item: dict) -> str:
    subject = item.get("subject")
    return "unknown" if _missing(subject) else (str(subject).strip() or "unknown")


def gold_ids(item: dict) -> list[str]:
    """Gold passage ids of an item (``gold_idx``: one id, a list, or ';'/','-separated)."""
    raw = item.get("gold_idx")
    if _missing(raw):
        return []
    parts = raw if isinstance(raw, list | tuple) else re.split(r"[;,]", str(raw))
    return [p for x in parts if (p := str(x).strip())]


def question_with_choices(item: dict) -> str:
    """The retrieval query 'question + choices'."""
    return f"{item_question(item)}\n{format_choices(item_choices(item))}"


def fetch_passages(ids: Iterable[str], settings: Settings) -> dict[str, dict]:
    """Passages of the store by id (missing ids are absent from the result)."""
    return {str(p["id"]): p for p in rag_utils.get_store(settings).get(list(ids))}


def with_gold_in_store(items: Sequence[dict], settings: Settings) -> list[dict]:
    """The items with at least one gold passage in the store."""
    present = rag_utils.get_store(settings).existing_ids([g for it in items for g in gold_ids(it)])
    return [it for it in items if present.intersection(gold_ids(it))]


def items_with_gold(items: Sequence[dict], settings: Settings, qa_path: Path) -> list[dict]:
    """:func:`with_gold_in_store`, the others skipped with a warning; a ValueError if none."""
    with_gold = with_gold_in_store(items, settings)
    if len(with_gold) < len(items):
        logger.warning(
            "%d of %d items have no gold passage in the store and are skipped "
            "(index their passages with --passages)",
            len(items) - len(with_gold),
            len(items),
        )
    if not with_gold:
        raise ValueError(
            f"no item of {qa_path} has its gold passage in the store: index their passages "
            "with --passages"
        )
    return with_gold


def group_by(rows: Iterable[Mapping[str, Any]], key: str) -> dict[Any, list]:
    """``rows`` by their value of ``key``, in the order the values first occur."""
    groups: dict[Any, list] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    return groups


def by_mode(rows: Iterable[Mapping[str, Any]]) -> dict[Any, dict[Any, Any]]:
    """``rows`` by mode (in the order the modes first occur), then by item: its last row."""
    return {mode: {r["item"]: r for r in rs} for mode, rs in group_by(rows, "mode").items()}


def paired(a: Mapping[Any, Mapping], b: Mapping[Any, Mapping], key: str) -> tuple[list, list]:
    """``key`` of the items both ``a`` and ``b`` (rows by item) have, in the order of the ids."""
    common = sorted(set(a) & set(b))
    return [a[i][key] for i in common], [b[i][key] for i in common]


def preview(text: str | None, n: int = 160) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


# --- Metrics ------------------------------------------------------------------------------------


def gold_rank(ranked_ids: Sequence[str], gold: Iterable[str]) -> int | None:
    """1-based rank of the first gold passage, or None when none was retrieved."""
    gold = set(gold)
    return next((i for i, doc_id in enumerate(ranked_ids, 1) if doc_id in gold), None)


def recall_at_k(ranked_ids: Sequence[str], gold: Iterable[str], k: int) -> float:
    """Share of the gold passages found in the top k (0.0 when there is no gold)."""
    gold = set(gold)
    return len(gold & set(ranked_ids[:k])) / len(gold) if gold else 0.0


def ndcg_at_k(ranked_ids: Sequence[str], gold: Iterable[str], k: int = 10) -> float:
    """nDCG@k with binary relevance: sum 1/log2(rank+1) over gold hits, over the ideal value."""
    gold = set(gold)
    dcg = sum(1.0 / math.log2(i + 2) for i, d in enumerate(ranked_ids[:k]) if d in gold)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(gold), k)))
    return dcg / ideal if gold else 0.0


def retrieval_metrics(ranked_ids: Sequence[str], gold: Iterable[str]) -> dict[str, float]:
    """``recall@1``, ``recall@5``, ``recall@10``, ``rr`` and ``ndcg@10`` of one ranked list."""
    gold = list(gold)
    out = {f"recall@{k}": recall_at_k(ranked_ids, gold, k) for k in (1, 5, 10)}
    rank = gold_rank(ranked_ids, gold)
    out["rr"] = 0.0 if rank is None else 1.0 / rank
    out["ndcg@10"] = ndcg_at_k(ranked_ids, gold, 10)
    return out


def ranking_row(
    item: dict, mode: str, docs: Sequence[Mapping[str, Any]], seconds: float, **fields: Any
) -> dict:
    """The results.jsonl row of the ``docs`` retrieved for ``item`` in ``seconds``: ``fields``,
    gold, the ranked ids and their metrics."""
    gold, ranked = gold_ids(item), [d["id"] for d in docs]
    return {
        "item": item_id(item),
        "mode": mode,
        **fields,
        "subject": item_subject(item),
        "gold": gold,
        "ranked": ranked,
        "gold_rank": gold_rank(ranked, gold),
        **retrieval_metrics(ranked, gold),
        "seconds": seconds,
    }


def summarize_rankings(rows: Sequence[dict], max_k: int = 10) -> dict[str, Any]:
    """Recall@1/5/10, MRR (bootstrap CI), nDCG@10, Recall@k curve of :func:`ranking_row` rows."""
    rr = [r["rr"] for r in rows]
    return {
        "n": len(rows),
        **{f"recall@{k}": mean(r[f"recall@{k}"] for r in rows) for k in (1, 5, 10)},
        "mrr": mean(rr),
        "mrr_ci": list(bootstrap_ci(rr)),
        "ndcg@10": mean(r["ndcg@10"] for r in rows),
        "recall_curve": recall_curve([r["gold_rank"] for r in rows], max_k),
    }


def recall_curve(ranks: Sequence[int | None], max_k: int = 10) -> list[float]:
    """Recall@k for k = 1..max_k from the rank of the gold passage of each item (None = missed)."""
    if not ranks:
        return []
    return [mean(r is not None and r <= k for r in ranks) for k in range(1, max_k + 1)]


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else float("nan")


def accuracy(correct: Iterable[bool]) -> float:
    return mean(float(bool(c)) for c in correct)


def bootstrap_ci(values: Sequence[float]) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of ``values`` (fixed seed: reproducible);
    (nan, nan) for no values.  For paired differences pass the per-item differences."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = arr[rng.integers(0, arr.size, size=(BOOTSTRAP_RESAMPLES, arr.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return (float(lo), float(hi))


def wilson_ci(successes: int, n: int) -> tuple[float, float]:
    """95% Wilson interval of a proportion (unlike the bootstrap's, not degenerate at 0 or n)."""
    if n == 0:
        return (float("nan"), float("nan"))
    from scipy.stats import binomtest

    ci = binomtest(successes, n).proportion_ci(0.95, method="wilson")
    return (float(ci.low), float(ci.high))


def mcnemar_exact(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> dict[str, Any]:
    """McNemar's exact test on paired outcomes: two-sided binomial test on the discordant pairs
    (``only_a``: A right and B wrong, ``only_b`` the reverse); p = 1.0 with no discordance."""
    from scipy.stats import binomtest

    only_a = sum(1 for a, b in zip(a_correct, b_correct, strict=True) if a and not b)
    only_b = sum(1 for a, b in zip(a_correct, b_correct, strict=True) if b and not a)
    n = only_a + only_b
    p = float(binomtest(min(only_a, only_b), n, 0.5).pvalue) if n else 1.0
    return {"n": len(a_correct), "only_a": only_a, "only_b": only_b, "discordant": n, "p_value": p}


def paired_comparison(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Per-item scores (higher is better) of system B against baseline A: wins (B higher), losses,
    ties, the sign test (ties dropped) and the Wilcoxon signed-rank test (None when all tie)."""
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    wins = sum(d > 0 for d in diffs)
    losses = sum(d < 0 for d in diffs)
    from scipy.stats import binomtest, wilcoxon

    decided = wins + losses
    return {
        "n": len(diffs),
        "wins": wins,
        "losses": losses,
        "ties": len(diffs) - decided,
        "mean_diff": mean(diffs),
        "sign_test_p": float(binomtest(wins, decided, 0.5).pvalue) if decided else 1.0,
        "wilcoxon_p": float(wilcoxon([d for d in diffs if d]).pvalue) if decided else None,
    }


# --- Settings and configuration record ----------------------------------------------------------


def eval_settings(env: dict[str, str] | None = None, **overrides: Any) -> Settings:
    """Settings for an eval run: environment + CLI overrides, with the LLM response cache ON."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    overrides.setdefault("llm_cache", True)
    # RUN_TIMEOUT guards one interactive question; an eval run is long on purpose and an item cut
    # off by a loaded machine would count as a wrong answer.  Set RUN_TIMEOUT to apply one anyway.
    if "RUN_TIMEOUT" not in (os.environ if env is None else env):
        overrides.setdefault("run_timeout", 0)
    settings = Settings.from_env(env, **overrides)
    filters.passage_filter(settings)  # a bad filter value stops the run before any work
    return settings


def settings_record(settings: Settings) -> dict[str, Any]:
    """Every setting except secrets (API keys) and the environment snapshot; URLs lose their
    credentials (``LLM_BASE_URL=http://user:password@host`` is recorded as ``http://***@host``)."""
    return {  # keyed by variable, as in earlier result files
        name: redact_url(value) if isinstance(value, str) else value
        for name, value in settings.flat().items()
        if not _SECRET_FIELD.search(name)
    }


def llm_record(settings: Settings, roles: Sequence[str] = ("mc_select", "rewrite")) -> dict:
    """Provider, model and base URL (no credentials, no key) of each role, or its config error."""

    def record(role: str) -> dict[str, Any]:
        try:
            r = resolve(role, settings)
        except LLMConfigError as exc:
            return {"error": str(exc)}
        return {"provider": r.provider, "model": r.model, "base_url": r.display_url}

    return {role: record(role) for role in roles}


def retrieval_record(settings: Settings) -> dict[str, Any]:
    """Embedder name, reranker setting and passage count of the store used."""
    rec: dict[str, Any] = {"reranker": settings.retrieval.reranker}
    try:
        rec["embedder"] = rag_utils.get_embedder(settings).name
        rec["corpus_count"] = rag_utils.corpus_count(settings)
    except Exception as exc:  # recorded, the run reports it
        rec["error"] = f"{exc.__class__.__name__}: {exc}"
    return rec


def agent_context(settings: Settings, client: Any) -> AgentContext:
    """The agent's context for an evaluation: the QA memory is neither read (an earlier answer
    would stand in for the research being measured) nor written (it is the user's)."""
    context = AgentContext.from_settings(settings, client=client)
    return dataclasses.replace(
        context, check_memory=lambda question: None, write_memory=lambda *a, **k: None
    )


def usage_of(client: Any) -> dict[str, Any]:
    """``client.summary()`` without the per-role breakdown: one flat row per eval item."""
    return {k: v for k, v in client.summary().items() if k != "by_role"}


def require_llm(settings: Settings, llm_factory: LLMFactory = None) -> None:
    """Raise LLMConfigError for any role's bad configuration (unless a test injects chat models)."""
    if llm_factory is None:
        check_config(settings)
        check_reachable(settings)


# --- CLI ----------------------------------------------------------------------------------------


class ConfigMismatchError(ValueError):
    """A resumed run was started with a different configuration."""


USER_ERRORS = (FileNotFoundError, ValueError, LLMConfigError, rag_utils.ModelLoadError)
"""Errors an eval command reports as one line and exit status 2, never a traceback; ValueError
covers a bad setting (SettingsError), a bad file (CorpusError) and ConfigMismatchError."""


def add_cli_arguments(
    p: argparse.ArgumentParser,
    *,
    run_dir: bool = True,
    provider: bool = True,
    model: bool = False,
    passage_filters: bool = True,
) -> None:
    """The flags eval commands share, the passage filters among them (``filters.add_arguments``)."""
    if run_dir:
        p.add_argument("--run-id", help="run directory name; an existing one is resumed")
        p.add_argument("--results-dir", default=DEFAULT_RESULTS_DIR, help="default eval_results")
    if provider:
        p.add_argument("--provider", help="LLM provider (overrides LLM_PROVIDER)")
    if model:
        p.add_argument("--model", help="LLM model (overrides LLM_MODEL)")
    p.add_argument("--json", action="store_true", help="print the result as JSON, not the tables")
    p.add_argument("-v", "--verbose", action="store_true")
    if passage_filters:
        filters.add_arguments(p)


def cli_run(
    args: argparse.Namespace, fn: Callable[[Settings], Any], **overrides: Any
) -> tuple[int, Any]:
    """An eval command's body: logging, ``.env``, the settings (``overrides``, ``args``' provider,
    model and filters): ``(0, fn(settings))``, or ``(2, None)`` with a user error in one line."""
    logging.basicConfig(  # CLI logging to stderr
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.WARNING)
    install_log_redaction()
    overrides.setdefault("llm_provider", getattr(args, "provider", None))
    overrides.setdefault("llm_model", getattr(args, "model", None))
    if hasattr(args, "jurisdiction"):
        overrides.update(filters.overrides(args))
    try:
        load_dotenv_file()
        return 0, fn(eval_settings(**overrides))
    except USER_ERRORS as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 2, None


def print_summary(
    args: argparse.Namespace, summary: dict[str, Any], render: Callable[[dict[str, Any]], str]
) -> int:
    """The end of an eval command: ``summary`` as JSON (``--json``) or as ``render`` shows it,
    then the run's folder; exit status 130 when the run was interrupted, 1 when some (item, mode)
    pairs failed (a rerun with the same run id retries them), else 0."""
    failed = summary.get("failed") or summary.get("unresolved_errors") or 0
    if args.json:
        print(json.dumps(summary, indent=2, ensure_ascii=False, default=str))
    else:
        print(f"{render(summary)}\nresults: {Path(args.results_dir) / summary['run_id']}")
    if failed and not args.json:
        print(
            f"{failed} (item, mode) pair(s) failed and are left out of the metrics (errors.jsonl);"
            f" rerun with --run-id {summary['run_id']} to retry them",
            file=sys.stderr,
        )
    return 130 if summary.get("interrupted") else 1 if failed else 0


def comma_list(value: str, allowed: Iterable[str], what: str) -> list[str]:
    """The items of a comma-separated flag; a ValueError names those not in ``allowed``."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad:
        raise ValueError(f"unknown {what}(s) {bad}; choose from {', '.join(allowed)}")
    return items


# --- Run directory ------------------------------------------------------------------------------


class RunDir:
    """``<root>/<run_id>/`` with an append-only ``results.jsonl`` keyed by (item, mode).  Opening
    an existing run resumes it: its rows are kept (a half-written last line is cut off) and
    ``done`` names the pairs to skip.  ``errors``: the pairs that failed in this process.  Only
    the main thread writes (:func:`run_tasks`): no lock."""

    def __init__(self, run_id: str, root: str | os.PathLike[str] = DEFAULT_RESULTS_DIR) -> None:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise ValueError(f"invalid run id {run_id!r}")
        self.run_id = run_id
        self.path = Path(root) / run_id
        self.results_path = self.path / "results.jsonl"
        self.resumed = self.results_path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = self._read_rows()
        self.errors: list[dict] = []
        self.interrupted = False

    def _read_rows(self) -> list[dict]:
        if not self.resumed:
            return []
        raw = self.results_path.read_bytes()
        rows, good = [], 0
        for line in raw.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
            good += len(line)
        if good < len(raw):
            logger.warning("%s: dropping an incomplete last row", self.results_path)
            os.truncate(self.results_path, good)
        return rows

    def done(self) -> set[tuple[str, str]]:
        return {(str(r["item"]), str(r["mode"])) for r in self.rows}

    def append(self, row: dict) -> None:
        _append_line(self.results_path, row)
        self.rows.append(row)

    def run(
        self, fn: Callable[[Any], dict], tasks: Sequence[Any], *, key: TaskKey, **options: Any
    ) -> None:
        """:func:`run_tasks` (with ``options``) over the ``tasks`` whose (item id, mode) ``key`` has
        no row yet, each row appended as it ends.  A task that fails gets no row, so a rerun with
        the same run id tries it again: it is logged and written to errors.jsonl."""
        done = self.done()
        tasks = [task for task in tasks if key(task) not in done]
        for task, row, err in run_tasks(fn, tasks, **options):
            if err is None:
                self.append(row)
                continue
            item, mode = key(task)
            logger.warning("%s / %s failed: %s", item, mode, err)
            error = {"item": item, "mode": mode, "error": f"{err.__class__.__name__}: {err}"}
            _append_line(self.path / "errors.jsonl", error)
            self.errors.append(error)

    @contextlib.contextmanager
    def until_interrupted(self, resume_flag: str = "--run-id") -> Iterator[None]:
        """Ctrl-C ends the block, not the command: the rows so far stay, ``interrupted`` is set
        and the log says how to finish the run."""
        try:
            yield
        except KeyboardInterrupt:
            self.interrupted = True
            logger.warning(
                "interrupted: %d rows are saved; resume with %s %s",
                len(self.rows),
                resume_flag,
                self.run_id,
            )

    def open_errors(self) -> list[dict]:
        """The errors.jsonl entries whose (item, mode) pair still has no row."""
        path, done = self.path / "errors.jsonl", self.done()
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        errors = []
        for line in lines:  # a line a crash cut short, and the next one appended to it, are skipped
            with contextlib.suppress(json.JSONDecodeError):
                errors.append(json.loads(line))
        return [e for e in errors if (str(e["item"]), e["mode"]) not in done]

    def check_config(self, config: dict[str, Any], keys: Sequence[str]) -> None:
        """Save ``config``; on resume refuse to mix rows made under a different one (``keys``)."""
        config_path = self.path / "config.json"
        if config_path.exists():
            old = json.loads(config_path.read_text(encoding="utf-8"))
            diff = [k for k in keys if k in old and old.get(k) != config.get(k)]
            if diff:
                details = "; ".join(f"{k}: {old.get(k)!r} -> {config.get(k)!r}" for k in diff)
                raise ConfigMismatchError(
                    f"run {self.run_id} was made with a different configuration ({details}); "
                    "use a new --run-id"
                )
        self.write_json("config.json", config)

    def write_json(self, name: str, data: Any) -> None:
        path = self.path / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(
            json.dumps(data, indent=2, ensure_ascii=False, default=_json_default) + "\n",
            encoding="utf-8",
        )
        tmp.replace(path)

    def write_text(self, name: str, text: str) -> None:
        (self.path / name).write_text(text, encoding="utf-8")


def open_run(
    kind: str, run_id: str | None, resume: str | None, root: str | os.PathLike[str]
) -> RunDir:
    """The run directory for ``--run-id`` / ``--resume`` (which must exist: its config.json is
    written before the first row, so a run cut before any row resumes too) or a new id."""
    if resume:
        if run_id and run_id != resume:
            raise ValueError("give either --run-id or --resume, not two different ids")
        if not any((Path(root) / resume / f).exists() for f in ("results.jsonl", "config.json")):
            raise FileNotFoundError(f"no run to resume: {Path(root) / resume}/config.json")
        return RunDir(resume, root)
    return RunDir(run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}", root)


def _append_line(path: Path, row: dict) -> None:
    """One JSON line, on disk before returning."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _json_default(obj: Any) -> Any:
    """numpy scalars and arrays as Python values, anything else as its str."""
    return obj.tolist() if isinstance(obj, np.generic | np.ndarray) else str(obj)


def run_tasks(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    *,
    workers: int = 1,
    desc: str = "",
    fatal: tuple[type[BaseException], ...] = (),
) -> Iterator[tuple[Any, Any, BaseException | None]]:
    """Run ``fn`` over ``tasks`` with a progress bar, in threads when ``workers > 1``; yield
    ``(task, result, error)`` as each ends.  ``fatal`` exceptions and Ctrl-C cancel the pending
    tasks and propagate; the caller writes results in this (the main) thread, so files stay whole."""
    from tqdm.auto import tqdm

    def attempt(task: Any) -> tuple[Any, Any, BaseException | None]:
        try:
            return task, fn(task), None
        except fatal:
            raise
        except Exception as exc:  # yielded to the caller
            return task, None, exc

    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        if pool is None:
            outcomes: Iterable = map(attempt, tasks)
        else:
            outcomes = (f.result() for f in as_completed([pool.submit(attempt, t) for t in tasks]))
        yield from tqdm(
            outcomes, total=len(tasks), desc=desc, unit="task", disable=None, leave=False
        )
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


# --- Output: tables and plots -------------------------------------------------------------------


def fmt_num(value: Any) -> str:
    if _missing(value):
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _cells(records: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The header (the first record's keys), then one row of formatted values per record."""
    return [list(records[0]), *([fmt_num(v) for v in r.values()] for r in records)]


def markdown_table(records: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table with one row per record ("" for none)."""
    if not records:
        return ""
    header, *rows = _cells(records)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def text_table(records: Sequence[Mapping[str, Any]], rule: bool = True) -> str:
    """:func:`markdown_table` as aligned text; ``rule``: dashes under the header."""
    if not records:
        return ""
    cells = _cells(records)
    widths = [max(map(len, column)) for column in zip(*cells, strict=True)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _axes(width: float, height: float) -> tuple[Any, Any]:
    """A figure outside pyplot (no global backend or figure list to manage) and its axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots()


def _save(
    fig: Any, ax: Any, path: str | os.PathLike[str], ylabel: str, title: str, **legend: Any
) -> Path:
    ax.set_ylim(0, 1)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, **legend)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


def plot_accuracy(modes: dict[str, dict], path: str | os.PathLike[str], title: str = "") -> Path:
    """Bar chart of accuracy per mode with its 95% CI (``modes[m]`` has accuracy, ci_low, ci_high, n)."""
    names = list(modes)
    acc = [modes[m]["accuracy"] for m in names]
    lower = [max(0.0, a - modes[m]["ci_low"]) for a, m in zip(acc, names, strict=True)]
    upper = [max(0.0, modes[m]["ci_high"] - a) for a, m in zip(acc, names, strict=True)]
    fig, ax = _axes(1.6 * max(3, len(names)) + 1, 4)
    ax.bar(names, acc, yerr=[lower, upper], capsize=6, color="#4c72b0")
    for i, m in enumerate(names):
        ax.text(i, 0.02, f"n={modes[m]['n']}", ha="center", color="white", fontsize=8)
    ax.axhline(0.25, ls="--", color="grey", lw=1, label="chance (4 options)")
    ylabel = "accuracy (95% bootstrap CI)"
    return _save(fig, ax, path, ylabel, title or "MC accuracy per mode", loc="upper right")


def plot_recall_curve(
    curves: dict[str, Sequence[float]], path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Recall@k for k = 1..len(curve), one line per query variant (or reranker)."""
    fig, ax = _axes(6, 4)
    for name, curve in curves.items():
        ax.plot(range(1, len(curve) + 1), curve, marker="o", label=name)
    ax.set_xlabel("k")
    ax.grid(alpha=0.3)
    return _save(fig, ax, path, "Recall@k", title or "Recall@k")
