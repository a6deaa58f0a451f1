"""The real-model set-up of ``make eval``: the GGUF metadata reader and the template edit."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from worker.dev.realmodel._gguf import GGUFError, read_metadata_string
from worker.dev.realmodel._setup import SetupError, fenced_tool_template

# The tool-call lines of Qwen2.5's embedded chat template, as it ships.
QWEN_TOOL_LINES = (
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    '{{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "{{- '}\\n</tool_call>' }}\n"
)


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path: Path, template: str) -> None:
    """A GGUF header with an int, a string array and the chat template (no tensors)."""
    pairs = [
        _string("general.file_type") + struct.pack("<I", 4) + struct.pack("<I", 15),
        _string("tokenizer.ggml.tokens")
        + struct.pack("<I", 9)
        + struct.pack("<IQ", 8, 2)
        + _string("<|im_start|>")
        + _string("hello"),
        _string("tokenizer.chat_template") + struct.pack("<I", 8) + _string(template),
    ]
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs)) + b"".join(pairs))


def test_the_chat_template_is_read_past_other_metadata(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    write_gguf(model, QWEN_TOOL_LINES)
    assert read_metadata_string(str(model), "tokenizer.chat_template") == QWEN_TOOL_LINES
    with pytest.raises(GGUFError, match=r"no general\.name in the metadata"):
        read_metadata_string(str(model), "general.name")
    with pytest.raises(GGUFError, match=r"tokenizer\.ggml\.tokens is not a string"):
        read_metadata_string(str(model), "tokenizer.ggml.tokens")


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path) -> None:
    other = tmp_path / "weights.bin"
    other.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(GGUFError, match=r"weights.bin: not a GGUF file \(bad magic\)"):
        read_metadata_string(str(other), "tokenizer.chat_template")


def test_the_tool_call_wrapper_becomes_a_json_fence() -> None:
    fenced = fenced_tool_template(QWEN_TOOL_LINES)
    assert "<tool_call>" not in fenced and "</tool_call>" not in fenced
    assert "inside a ```json code block:\\n```json\\n{" in fenced
    assert '{{- \'\\n```json\\n{"name": "\' }}' in fenced
    assert "{{- '}\\n```' }}" in fenced


def test_a_template_without_the_qwen_wrapper_is_refused() -> None:
    with pytest.raises(SetupError, match=r"not the Qwen2\.5 template this edit is for"):
        fenced_tool_template("{{ messages }}")
