"""The scheduler's leader lock: one scheduler of a fleet enqueues, the others wait to take over.

SET NX PX with a token that names its holder, renewed every round by the holder and
released on exit; a leader that dies without releasing it holds it one lock TTL at most.
"""

from __future__ import annotations

import math
import os
import socket
import uuid

from redis import Redis

from worker.redis_io import keys as redis_keys

_ACQUIRE_OR_RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class LeaderLock:
    """The scheduler leader lock: SET NX PX with this process's token, renewed by its holder."""

    def __init__(
        self,
        redis: Redis,
        *,
        ttl_s: float,
        key: str = redis_keys.SCHEDULER_LEADER,
        token: str | None = None,
    ) -> None:
        self.redis = redis
        self.key = key
        self.ttl_ms = max(1, math.ceil(ttl_s * 1000))
        # Says who holds it, for the operator reading a follower's message.
        self.token = token or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._acquire_or_renew = redis.register_script(_ACQUIRE_OR_RENEW)
        self._release = redis.register_script(_RELEASE)

    def hold(self) -> bool:
        """Take the lock if it is free, extend it if it is ours; False when another holds it."""
        return bool(self._acquire_or_renew(keys=[self.key], args=[self.token, self.ttl_ms]))

    def release(self) -> bool:
        """Give the lock up if it is still ours."""
        return bool(self._release(keys=[self.key], args=[self.token]))

    def holder(self) -> str | None:
        raw = self.redis.get(self.key)
        return raw.decode() if isinstance(raw, bytes) else None
