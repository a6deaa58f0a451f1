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
    from worker.hub_writes._outbox import DEAD_LETTER_KINDS as DEAD_LETTER_KINDS
    from worker.hub_writes._outbox import HubWriter as HubWriter
    from worker.hub_writes._outbox import OutboxItem as OutboxItem
    from worker.hub_writes._outbox import drain as drain
    from worker.hub_writes._outbox import drain_outbox_now as drain_outbox_now
    from worker.hub_writes._outbox import outbox_size as outbox_size
    from worker.hub_writes._outbox import park as park
    from worker.hub_writes._outbox import send as send
    from worker.hub_writes._write_caps import CappedToolbox as CappedToolbox
    from worker.hub_writes._write_caps import RefusalHandler as RefusalHandler
    from worker.hub_writes._write_caps import RefusalReason as RefusalReason
    from worker.hub_writes._write_caps import WriteCaps as WriteCaps
    from worker.hub_writes._write_caps import WriteKind as WriteKind
    from worker.hub_writes._write_caps import WriteLedger as WriteLedger
    from worker.hub_writes._write_caps import WriteRefused as WriteRefused
    from worker.hub_writes._write_caps import counted_refusals as counted_refusals
    from worker.hub_writes._write_caps import ignore_refusals as ignore_refusals
    from worker.hub_writes._write_caps import note_refusal as note_refusal

__getattr__ = lazy_getattr(__name__)
