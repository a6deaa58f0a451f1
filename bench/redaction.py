"""What redaction costs: one 100 KB prompt, and every model request of a growing conversation.

"before" is the redactor as it was (exact values, case-sensitive, no model boundary);
"after" also catches values spelled out with separators or in another case, and runs
on every model request through ``ModelBoundary``, which redacts each text once.
"""

from __future__ import annotations

import random
import re
import string
import time
from collections.abc import Callable

import anyio

from bench._report import Summary, Table
from bench._size import Size
from worker.models import Message, ModelBoundary, ModelRequest, ModelResponse
from worker.redaction import MASK, Redactor

PROMPT_CHARS = 100_000
SECRETS = 6
STEPS = 20
TOOL_RESULT_CHARS = 5_000
_WORDS = [
    "the",
    "agent",
    "read",
    "a",
    "thread",
    "about",
    "redis",
    "queues",
    "and",
    "rq",
    "workers",
    "then",
    "searched",
    "the",
    "hub",
    "for",
    "retries",
    "timeouts",
    "leases",
    "metrics",
    "grants",
    "tools",
    "posts",
    "comments",
    "https://example.org/x?q=1",
    "2026-11-24",
    "{json:",
    "[1,",
    "2]}",
    "<b>markup</b>",
    "user@example.org",
    "C'est-à-dire",
]


class _Before:
    """The redactor before this change: exact known values, the same shape patterns."""

    def __init__(self, secrets: list[str]) -> None:
        from worker import redaction

        self._known = re.compile("|".join(re.escape(s) for s in sorted(secrets, key=len)))
        self._shapes = redaction._SECRET_SHAPES
        self._url = re.compile(r"(?P<scheme>[a-z][a-z0-9+.\-]*://[^\s:/@]+:)[^\s@/]+(?=@)", re.I)
        self._bearer = re.compile(
            r"(?P<prefix>\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=\-]{8,}", re.I
        )

    def __call__(self, text: str) -> str:
        text = self._known.sub(MASK, text)
        text = self._shapes.sub(MASK, text)
        text = self._url.sub(lambda m: m.group("scheme") + MASK, text)
        return self._bearer.sub(lambda m: m.group("prefix") + MASK, text)


def secrets_and_prose(seed: int = 7) -> tuple[list[str], str]:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits
    secrets = [
        f"key-{n}-" + "".join(rng.choice(alphabet) for _ in range(32)) for n in range(SECRETS)
    ]
    words: list[str] = []
    length = 0  # a running total: summing the words on every turn took seconds
    while length < PROMPT_CHARS:
        words.append(rng.choice(_WORDS))
        length += len(words[-1]) + 1
    return secrets, " ".join(words)[:PROMPT_CHARS]


def planted(prose: str, secrets: list[str]) -> str:
    """The prose with each secret in it once, half of them spelled out with spaces."""
    step = len(prose) // (len(secrets) + 1)
    parts, start = [], 0
    for n, secret in enumerate(secrets):
        cut = step * (n + 1)
        parts += [prose[start:cut], " ".join(secret) if n % 2 else secret]
        start = cut
    return "".join([*parts, prose[start:]])


def per_call_ms(redact: Callable[[str], str], text: str, runs: int) -> Summary:
    redact(text)  # compiled, warmed
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        redact(text)
        samples.append((time.perf_counter() - started) * 1000)
    return Summary.of(samples)


def prompt_table(runs: int) -> Table:
    secrets, prose = secrets_and_prose()
    texts = {
        "prose, no secret": prose,
        "6 secrets planted (3 spelled out)": planted(prose, secrets),
        "near misses (secret minus its last char, x1000)": " ".join(
            " ".join(secrets[0][:-1]) for _ in range(PROMPT_CHARS // (2 * len(secrets[0])))
        ),
    }
    table = Table(
        f"redacting one {PROMPT_CHARS // 1000} KB prompt, {SECRETS} known secrets (ms per call)",
        ["text", "before median", "before min-max", "after median", "after min-max", "masked"],
    )
    before, after = _Before(secrets), Redactor(secrets)
    for label, text in texts.items():
        masked = f"{before(text).count(MASK)} -> {after(text).count(MASK)}"
        table.add(
            label,
            *per_call_ms(before, text, runs).cells(2),
            *per_call_ms(after, text, runs).cells(2),
            masked,
        )
    table.notes.append("masked: values masked before -> after (before misses spelled-out ones)")
    return table


class _Echo:
    provider = "bench"
    name = "echo"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(text="ok")


def conversation_table(runs: int) -> Table:
    secrets, prose = secrets_and_prose(seed=11)
    redactor = Redactor(secrets)
    thread = Message(role="user", content=planted(prose[:20_000], secrets))

    def conversation(steps: int) -> list[Message]:
        messages = [thread]
        for n in range(steps):
            start = (n * TOOL_RESULT_CHARS) % (len(prose) - TOOL_RESULT_CHARS)
            messages.append(Message(role="tool", content=prose[start : start + TOOL_RESULT_CHARS]))
        return messages

    requests = [ModelRequest(system="s" * 2_000, messages=conversation(n)) for n in range(STEPS)]

    def through_boundary() -> list[float]:
        boundary = ModelBoundary(_Echo(), redact=redactor, wrap_tool_result=lambda t, c: c)
        costs = []
        for request in requests:
            started = time.perf_counter()
            anyio.run(boundary.complete, request)
            costs.append((time.perf_counter() - started) * 1000)
        return costs

    def whole_request_each_time() -> list[float]:
        costs = []
        for request in requests:
            started = time.perf_counter()
            redactor(request.system)
            for message in request.messages:
                redactor(message.content)
            costs.append((time.perf_counter() - started) * 1000)
        return costs

    table = Table(
        f"redaction per model request, a {STEPS}-step conversation ({TOOL_RESULT_CHARS // 1000} "
        "KB tool result per step, 20 KB thread) (ms)",
        ["variant", "first request", "later requests median", "last request", "all requests"],
    )
    table.add("before: no redaction at the model boundary", "0", "0", "0", "0")
    for label, measure in [
        ("after: ModelBoundary (each text once)", through_boundary),
        ("for comparison: the whole request every time", whole_request_each_time),
    ]:
        samples = [measure() for _ in range(runs)]
        per_step = [min(run[i] for run in samples) for i in range(STEPS)]
        table.add(
            label,
            f"{per_step[0]:.2f}",
            f"{Summary.of(per_step[1:]).median:.2f}",
            f"{per_step[-1]:.2f}",
            f"{sum(per_step):.1f}",
        )
    table.notes.append("ModelBoundary's time includes building the request copy and an event loop")
    return table


def benchmark(*, size: Size = Size.FULL) -> list[Table]:
    runs = size.pick(full=30, quick=5, smoke=1)
    return [prompt_table(runs), conversation_table(size.pick(full=5, quick=2, smoke=1))]
