"""Settings: CLI flag > environment > default, with clear errors for bad values."""

from pathlib import Path

import pytest

from settings import Settings, SettingsError

REPO = Path(__file__).resolve().parent.parent


def test_defaults_are_the_offline_default():
    s = Settings.from_env(env={})
    assert s.llm.provider == "local"
    assert s.retrieval.embedding_model == "default"
    assert s.retrieval.reranker == "auto"
    assert s.retrieval.chroma_host is None


def test_environment_overrides_defaults_and_flags_override_environment():
    env = {"LLM_PROVIDER": "groq", "RETRIEVAL_K": "7", "LLM_CACHE": "yes", "CHROMA_HOST": ""}
    s = Settings.from_env(env=env)
    got = (s.llm.provider, s.agent.retrieval_k, s.llm.cache, s.retrieval.chroma_host)
    assert got == ("groq", 7, True, None)
    s = Settings.from_env(env=env, llm_provider="openai", retrieval_k=None)
    assert s.llm.provider == "openai"
    assert s.agent.retrieval_k == 7  # a flag left unset (None) does not override


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"RETRIEVAL_K": "five"}, "RETRIEVAL_K='five': expected a whole number"),
        ({"LLM_CACHE": "maybe"}, "LLM_CACHE"),
        ({"RERANKER": "colbert"}, "RERANKER"),
        ({"LEAN_GATE": "3"}, "LEAN_GATE"),
        ({"MAX_STEPS": "0"}, "MAX_STEPS=0: must be at least 1"),
        # accepted, then every call failed at run time ("exceeds the available context size")
        ({"LOCAL_CTX_SIZE": "10"}, "LOCAL_CTX_SIZE=10: must be at least 2048"),
    ],
)
def test_bad_values_name_the_variable(env, fragment):
    with pytest.raises(SettingsError, match=fragment):
        Settings.from_env(env=env)


def test_secrets_are_read_by_name_and_never_shown_in_repr():
    s = Settings.from_env(env={"GROQ_API_KEY": "sk-secret-123", "LLM_API_KEY": "sk-own-456"})
    assert s.secret("GROQ_API_KEY") == "sk-secret-123"
    assert s.secret("MISSING_KEY") is None
    assert s.llm.api_key == "sk-own-456"
    assert "sk-secret-123" not in repr(s) and "sk-own-456" not in repr(s)


def test_settings_are_named_by_their_variable_in_flags_replace_and_records():
    """The groups are for reading; a user names a setting by its variable, in any case."""
    s = Settings.from_env(env={"LLM_MAX_RETRIES": "2"}, retrieval_k=3, filter_court="ca9")
    assert (s.llm.max_retries, s.agent.retrieval_k, s.filters.court) == (2, 3, "ca9")
    changed = s.replace(llm_max_retries=0, datasets_dir="/sets")
    assert (changed.llm.max_retries, changed.data.datasets_dir, changed.agent.retrieval_k) == (
        0,
        "/sets",
        3,
    )
    assert s.llm.max_retries == 2
    assert changed.flat()["llm_max_retries"] == 0 and changed.flat()["datasets_dir"] == "/sets"
    with pytest.raises(TypeError, match="unknown settings"):
        Settings.from_env(env={}, max_retries=1)  # a field's name inside its group is not a setting
    with pytest.raises(TypeError, match="unknown settings"):
        s.replace(provider="groq")


def test_env_example_documents_every_setting():
    import re
    from pathlib import Path

    from settings import VARIABLES

    text = (Path(__file__).resolve().parent.parent / ".env.example").read_text()
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", text, re.MULTILINE))
    names = {name.upper() for name in VARIABLES}
    assert names - documented == set()
    assert documented - names - {n for n in documented if n.endswith("_API_KEY")} == set()


def test_runtime_data_defaults_to_the_user_cache_not_the_working_folder(tmp_path):
    """The index, QA memory, LLM cache and model live under $XDG_CACHE_HOME/legalragagent, so
    nothing is written below the project folder that `langgraph dev` watches."""
    s = Settings.from_env(env={"XDG_CACHE_HOME": str(tmp_path)})
    data = tmp_path / "legalragagent"
    assert Path(s.retrieval.chroma_dir) == data / "chroma_db"
    assert Path(s.llm.cache_path) == data / "llm_cache.sqlite"
    assert Path(s.llm.local_model_dir) == data / "models"
    default = Settings.from_env(env={})
    for path in (default.retrieval.chroma_dir, default.llm.cache_path, default.llm.local_model_dir):
        assert Path(path).is_absolute() and REPO not in Path(path).parents
    # An explicit folder still wins (CHROMA_DIR=chroma_db keeps the index in the project).
    s = Settings.from_env(env={"XDG_CACHE_HOME": str(tmp_path), "CHROMA_DIR": "chroma_db"})
    assert s.retrieval.chroma_dir == "chroma_db"
