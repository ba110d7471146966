"""The embedded model: assembly from chunk packages (fake parts), verification, and one real run."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

import local_llm
from local_llm import LOCAL_MODELS, LocalModelError, LocalModelSpec, LocalTimings, ensure_model


def _make_parts(root: Path, prefix: str, chunks: list[bytes]) -> tuple[str, ...]:
    """Fake chunk packages laid out like the real ones: pkg/__init__.py + pkg/data/partNN.bin."""
    names = []
    for i, chunk in enumerate(chunks, start=1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        (pkg / "__init__.py").write_text(
            "import os\n"
            "def get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{i:02d}.bin')\n"
        )
        names.append(f"{prefix}{i}")
    return tuple(names)


@pytest.fixture
def fake_model(tmp_path, monkeypatch, tmp_settings):
    chunks = [os.urandom(1000), os.urandom(2000), b"tail"]
    prefix = f"fakepart_{tmp_path.name.replace('-', '_')}_"
    names = _make_parts(tmp_path / "site", prefix, chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = LocalModelSpec(
        name="fake",
        filename="fake.gguf",
        alias="fake-model",
        part_modules=names,
        sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
        extra="local",
    )
    monkeypatch.setitem(LOCAL_MODELS, "fake", spec)
    settings = tmp_settings.replace(local_model_dir=str(tmp_path / "models"))
    yield spec, b"".join(chunks), settings
    for name in names:
        sys.modules.pop(name, None)


def test_parts_are_assembled_in_order_and_verified(fake_model):
    spec, content, tmp_settings = fake_model
    timings = LocalTimings()
    path = ensure_model("fake", tmp_settings, timings)
    assert path.read_bytes() == content
    assert path.parent == Path(tmp_settings.llm.local_model_dir)
    assert (path.parent / "fake.gguf.verified.json").is_file()
    assert timings.assembled and timings.assembly_s > 0
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_second_start_does_not_rehash(fake_model, monkeypatch):
    _, _, tmp_settings = fake_model
    ensure_model("fake", tmp_settings)

    def no_hashing(path):
        raise AssertionError("re-hashed a verified model")

    monkeypatch.setattr(local_llm, "_sha256", no_hashing)
    timings = LocalTimings()
    ensure_model("fake", tmp_settings, timings)
    assert not timings.assembled


def test_changed_file_is_rechecked_and_rebuilt(fake_model):
    spec, content, tmp_settings = fake_model
    path = ensure_model("fake", tmp_settings)
    path.write_bytes(b"corrupted")
    timings = LocalTimings()
    assert ensure_model("fake", tmp_settings, timings).read_bytes() == content
    assert timings.assembled


def test_hash_mismatch_is_a_clear_error_and_leaves_no_file(fake_model, monkeypatch):
    spec, _, tmp_settings = fake_model
    monkeypatch.setitem(
        LOCAL_MODELS, "fake", LocalModelSpec(**{**spec.__dict__, "sha256": "0" * 64})
    )
    with pytest.raises(LocalModelError, match="sha256"):
        ensure_model("fake", tmp_settings)
    assert list(Path(tmp_settings.llm.local_model_dir).glob("*.gguf")) == []
    assert not [
        p for p in Path(tmp_settings.llm.local_model_dir).iterdir() if p.name.endswith(".tmp")
    ]


def test_missing_packages_name_the_install_command(tmp_settings, tmp_path, monkeypatch):
    tmp_settings = tmp_settings.replace(local_model_dir=str(tmp_path / "models"))
    spec = LocalModelSpec("gone", "gone.gguf", "gone", ("no_such_part_pkg1",), "0" * 64, "local")
    monkeypatch.setitem(LOCAL_MODELS, "gone", spec)
    with pytest.raises(LocalModelError, match=r'pip install -e "\.\[local\]"'):
        ensure_model("gone", tmp_settings)


def test_unknown_local_model(tmp_settings, tmp_path):
    tmp_settings = tmp_settings.replace(local_model_dir=str(tmp_path / "models"))
    with pytest.raises(LocalModelError, match="local-small"):
        ensure_model("nope", tmp_settings)


# ------------------------------------------------------------------------------------------------
# The real embedded model
# ------------------------------------------------------------------------------------------------


def _local_extra_installed() -> bool:
    needed = ["xllamacpp", *LOCAL_MODELS["local"].part_modules]
    return all(importlib.util.find_spec(m) is not None for m in needed)


class Classification(BaseModel):
    query_type: Literal["simple", "multi_hop"]


@pytest.mark.slow
@pytest.mark.local_llm
@pytest.mark.skipif(not _local_extra_installed(), reason='needs pip install -e ".[local]"')
def test_embedded_model_answers_schema_valid_json():
    import llm_config
    from settings import Settings

    settings = Settings.from_env(env={"LLM_CACHE": "0"})  # default provider: local
    client = llm_config.LLMClient(settings)
    messages = [
        (
            "system",
            "Classify a legal research question. simple = one legal rule answers it; "
            "multi_hop = it needs several rules combined.",
        ),
        ("user", "Question: What is the statute of limitations for breach of contract?"),
    ]
    t0 = time.perf_counter()
    res = client.invoke(messages, role="classify", schema=Classification, max_tokens=64)
    assert time.perf_counter() - t0 < 240
    assert res.parse_error is None, res.text
    assert res.parsed.query_type in {"simple", "multi_hop"}
    assert res.output_tokens and res.input_tokens
    server = local_llm.get_local_server("local", settings)
    assert server.base_url.startswith("http://127.0.0.1:")
    assert local_llm._servers["local"] is server
    # The server is reused: a second call does not start another one.
    res2 = client.invoke(messages, role="classify", schema=Classification, max_tokens=64)
    assert local_llm.get_local_server("local", settings) is server
    assert res2.parsed is not None
    assert res2.cached_prompt_tokens  # the shared prefix came from the server's prompt cache


def test_prompt_states_are_restored_once_saved_once_and_pruned(tmp_path, monkeypatch):
    def server() -> local_llm.LocalServer:
        made = local_llm.LocalServer(
            model="m", base_url="http://127.0.0.1:1/v1", threads=1, ctx_size=512,
            timings=LocalTimings(), prompt_states=tmp_path,
        )  # fmt: skip
        monkeypatch.setattr(made, "_slot_action", act)
        return made

    actions: list[str] = []

    def act(action: str, name: str) -> None:  # llama.cpp writes the state under the name given
        actions.append(action)
        if action == "save":
            (tmp_path / name).write_bytes(b"state")

    monkeypatch.setattr(local_llm, "PROMPT_STATES", 2)
    first = server()
    for _ in range(2):
        with first.serving("system A"):
            pass
    assert actions == ["save"]  # saved after the first request, then kept
    [state_a] = [p.name for p in tmp_path.iterdir()]
    assert state_a.endswith(".bin")  # renamed from its partial name
    # A new process (a new server) restores the saved state before its first request only.
    again, actions[:] = server(), []
    for _ in range(2):
        with again.serving("system A"):
            pass
    assert actions == ["restore"]
    # A failed request saves nothing; at most PROMPT_STATES states stay, the oldest go.
    with pytest.raises(RuntimeError), again.serving("system B"):
        raise RuntimeError("the call failed")
    assert [p.name for p in tmp_path.iterdir()] == [state_a]
    os.utime(tmp_path / state_a, (time.time() - 60,) * 2)
    for system in ["system B", "system C"]:
        with again.serving(system):
            pass
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 2 and state_a not in names


_FIRST_CALL = """
import sys
from typing import Literal
from pydantic import BaseModel
import llm_config
from settings import Settings

class Classification(BaseModel):
    query_type: Literal["simple", "multi_hop"]

client = llm_config.LLMClient(Settings.from_env(env={"LLM_CACHE": "0"}))
system = f"Classify a legal research question (prompt-state test {sys.argv[1]}). " * 20
messages = [("system", system), ("user", sys.argv[2])]
res = client.invoke(messages, role="classify", schema=Classification, max_tokens=64)
print(res.cached_prompt_tokens or 0)
"""


@pytest.mark.slow
@pytest.mark.local_llm
@pytest.mark.skipif(not _local_extra_installed(), reason='needs pip install -e ".[local]"')
def test_a_new_process_reads_the_system_prompt_from_the_saved_prompt_state(tmp_path):
    """Each run starts its own server: without the saved state, its first call of a role reads
    the whole system prompt again."""
    import subprocess

    from settings import Settings

    model_dir = Path(Settings.from_env(env={}).llm.local_model_dir)
    before = set(model_dir.glob("prompt-states/*/*.bin"))
    tag = f"{os.getpid()}-{time.time_ns()}"  # a system prompt no earlier run has seen
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}

    def first_call(question: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_CALL, tag, question],
            capture_output=True, text=True, env=env, timeout=600, check=True,
        )  # fmt: skip
        return int(out.stdout.split()[-1])

    try:
        assert first_call("Question: What is the mailbox rule?") == 0
        assert first_call("Question: Is an oral sale of a $2,400 motorcycle enforceable?") > 200
    finally:
        for path in set(model_dir.glob("prompt-states/*/*.bin")) - before:
            path.unlink()
