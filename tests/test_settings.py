"""Settings: CLI flag > environment > default, with clear errors for bad values."""

from pathlib import Path

import pytest

from settings import Settings, SettingsError

REPO = Path(__file__).resolve().parent.parent


def test_defaults_are_the_offline_default():
    s = Settings.from_env(env={})
    assert s.llm_provider == "local"
    assert s.embedding_model == "default"
    assert s.reranker == "auto"
    assert s.chroma_host is None


def test_environment_overrides_defaults_and_flags_override_environment():
    env = {"LLM_PROVIDER": "groq", "RETRIEVAL_K": "7", "LLM_CACHE": "yes", "CHROMA_HOST": ""}
    s = Settings.from_env(env=env)
    assert (s.llm_provider, s.retrieval_k, s.llm_cache, s.chroma_host) == ("groq", 7, True, None)
    s = Settings.from_env(env=env, llm_provider="openai", retrieval_k=None)
    assert s.llm_provider == "openai"
    assert s.retrieval_k == 7  # a flag left unset (None) does not override


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"RETRIEVAL_K": "five"}, "RETRIEVAL_K"),
        ({"LLM_CACHE": "maybe"}, "LLM_CACHE"),
        ({"RERANKER": "colbert"}, "RERANKER"),
        ({"LEAN_GATE": "3"}, "LEAN_GATE"),
        ({"MAX_STEPS": "0"}, "MAX_STEPS"),
    ],
)
def test_bad_values_name_the_variable(env, fragment):
    with pytest.raises(SettingsError, match=fragment):
        Settings.from_env(env=env)


def test_secrets_are_read_by_name_and_never_shown_in_repr():
    s = Settings.from_env(env={"GROQ_API_KEY": "sk-secret-123"})
    assert s.secret("GROQ_API_KEY") == "sk-secret-123"
    assert s.secret("MISSING_KEY") is None
    assert "sk-secret-123" not in repr(s)


def test_env_example_documents_every_setting():
    import dataclasses
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / ".env.example").read_text()
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", text, re.MULTILINE))
    names = {f.name.upper() for f in dataclasses.fields(Settings) if f.name != "environ"}
    assert names - documented == set()
    assert documented - names - {n for n in documented if n.endswith("_API_KEY")} == set()


def test_runtime_data_defaults_to_the_user_cache_not_the_working_folder(tmp_path):
    """The index, QA memory, LLM cache and model live under $XDG_CACHE_HOME/legalragagent, so
    nothing is written below the project folder that `langgraph dev` watches."""
    s = Settings.from_env(env={"XDG_CACHE_HOME": str(tmp_path)})
    data = tmp_path / "legalragagent"
    assert Path(s.chroma_dir) == data / "chroma_db"
    assert Path(s.llm_cache_path) == data / "llm_cache.sqlite"
    assert Path(s.local_model_dir) == data / "models"
    default = Settings.from_env(env={})
    for path in (default.chroma_dir, default.llm_cache_path, default.local_model_dir):
        assert Path(path).is_absolute() and REPO not in Path(path).parents
    # An explicit folder still wins (CHROMA_DIR=chroma_db keeps the index in the project).
    s = Settings.from_env(env={"XDG_CACHE_HOME": str(tmp_path), "CHROMA_DIR": "chroma_db"})
    assert s.chroma_dir == "chroma_db"
