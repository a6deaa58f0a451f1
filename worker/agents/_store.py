"""AgentStore: load an agent's definition by id, through a Redis cache with a TTL.

A cached definition read from a directory is used only while its files are unchanged
(modification time, size, inode: a stat each, no read): an edit to config.yaml, the
system prompt or a skill is read by the next task, without ``reload-agents``. From an
HTTP source a change is seen when the entry's TTL runs out (or on ``reload-agents``).
"""

from __future__ import annotations

import re
from time import monotonic

import httpx2
import redis

from worker.agents._config import AGENT_NAME_PATTERN, AgentConfig
from worker.agents._definition import (
    AgentDefinition,
    Skill,
    definition_from_json,
    definition_to_json,
)
from worker.agents._parsing import decode_text, parse_config, parse_skill
from worker.agents._policy import DefinitionPolicy
from worker.agents._sources import open_source
from worker.exceptions import AgentConfigError, InvalidTask
from worker.logs import log_event
from worker.settings import settings

CACHE_KEY_PREFIX = "agent-worker:agent:"
# A larger entry (a huge prompt and skills) is not cached: each load reads the files.
MAX_CACHE_ENTRY_BYTES = 2 * 1024 * 1024


class AgentStore:
    """Agent definitions from ``AGENTS_DIR`` (a directory or an http(s) base URL).

    Pass the worker's Redis connection (rq's) so every process of the fleet shares
    one cache and ``invalidate`` reaches all of them. Without Redis, definitions
    are cached in this process only. ``policy`` is what the operator lets a definition
    choose; by default it is read from the settings (PROVIDER_BASE_URLS, AGENT_KEY_ENVS,
    AGENTS_STRICT), so every caller applies the same rules.
    """

    def __init__(
        self,
        source: str,
        *,
        redis: redis.Redis | None = None,
        ttl_s: int = 300,
        http_timeout_s: float = 10.0,
        http_transport: httpx2.BaseTransport | None = None,
        policy: DefinitionPolicy | None = None,
    ) -> None:
        self.source = source
        self.policy = policy if policy is not None else DefinitionPolicy.from_settings(settings())
        self._policy_fingerprint = self.policy.fingerprint()
        self._files = open_source(
            source, http_timeout_s=http_timeout_s, http_transport=http_transport
        )
        self._redis = redis
        self._ttl_s = ttl_s
        # Used only without Redis: agent id → (expires at, cache entry).
        self._memo: dict[str, tuple[float, str]] = {}

    def load(self, agent_id: str) -> AgentDefinition:
        """The agent's config, system prompt and skills; cached for ``ttl_s`` seconds.

        Raises InvalidTask for an id that is malformed or names no agent, and
        AgentConfigError (naming file and field) for a definition that is wrong or
        chooses what the policy does not allow. Unknown keys are logged once per read
        of the files (not per cache hit) and kept in ``warnings``.
        """
        _check_agent_id(agent_id)
        cached = self._cached(agent_id)
        if cached is not None:
            return cached
        definition = self._read_definition(agent_id)
        if definition.warnings:
            log_event(
                "agent_definition_warnings",
                "warning",
                agent=agent_id,
                warnings=list(definition.warnings),
            )
        self._remember(agent_id, definition)
        return definition

    def cached(self, agent_id: str) -> AgentDefinition | None:
        """The cached definition, or None; never reads the source (for callers that must
        not wait on an HTTP source, like the worker parent): a directory's files are only
        stat'ed, to tell an edited one."""
        _check_agent_id(agent_id)
        return self._cached(agent_id)

    def invalidate(self, agent_id: str | None = None) -> int:
        """Drop cached definitions (every agent's when ``agent_id`` is None).

        Returns how many agents' entries were dropped.
        """
        if agent_id is None:
            dropped = set(self._memo)
            self._memo.clear()
            dropped |= self._drop_all_cached()
            return len(dropped)
        was_memoized = self._memo.pop(agent_id, None) is not None
        in_redis = self._redis is not None and bool(self._redis.delete(_cache_key(agent_id)))
        return int(was_memoized or in_redis)

    def list_agents(self) -> list[str]:
        """Agent ids with a config.yaml, sorted. HTTP sources have no listing: []."""
        return self._files.list_agents()

    def close(self) -> None:
        """Close the HTTP connection pool, if any."""
        self._files.close()

    # -- reading the source ---------------------------------------------------

    def _read_definition(self, agent_id: str) -> AgentDefinition:
        config_file = f"agents/{agent_id}/config.yaml"
        raw_config = self._files.read(config_file)
        if raw_config is None:
            raise InvalidTask(
                f"unknown agent {agent_id!r}: no {config_file} in {self._files.label}"
            )
        parsed = parse_config(raw_config, config_file, agent_id, self.policy)
        config = parsed.config

        prompt_file = f"agents/{agent_id}/system-prompt.md"
        raw_prompt = self._files.read(prompt_file)
        if raw_prompt is None:
            raise AgentConfigError(
                f"{prompt_file}: not found in {self._files.label} (every agent needs one)"
            )
        system_prompt = decode_text(raw_prompt, prompt_file)

        skills = [self._read_skill(name, config_file) for name in config.capabilities.skills]
        return AgentDefinition(
            config=config, system_prompt=system_prompt, skills=skills, warnings=parsed.warnings
        )

    def _read_skill(self, name: str, config_file: str) -> Skill:
        skill_file = f"skills/{name}/SKILL.md"
        raw_skill = self._files.read(skill_file)
        if raw_skill is None:
            raise AgentConfigError(
                f"{skill_file}: not found in {self._files.label} "
                f"(skill {name!r} is listed in {config_file} capabilities.skills)"
            )
        return parse_skill(raw_skill, skill_file)

    # -- the cache --------------------------------------------------------------

    def _cached(self, agent_id: str) -> AgentDefinition | None:
        if self._redis is None:
            memo = self._memo.get(agent_id)
            if memo is None or memo[0] <= monotonic():
                self._memo.pop(agent_id, None)
                return None
            return self._decoded(memo[1])
        try:
            entry = self._redis.get(_cache_key(agent_id))
        except redis.RedisError as exc:
            log_event(
                "agent_cache_unavailable",
                "warning",
                agent=agent_id,
                action="read",
                error=type(exc).__name__,
            )
            return None
        if not isinstance(entry, (bytes, str)):
            return None
        return self._decoded(entry)

    def _decoded(self, entry: str | bytes) -> AgentDefinition | None:
        return definition_from_json(
            entry, self._files.label, self._policy_fingerprint, self._files_version
        )

    def _files_version(self, definition: AgentDefinition) -> str | None:
        return self._files.version(definition.files())

    def _remember(self, agent_id: str, definition: AgentDefinition) -> None:
        ttl_s = self._ttl_for(definition.config)
        if ttl_s <= 0:
            return
        # Taken just after the read: an edit within that instant waits for the TTL.
        files = self._files_version(definition)
        entry = definition_to_json(definition, self._files.label, self._policy_fingerprint, files)
        entry_bytes = len(entry.encode())
        if entry_bytes > MAX_CACHE_ENTRY_BYTES:
            log_event(
                "agent_cache_skipped",
                "warning",
                agent=agent_id,
                bytes=entry_bytes,
                limit=MAX_CACHE_ENTRY_BYTES,
            )
            return
        if self._redis is None:
            self._memo[agent_id] = (monotonic() + ttl_s, entry)
            return
        try:
            self._redis.set(_cache_key(agent_id), entry, ex=ttl_s)
        except redis.RedisError as exc:
            log_event(
                "agent_cache_unavailable",
                "warning",
                agent=agent_id,
                action="write",
                error=type(exc).__name__,
            )

    def _ttl_for(self, config: AgentConfig) -> int:
        # A definition may ask to be re-read sooner (cache_ttl), never later.
        return min(self._ttl_s, config.cache_ttl)

    def _drop_all_cached(self) -> set[str]:
        if self._redis is None:
            return set()
        keys = list(self._redis.scan_iter(match=f"{CACHE_KEY_PREFIX}*", count=500))
        if not keys:
            return set()
        self._redis.delete(*keys)
        return {
            (key.decode() if isinstance(key, bytes) else str(key)).removeprefix(CACHE_KEY_PREFIX)
            for key in keys
        }


def _cache_key(agent_id: str) -> str:
    return f"{CACHE_KEY_PREFIX}{agent_id}"


def _check_agent_id(agent_id: str) -> None:
    # Before the id touches a path or a URL: `../../etc` never leaves the definitions tree.
    if not isinstance(agent_id, str) or not re.fullmatch(AGENT_NAME_PATTERN, agent_id):
        shown = repr(agent_id)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        raise InvalidTask(f"invalid agent id {shown}: must be 3-50 characters of a-z, 0-9 and '-'")
