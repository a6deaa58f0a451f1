"""Fitting the conversation into the model's context window, oldest content first.

A request longer than the window is an API error at best (the provider refuses it) and a
silently cut prompt at worst (a local server drops its start). So before each call the
loop cuts, with a marker the model reads: first the oldest tool outputs (never the
newest message), then, when that is not enough, the oldest part of the longest message,
kept whole at its head (the instructions, the post) and at its tail (the newest comments).

A message is redacted whole before it is cut: the model's own earlier turns and steering
text reach the redactor only at the model boundary, after this cut, and a secret cut in
half is a prefix the redactor no longer recognises (redact, then cut).
"""

from __future__ import annotations

from collections.abc import Callable

from worker.loop._contract import Redact
from worker.models import Message

STUB = "[tool output of {chars} characters removed to fit the model's context window]"
CUT_MARKER = (
    "\n[… {chars} characters of older content left out to fit the model's context window …]\n"
)
# What a message keeps at its head when its middle is cut: the task's instructions.
_HEAD_CHARS = 1_500
# A cut takes a little more than the excess, so the next estimate does not fall just short.
_CUT_SLACK_CHARS = 200
_MIN_CUTTABLE_CHARS = 400


def fit_window(
    messages: list[Message],
    *,
    over_by: Callable[[], int],
    chars_per_token: float,
    redact: Redact,
    changed: Callable[[int], None] | None = None,
) -> int:
    """Cut ``messages`` in place until ``over_by()`` (tokens over the window) is <= 0.

    Returns how many cuts were made; stops when nothing is left to cut (the request is
    then sent as it is, and the answer gets what the window leaves). ``changed`` is told
    the index of each message cut, before ``over_by`` is asked again.
    """
    cuts = 0
    while (excess := over_by()) > 0:
        index = _stub_oldest_tool_output(messages)
        if index is None:
            index = _cut_longest(messages, int(excess * chars_per_token) + _CUT_SLACK_CHARS, redact)
        if index is None:
            break
        if changed is not None:
            changed(index)
        cuts += 1
    return cuts


def _stub_oldest_tool_output(messages: list[Message]) -> int | None:
    """The index of the tool output stubbed; None when none is left to stub."""
    for index, message in enumerate(messages[:-1]):
        if message.role == "tool" and not message.content.startswith("[tool output of"):
            message.content = STUB.format(chars=len(message.content))
            return index
    return None


def _cut_longest(messages: list[Message], chars: int, redact: Redact) -> int | None:
    """Cut ``chars`` from the longest message, redacted whole first, just after its head;
    its index, or None if none can be cut."""
    if not messages:
        return None
    index = max(range(len(messages)), key=lambda at: len(messages[at].content))
    longest = messages[index]
    if len(longest.content) < _MIN_CUTTABLE_CHARS:
        return None
    content = redact(longest.content)
    head = min(_HEAD_CHARS, len(content) // 4)
    # At most what leaves the head and a quarter of the message at the tail.
    removed = min(chars, len(content) - head - len(content) // 4)
    if removed > 0:
        content = content[:head] + CUT_MARKER.format(chars=removed) + content[head + removed :]
    elif content == longest.content:
        return None
    longest.content = content
    return index
