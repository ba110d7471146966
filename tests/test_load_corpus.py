"""Corpus loading: file formats, bad input, the CLI commands, sources, and resume after a kill."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import load_corpus
import rag_utils

pytestmark = pytest.mark.usefixtures("fresh_rag_caches")

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PASSAGES = FIXTURES / "retrieval_passages.jsonl"
QA = FIXTURES / "retrieval_qa.jsonl"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cli(tmp_settings, fake, monkeypatch, capsys):
    """Run ``load_corpus.main`` in-process on the temporary store; returns (rc, stdout, stderr)."""
    monkeypatch.setenv("CHROMA_DIR", tmp_settings.retrieval.chroma_dir)
    monkeypatch.delenv("CHROMA_HOST", raising=False)
    monkeypatch.delenv("EMBEDDING_MODEL", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        rc = load_corpus.main(
            [*argv, "--no-progress", "--chroma-dir", tmp_settings.retrieval.chroma_dir]
        )
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def _rows() -> list[dict]:
    return [json.loads(line) for line in PASSAGES.read_text().splitlines()]


# ------------------------------------------------------------------------------------------------
# reading files
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "json", "parquet"])
def test_every_format_reads_the_same_passages(tmp_path, fmt):
    df = pd.DataFrame(_rows())
    path = tmp_path / f"passages.{fmt}"
    if fmt == "csv":
        df.to_csv(path, index=False)
    elif fmt == "tsv":
        df.to_csv(path, sep="\t", index=False)
    elif fmt == "jsonl":
        df.to_json(path, orient="records", lines=True)
    elif fmt == "json":
        df.to_json(path, orient="records")
    else:
        df.to_parquet(path)
    got = load_corpus.read_passages(path)
    assert [(p["idx"], p["text"], p["source"], p["title"]) for p in got] == [
        (r["idx"], r["text"], r["source"], r["title"]) for r in _rows()
    ]
    assert len(load_corpus.read_passages(path, limit=5)) == 5


TRICKY_TEXTS = [
    '"Consideration is a bargained-for exchange," the court wrote.',
    '"A quotation that is the whole passage."',
    'The so-called "peppercorn" is enough.',
    "Promissory estoppel substitutes for consideration.",
]


def test_a_plain_tsv_whose_texts_start_with_quote_marks_loses_no_row_and_no_quote(tmp_path):
    """A TSV written without quoting (one line a passage) used to be read as quoted: a text that
    opened with a quotation mark swallowed the rows after it, and quote marks were dropped."""
    lines = ["idx\tsource\ttext", *(f"p{i}\tx\t{t}" for i, t in enumerate(TRICKY_TEXTS))]
    path = _file(tmp_path / "plain.tsv", "\n".join(lines) + "\n")
    assert [p["text"] for p in load_corpus.read_passages(path)] == TRICKY_TEXTS


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_quoted_tsv_as_pandas_writes_it_reads_back_exactly(tmp_path, suffix):
    texts = [*TRICKY_TEXTS, "a rule\nover two lines"]
    df = pd.DataFrame({"idx": [f"p{i}" for i in range(len(texts))], "text": texts})
    path = tmp_path / f"quoted.tsv{suffix}"
    df.to_csv(path, sep="\t", index=False)
    assert [p["text"] for p in load_corpus.read_passages(path)] == [t.strip() for t in texts]


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_compressed_jsonl_and_json_are_read(tmp_path, suffix):
    import bz2
    import gzip
    import lzma

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}[suffix]
    rows = _rows()[:3]
    with opener(tmp_path / f"p.jsonl{suffix}", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    with opener(tmp_path / f"p.json{suffix}", "wt", encoding="utf-8") as fh:
        json.dump(rows, fh)
    for name in (f"p.jsonl{suffix}", f"p.json{suffix}"):
        got = load_corpus.read_passages(tmp_path / name)
        assert [p["text"] for p in got] == [r["text"] for r in rows], name


def test_read_qa_uses_the_bar_exam_field_names(tmp_path):
    items = load_corpus.read_qa(QA)
    assert [q["gold_idx"] for q in items] == ["mbe_neg1", "wex_inj", "caselaw_005"]
    assert items[0]["choice_c"] == "Intent to harm" and items[0]["answer"] == "C"
    csv = tmp_path / "qa.csv"
    pd.DataFrame([json.loads(x) for x in QA.read_text().splitlines()]).to_csv(csv, index=False)
    assert load_corpus.read_qa(csv) == items
    bad = tmp_path / "bad_qa.jsonl"
    bad.write_text(json.dumps({"idx": "q9", "question": ""}) + "\n")
    with pytest.raises(load_corpus.CorpusError, match=r"bad_qa.jsonl: row 1: .*no question"):
        load_corpus.read_qa(bad)


# ------------------------------------------------------------------------------------------------
# bad input through the CLI: one line, non-zero exit, nothing stored is lost
# ------------------------------------------------------------------------------------------------


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _file(path: Path, content: str) -> Path:
    path.write_text(content)
    return path


BAD_INPUTS = {
    "missing": (lambda d: d / "nope.jsonl", r"nope.jsonl: file not found"),
    "unknown format": (lambda d: _file(d / "p.txt", "x"), r"p.txt: unknown format"),
    "no text": (
        lambda d: _write(d / "p.jsonl", [{"idx": "a", "text": "ok"}, {"idx": "b", "text": "  "}]),
        r"p.jsonl: row 2: passage 'b' has no text",
    ),
    "no id": (
        lambda d: _write(d / "p.jsonl", [{"idx": "a", "text": "ok"}, {"text": "no id here"}]),
        r"p.jsonl: row 2: no passage id",
    ),
    "duplicate ids": (
        lambda d: _write(
            d / "p.jsonl",
            [{"idx": "a", "text": "one"}, {"idx": "b", "text": "2"}, {"idx": "a", "text": "3"}],
        ),
        r"p.jsonl: row 3: duplicate passage id 'a' \(first at row 1\)",
    ),
    "empty jsonl": (lambda d: _file(d / "p.jsonl", ""), r"p.jsonl: row 1: no passages"),
    "empty csv": (lambda d: _file(d / "p.csv", ""), r"p.csv: row 1: the file is empty"),
    "csv without text column": (
        lambda d: _file(d / "p.csv", "idx,source\na,x\n"),
        r"p.csv: row 1: passage 'a' has no text",
    ),
    "broken json line": (
        lambda d: _file(d / "p.jsonl", '{"idx": "a", "text": "ok"}\n{"idx": \n'),
        r"p.jsonl: row 2: invalid JSON",
    ),
    "latin-1 jsonl": (
        lambda d: _bytes(
            d / "p.jsonl", b'{"idx": "a", "text": "ok"}\n{"idx": "b", "text": "caf\xe9"}\n'
        ),
        r"p.jsonl: row 2: not UTF-8 text",
    ),
    "json scalar": (
        lambda d: _file(d / "p.json", "42"),
        r"p.json: expected a JSON array of objects .*found int",
    ),
    "gz that is not gzip": (
        lambda d: _file(d / "p.jsonl.gz", '{"idx": "a", "text": "ok"}\n'),
        r"p.jsonl.gz: row 1: cannot decompress",
    ),
}


def _bytes(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_error_and_loses_nothing(cli, tmp_path, case):
    rc, _, _ = cli("--passages", str(PASSAGES))
    assert rc == 0
    make, pattern = BAD_INPUTS[case]
    folder = tmp_path / "in"
    folder.mkdir()
    path = make(folder)
    rc, out, err = cli("--passages", str(path))
    assert rc != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err
    rc, out, _ = cli("status", "--json")
    assert json.loads(out)["count"] == len(_rows())


def test_a_bad_row_late_in_the_file_writes_nothing(cli, tmp_path):
    rows = _rows() + [{"idx": "late", "text": ""}]
    rc, _, err = cli("--passages", str(_write(tmp_path / "p.jsonl", rows)))
    assert rc == 2 and f"row {len(rows)}" in err
    rc, out, _ = cli("status", "--json")
    assert json.loads(out)["count"] == 0


def test_unknown_command_and_unloadable_model_are_one_line_errors(
    cli, monkeypatch, tmp_settings, capsys
):
    rc, _, err = cli("frobnicate")
    assert rc == 2 and err.strip().count("\n") == 0 and "unknown command" in err
    assert cli("0")[0] == 2 and cli("status", "extra")[0] == 2  # were: 0 added, extra ignored
    monkeypatch.undo()  # the real get_embedder, and a model that cannot exist
    rc = load_corpus.main(
        ["--passages", str(PASSAGES), "--embedding-model", "legalrag-tests/no-such-model",
         "--chroma-dir", tmp_settings.retrieval.chroma_dir, "--no-progress"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert len(err) == 1 and "legalrag-tests/no-such-model" in err[0] and "Traceback" not in err[0]
    import rag_utils  # the failed load left no empty collection ("status" said it was there)

    assert not any("no-such-model" in c for c in rag_utils.existing_collections(tmp_settings))


# ------------------------------------------------------------------------------------------------
# commands
# ------------------------------------------------------------------------------------------------


def test_first_n_then_more_is_incremental_and_exact(cli, fake):
    rc, out, _ = cli("5", "--passages", str(PASSAGES))
    assert rc == 0 and "added 5 passages" in out
    rc, out, _ = cli("10", "--passages", str(PASSAGES), "--json")
    result = json.loads(out)
    assert result["added"] == 5 and result["already_stored"] == 5 and result["count"] == 10
    calls = fake.calls
    rc, out, _ = cli("10", "--passages", str(PASSAGES))
    assert "added 0 passages" in out and fake.calls == calls  # nothing re-embedded


def test_status_reports_size_model_and_sources(cli, tmp_settings):
    cli("--passages", str(PASSAGES))
    rag_utils.write_to_memory("What is battery?", "Harmful contact.", 0.7, settings=tmp_settings)
    rc, out, _ = cli("status", "--json")
    info = json.loads(out)
    assert rc == 0
    assert info["qa_memory_entries"] == 1
    assert info["count"] == 24 and info["collection"] == "passages__all-minilm-l6-v2"
    assert info["embedding_model"] == "all-MiniLM-L6-v2"
    assert info["sources"]["barexam_qa:caselaw"] == 6 and sum(info["sources"].values()) == 24
    rc, out, _ = cli("status")
    assert "passages:        24" in out and "barexam_qa:caselaw" in out
    assert "QA memory:       1 cached answer(s)" in out


def test_status_shows_which_backend_and_device_built_the_index_and_its_rate(cli, fake):
    rc, out, _ = cli("status", "--json")
    assert json.loads(out)["indexed_by"] == []  # nothing loaded yet
    fake.backend, fake.device = "onnx", "cpu"
    cli("5", "--passages", str(PASSAGES))
    cli("10", "--passages", str(PASSAGES))  # a resumed load adds to the same row
    fake.backend, fake.device = "torch", "cuda"
    cli("--passages", str(PASSAGES))
    rc, out, _ = cli("status", "--json")
    rows = {f"{r['backend']} on {r['device']}": r for r in json.loads(out)["indexed_by"]}
    assert rc == 0 and set(rows) == {"onnx on cpu", "torch on cuda"}
    assert rows["onnx on cpu"]["passages"] == 10 and rows["torch on cuda"]["passages"] == 14
    for row in rows.values():
        assert row["seconds"] > 0
        assert row["passages_per_s"] == pytest.approx(row["passages"] / row["seconds"], rel=0.01)
    rc, out, _ = cli("status")
    assert "indexed by:      onnx on cpu: 10 passages in " in out
    assert "indexed by:      torch on cuda: 14 passages in " in out and "passages/s" in out


def test_a_long_load_records_its_rate_as_it_goes_and_counts_each_passage_once(
    tmp_settings, fake, monkeypatch
):
    fake.backend, fake.device = "onnx", "cpu"
    monkeypatch.setattr(load_corpus, "RECORD_EVERY_S", 0.0)  # a record after every batch
    store = rag_utils.get_store(tmp_settings)
    records = []
    real = store.record_indexing
    monkeypatch.setattr(store, "record_indexing", lambda *a: records.append(a) or real(*a))
    passages = load_corpus.read_passages(PASSAGES)
    assert load_corpus.load_passages(passages, tmp_settings, batch_size=5, progress=False) == 24
    assert [r[2] for r in records] == [5, 5, 5, 5, 4]  # kept up to the last batch if killed
    (row,) = store.indexed_by()
    assert row["passages"] == 24
    assert row["seconds"] == pytest.approx(sum(r[3] for r in records), abs=0.01)


def test_status_with_a_typo_creates_no_store_and_no_collection(cli, tmp_settings, tmp_path):
    assert cli("--passages", str(PASSAGES))[0] == 0
    before = rag_utils.existing_collections(tmp_settings)
    rc, out, _ = cli("status", "--json", "--embedding-model", "no/such-model")
    assert rc == 0 and json.loads(out)["count"] == 0
    assert rag_utils.existing_collections(tmp_settings) == before
    missing = tmp_path / "no-such-dir"
    rc = load_corpus.main(["status", "--json", "--chroma-dir", str(missing)])
    assert rc == 0 and not missing.exists()


def test_curated_loads_every_gold_passage_plus_padding(cli, tmp_settings):
    rc, out, _ = cli("curated", "3", "--passages", str(PASSAGES), "--qa", str(QA), "--json")
    assert rc == 0 and json.loads(out)["count"] == 6
    got = {
        p["id"]
        for p in rag_utils.get_store(tmp_settings).get(["mbe_neg1", "wex_inj", "caselaw_005"])
    }
    assert got == {"mbe_neg1", "wex_inj", "caselaw_005"}
    rc, out, err = cli("curated", "--passages", str(PASSAGES), "--qa", str(QA), "--json")
    assert json.loads(out)["count"] == 24  # default padding 500 > corpus: everything
    missing_gold = _write(
        tmp_settings_path(tmp_settings) / "qa.jsonl",
        [{"idx": "x", "question": "q?", "gold_idx": "nowhere"}],
    )
    rc, _, err = cli("curated", "0", "--passages", str(PASSAGES), "--qa", str(missing_gold))
    assert rc == 0 and "1 gold passages are not in the passage files" in err


def tmp_settings_path(settings) -> Path:
    return Path(settings.retrieval.chroma_dir).parent


def test_ensure_starter_index_loads_once(tmp_settings, fake, monkeypatch, tmp_path):
    starter = tmp_path / "starter"
    starter.mkdir()
    _write(starter / "passages.jsonl", _rows())
    _write(starter / "qa.jsonl", [json.loads(x) for x in QA.read_text().splitlines()])
    monkeypatch.setattr(load_corpus, "starter_dir", lambda: starter)
    assert load_corpus.ensure_starter_index(tmp_settings) == 24
    assert load_corpus.ensure_starter_index(tmp_settings) == 0
    assert load_corpus.starter_files() == ([starter / "passages.jsonl"], [starter / "qa.jsonl"])


def test_bundled_starter_corpus_reads_cleanly():
    passage_files, qa_files = load_corpus.starter_files()
    passages = load_corpus.read_many(passage_files, load_corpus.read_passages)
    assert len(passages) >= 100
    ids = {p["idx"] for p in passages}
    if qa_files:
        qa = load_corpus.read_many(qa_files, load_corpus.read_qa)
        assert {q["gold_idx"] for q in qa if q["gold_idx"]} <= ids


# ------------------------------------------------------------------------------------------------
# default source
# ------------------------------------------------------------------------------------------------


def test_local_barexam_folder_is_the_default_source(tmp_settings, tmp_path):
    root = tmp_path / "datasets" / "barexam_qa"
    (root / "data" / "passages").mkdir(parents=True)
    (root / "data" / "qa").mkdir(parents=True)
    pd.DataFrame(_rows()).to_csv(root / "data" / "passages" / "passages.tsv", sep="\t", index=False)
    pd.DataFrame(_rows()[:2]).to_csv(
        root / "data" / "passages" / "train.tsv", sep="\t", index=False
    )
    pd.DataFrame([json.loads(x) for x in QA.read_text().splitlines()]).to_csv(
        root / "data" / "qa" / "qa.csv", index=False
    )
    s = tmp_settings.replace(datasets_dir=str(tmp_path / "datasets"))
    passages, qa = load_corpus.default_source(s)
    assert passages == [root / "data" / "passages" / "passages.tsv"]
    assert qa == [root / "data" / "qa" / "qa.csv"]
    assert len(load_corpus.read_passages(passages[0])) == 24


def test_offline_download_says_so_in_one_line_and_falls_back_to_starter(
    tmp_settings, tmp_path, monkeypatch, capsys
):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # never touch the network in tests
    s = tmp_settings.replace(datasets_dir=str(tmp_path / "empty"))
    start = time.monotonic()
    passages, _ = load_corpus.default_source(s)
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "reglab/barexam_qa" in err[0] and "--passages" in err[0] and "starter" in err[0]
    assert passages == load_corpus.starter_files()[0]


def test_help_runs_without_loading_models():
    out = subprocess.run(
        [sys.executable, "load_corpus.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    for word in ("status", "curated", "starter", "--passages", "--qa"):
        assert word in out.stdout


# ------------------------------------------------------------------------------------------------
# kill -9 in the middle of a real load, then resume
# ------------------------------------------------------------------------------------------------


def _synthetic_passages(n: int) -> list[dict]:
    rng = random.Random(7)
    words = sorted({w for r in _rows() for w in re.findall(r"[a-z]+", r["text"].lower())})
    return [
        {"idx": f"syn_{i:04d}", "source": "synthetic", "text": " ".join(rng.choices(words, k=12))}
        for i in range(n)
    ]


def _stored_ids(chroma_dir: Path) -> list[str]:
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    client = chromadb.PersistentClient(
        str(chroma_dir), settings=ChromaSettings(anonymized_telemetry=False)
    )
    col = client.get_collection("passages__all-minilm-l6-v2")
    return col.get(include=[])["ids"]


@pytest.mark.slow
def test_sigkill_mid_load_then_rerun_gives_exact_count(tmp_path):
    total = 480
    src = _write(tmp_path / "syn.jsonl", _synthetic_passages(total))
    chroma_dir = tmp_path / "chroma"
    env = {**os.environ, "CHROMA_DIR": str(chroma_dir), "EMBEDDING_MODEL": "default"}
    env.pop("CHROMA_HOST", None)
    cmd = [sys.executable, "load_corpus.py", "--passages", str(src), "--batch-size", "16"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    progress = {"n": 0}

    def watch() -> None:  # tqdm progress on stderr: "... 48/480 [...]"
        buf = b""
        while chunk := proc.stderr.read1(4096):
            buf = (buf + chunk)[-2000:]
            found = re.findall(rb"(\d+)/%d" % total, buf)
            if found:
                progress["n"] = int(found[-1])

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while progress["n"] < 64 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the loader finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    reader.join(timeout=5)
    assert proc.returncode == -signal.SIGKILL

    partial = _stored_ids(chroma_dir)
    assert 64 <= len(partial) < total
    assert len(partial) == len(set(partial))

    done = subprocess.run(
        cmd + ["--json", "--no-progress"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["count"] == total
    assert result["already_stored"] == len(partial) and result["added"] == total - len(partial)
    final = _stored_ids(chroma_dir)
    assert len(final) == total and set(final) == {f"syn_{i:04d}" for i in range(total)}


def test_download_fetches_passage_and_qa_files_of_the_hub_layout(
    tmp_settings, tmp_path, monkeypatch
):
    """The hub calls are faked (no network in tests); file selection and placement are real."""
    import huggingface_hub

    layout = [
        "README.md",
        "barexam_qa.py",
        "data/passages/train.tsv",
        "data/passages/validation.tsv",
        "data/qa/train.csv",
        "data/qa/qa.csv",
    ]
    rows = pd.DataFrame(_rows())
    fetched = []

    def fake_download(repo_id, filename, repo_type=None, local_dir=None, **kw):
        assert repo_id == "reglab/barexam_qa" and repo_type == "dataset"
        fetched.append(filename)
        dest = Path(local_dir) / filename
        dest.parent.mkdir(parents=True, exist_ok=True)
        if "passages" in filename:
            part = rows.iloc[:14] if "train" in filename else rows.iloc[10:]  # overlapping splits
            part.to_csv(dest, sep="\t", index=False)
        else:
            pd.DataFrame([json.loads(x) for x in QA.read_text().splitlines()]).to_csv(
                dest, index=False
            )
        return str(dest)

    monkeypatch.setattr(
        huggingface_hub.HfApi, "list_repo_files", lambda self, repo, repo_type=None: layout
    )
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    s = tmp_settings.replace(datasets_dir=str(tmp_path / "datasets"))
    passages, qa = load_corpus.default_source(s)
    assert sorted(fetched) == [
        "data/passages/train.tsv",
        "data/passages/validation.tsv",
        "data/qa/qa.csv",
    ]
    root = tmp_path / "datasets" / "barexam_qa"
    assert passages == [root / "data/passages/train.tsv", root / "data/passages/validation.tsv"]
    assert qa == [root / "data/qa/qa.csv"]
    merged = load_corpus.read_many(passages, load_corpus.read_passages)
    assert [p["idx"] for p in merged] == [r["idx"] for r in _rows()]  # overlap kept once
    assert load_corpus.default_source(s) == (passages, qa)  # now local: no second download
    assert len(fetched) == 3


def test_a_failure_mid_load_keeps_every_batch_embedded_before_it(tmp_settings, fake, monkeypatch):
    """Batches are committed on a worker thread while the next one embeds; a failure in the
    third batch's embedding still leaves the first two stored, and a rerun adds the rest."""
    passages = [{"idx": f"p{i}", "text": f"passage {i} about negligence"} for i in range(10)]
    real = rag_utils.embed_passages
    calls = []

    def flaky(texts, settings):
        calls.append(len(texts))
        if len(calls) == 3:
            raise RuntimeError("embedder crashed")
        return real(texts, settings)

    monkeypatch.setattr(rag_utils, "embed_passages", flaky)
    with pytest.raises(RuntimeError, match="embedder crashed"):
        load_corpus.load_passages(passages, tmp_settings, batch_size=3, progress=False)
    assert rag_utils.corpus_count(tmp_settings) == 6
    monkeypatch.setattr(rag_utils, "embed_passages", real)
    assert load_corpus.load_passages(passages, tmp_settings, batch_size=3, progress=False) == 4
    assert rag_utils.corpus_count(tmp_settings) == 10


def test_an_upsert_failure_is_raised_not_lost(tmp_settings, fake, monkeypatch):
    passages = [{"idx": f"p{i}", "text": f"passage {i} about battery"} for i in range(4)]
    store = rag_utils.get_store(tmp_settings)

    def broken(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(store, "upsert", broken)
    with pytest.raises(OSError, match="disk full"):
        load_corpus.load_passages(passages, tmp_settings, batch_size=2, progress=False)
