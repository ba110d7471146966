"""The module graph: no import cycles among the project's modules, and nodes.py depends only on
the run context, the state, the prompts, mc and the LLM layer's error types."""

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
    assert set(deps) <= {"context", "state", "prompts", "mc", "answer", "llm_config"}
    assert deps.get("llm_config", set()) <= {"LLMCallError", "LLMConfigError", "LLMDeadlineError"}


def test_library_modules_never_fall_back_to_process_wide_settings():
    for name in ("rag_utils", "llm_config", "local_llm", "nodes", "context", "answer", "mc"):
        text = MODULES[name].read_text()
        assert "settings_or_current(" not in text and "get_settings()" not in text, name
