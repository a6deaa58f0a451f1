"""Read one string from a GGUF file's metadata (the embedded chat template).

GGUF starts with a little-endian header (magic, version, tensor count, key/value count) and
the key/value pairs. Only the standard library is used so that the set-up runs before the
project's virtualenv exists.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

_MAGIC = b"GGUF"
_STRING = 8
_ARRAY = 9
# Fixed-size GGUF value types and their widths in bytes.
_FIXED_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class GGUFError(ValueError):
    """The file is not a GGUF file, or lacks the requested key."""


def read_metadata_string(path: str, key: str) -> str:
    """Return the string value of ``key`` in the GGUF file at ``path``."""
    with open(path, "rb") as stream:
        if stream.read(4) != _MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (bad magic)")
        (version,) = struct.unpack("<I", stream.read(4))
        if version < 2:
            raise GGUFError(f"{path}: GGUF version {version} is not supported (need 2 or later)")
        _tensors, pairs = struct.unpack("<QQ", stream.read(16))
        for _ in range(pairs):
            name = _read_string(stream)
            (value_type,) = struct.unpack("<I", stream.read(4))
            if name == key:
                if value_type != _STRING:
                    raise GGUFError(f"{path}: {key} is not a string (type {value_type})")
                return _read_string(stream)
            _skip_value(stream, value_type)
    raise GGUFError(f"{path}: no {key} in the metadata")


def _read_string(stream: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", stream.read(8))
    return stream.read(length).decode("utf-8")


def _skip_value(stream: BinaryIO, value_type: int) -> None:
    if value_type == _STRING:
        (length,) = struct.unpack("<Q", stream.read(8))
        stream.seek(length, 1)
    elif value_type == _ARRAY:
        item_type, count = struct.unpack("<IQ", stream.read(12))
        if item_type in _FIXED_WIDTH:
            stream.seek(_FIXED_WIDTH[item_type] * count, 1)
        else:
            for _ in range(count):
                _skip_value(stream, item_type)
    elif value_type in _FIXED_WIDTH:
        stream.seek(_FIXED_WIDTH[value_type], 1)
    else:
        raise GGUFError(f"unknown GGUF value type {value_type}")
