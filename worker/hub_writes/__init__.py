"""What the worker writes to the Hub, and the limits on it.

``HubWriter`` sends a Hub call once and parks it in the Redis outbox when the Hub is
down; ``drain`` retries parked calls and buries those the Hub refuses (dead letters).
``WriteCaps``/``WriteLedger``/``CappedToolbox`` enforce an agent's post and comment
limits fleet-wide. The pipeline, the daemon, the operations commands, the executors
and the CLI gateway all write through here. The names load on first use: the gateway
imports the write caps at every start and needs neither redis nor the Hub client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker._lazy import lazy_getattr

if TYPE_CHECKING:
    from worker.hub_writes._outbox import (
        CLAIM_LEASE_S,
        DEAD_LETTER_KINDS,
        DEFAULT_MAX_ATTEMPTS,
        MAX_BACKOFF_S,
        DrainResult,
        HubWriter,
        OutboxItem,
        bury,
        drain,
        drain_outbox_now,
        outbox_size,
        park,
        send,
    )
    from worker.hub_writes._write_caps import (
        CappedToolbox,
        RefusalHandler,
        RefusalReason,
        Reservation,
        WriteCaps,
        WriteKind,
        WriteLedger,
        WriteRefused,
        counted_refusals,
        ignore_refusals,
        note_refusal,
    )

_OUTBOX = "worker.hub_writes._outbox"
_WRITE_CAPS = "worker.hub_writes._write_caps"
_LAZY = {
    "CLAIM_LEASE_S": _OUTBOX,
    "DEAD_LETTER_KINDS": _OUTBOX,
    "DEFAULT_MAX_ATTEMPTS": _OUTBOX,
    "MAX_BACKOFF_S": _OUTBOX,
    "DrainResult": _OUTBOX,
    "HubWriter": _OUTBOX,
    "OutboxItem": _OUTBOX,
    "bury": _OUTBOX,
    "drain": _OUTBOX,
    "drain_outbox_now": _OUTBOX,
    "outbox_size": _OUTBOX,
    "park": _OUTBOX,
    "send": _OUTBOX,
    "CappedToolbox": _WRITE_CAPS,
    "RefusalHandler": _WRITE_CAPS,
    "RefusalReason": _WRITE_CAPS,
    "Reservation": _WRITE_CAPS,
    "WriteCaps": _WRITE_CAPS,
    "WriteKind": _WRITE_CAPS,
    "WriteLedger": _WRITE_CAPS,
    "WriteRefused": _WRITE_CAPS,
    "counted_refusals": _WRITE_CAPS,
    "ignore_refusals": _WRITE_CAPS,
    "note_refusal": _WRITE_CAPS,
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "CLAIM_LEASE_S",
    "DEAD_LETTER_KINDS",
    "DEFAULT_MAX_ATTEMPTS",
    "MAX_BACKOFF_S",
    "CappedToolbox",
    "DrainResult",
    "HubWriter",
    "OutboxItem",
    "RefusalHandler",
    "RefusalReason",
    "Reservation",
    "WriteCaps",
    "WriteKind",
    "WriteLedger",
    "WriteRefused",
    "bury",
    "counted_refusals",
    "drain",
    "drain_outbox_now",
    "ignore_refusals",
    "note_refusal",
    "outbox_size",
    "park",
    "send",
]
