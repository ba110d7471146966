"""The module graph: no import cycles among the project's modules, nodes.py depends only on the
run context, the state, the prompts, mc and the LLM layer's error types, and the response cache
on no project module."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = {p.stem: p for p in REPO.glob("*.py")}


def imports_of(module: str) -> dict[str, set[str]]:
    """Project modules ``module`` imports, each with the names it takes from them."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    out.setdefault(alias.name, set()).add("*")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
            out.setdefault(node.module, set()).update(a.name for a in node.names)
    return out


def test_project_modules_import_each_other_without_cycles():
    graph = {m: set(imports_of(m)) for m in MODULES}
    state: dict[str, str] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "active"
        for dep in graph[m]:
            assert state.get(dep) != "active", " -> ".join([*path, dep])
            if dep not in state:
                visit(dep, [*path, dep])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_nodes_depend_only_on_context_state_prompts_mc_answer_and_llm_errors():
    deps = imports_of("nodes")
    allowed = {"context", "state", "question", "prompts", "mc", "answer", "llm_config", "providers"}
    assert set(deps) <= allowed
    assert deps.get("llm_config", set()) <= {"LLMCallError", "LLMDeadlineError"}
    assert deps.get("providers", set()) <= {"LLMConfigError"}


def test_the_run_context_stands_below_the_loader():
    assert "load_corpus" not in imports_of("context")


def test_the_embedded_model_needs_nothing_of_retrieval():
    assert not {"rag_utils", "load_corpus", "context"} & set(imports_of("local_llm"))


def test_the_response_cache_imports_no_project_module():
    """llm_cache stores what LLMClient gives it; it needs neither the client nor the settings."""
    assert imports_of("llm_cache") == {}


ENTRY_POINTS = {
    ("context", "default_context"),
    ("eval_common", "eval_settings"),
    ("mcp_server", "_settings"),
}
"""Functions besides a CLI's ``main`` that build settings from the environment: the context of a
LangGraph Studio run and the settings of a tool call (an MCP client's or a LangChain agent's), which
bring none, and the settings of the eval scripts' CLIs."""


def settings_calls(module: str) -> list[tuple[str, str, int]]:
    """(enclosing function, callee, line) of every call in ``module`` that builds settings from the
    environment (``Settings.from_env``) or falls back to the process-wide ones."""
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                callee = child.func
                name = (
                    callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
                )
                if name in ("from_env", "settings_or_current"):
                    found.append((function, name, child.lineno))
            visit(child, function)

    visit(ast.parse(MODULES[module].read_text()), "<module>")
    return found


def test_no_module_falls_back_to_process_wide_settings_and_only_entry_points_read_the_env():
    assert {"legal_graph", "load_corpus", "rag_utils", "nodes", "eval_comprehensive"} <= set(
        MODULES
    )
    for module in sorted(set(MODULES) - {"settings"}):
        for function, callee, line in settings_calls(module):
            where = f"{module}.py:{line} in {function}"
            assert callee == "from_env", f"{where} falls back to the process-wide settings"
            assert function == "main" or (module, function) in ENTRY_POINTS, (
                f"{where} builds settings from the environment outside an entry point"
            )


def test_the_settings_check_sees_a_fallback_and_a_library_read_of_the_env(tmp_path, monkeypatch):
    fake = tmp_path / "fake_module.py"
    fake.write_text(
        "def search(query, settings=None):\n"
        "    s = settings_or_current(settings)\n"
        "def load():\n"
        "    return Settings.from_env()\n"
        "def main():\n"
        "    return Settings.from_env()\n"
    )
    monkeypatch.setitem(MODULES, "fake_module", fake)
    assert settings_calls("fake_module") == [
        ("search", "settings_or_current", 2),
        ("load", "from_env", 4),
        ("main", "from_env", 6),
    ]
