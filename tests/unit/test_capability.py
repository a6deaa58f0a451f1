"""The per-task capability: minted by the worker, verified by our servers."""

from __future__ import annotations

import time

import fakeredis
import jwt
import pytest

from worker.agents import AgentDefinition
from worker.agents._config import AgentConfig
from worker.coordination import fix_task_deadline
from worker.pipeline._runtime import _capability
from worker.settings import Settings
from worker.task import Task
from worker.tools import ScopeCell, TaskScope
from worker.tools._capability import (
    CapabilityRefused,
    check_key,
    mint_capability,
    read_capability,
    verify_capability,
)
from worker.tools._grants import EffectiveGrants

KEY = "k" * 32
GRANTS = EffectiveGrants(allowed=frozenset({"hub:*"}), denied=frozenset({"hub:write"}))


def mint(**overrides: object) -> str:
    fields: dict[str, object] = {
        "agent_id": "agent-a",
        "task_id": "t-1",
        "grants": GRANTS,
        "expires_at": time.time() + 60,
        "scope": TaskScope.nothing(),
    }
    fields.update(overrides)
    return mint_capability(KEY, **fields)  # type: ignore[arg-type]


def test_a_minted_capability_verifies_with_its_claims_and_grant_holes() -> None:
    capability = verify_capability(KEY, mint())
    assert (capability.agent_id, capability.task_id) == ("agent-a", "t-1")
    assert capability.allows("hub:read")
    # The denial carved out of the wildcard travels with it.
    assert not capability.allows("hub:write")
    assert not capability.allows("web:read")
    assert 55 < capability.remaining_s() <= 62


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (None, "no capability in the request _meta"),
        ("", "no capability in the request _meta"),
        (42, "no capability in the request _meta"),
        ("a.b.c", "the capability is not valid"),
    ],
)
def test_missing_or_malformed_tokens_are_refused(token: object, expected: str) -> None:
    with pytest.raises(CapabilityRefused, match=expected):
        verify_capability(KEY, token)


def test_expired_other_key_tampered_and_unsigned_are_refused() -> None:
    with pytest.raises(CapabilityRefused, match="expired"):
        verify_capability(KEY, mint(expires_at=time.time() - 30))
    with pytest.raises(CapabilityRefused, match="signature does not verify"):
        verify_capability("x" * 32, mint())
    header, _claims, signature = mint().split(".")
    forged_claims = jwt.utils.base64url_encode(
        b'{"sub":"admin","tid":"t-1","grants":["hub:*"],"denied":[],"iat":1,"exp":9999999999,'
        b'"aud":"hub-agent-worker-mcp"}'
    ).decode()
    with pytest.raises(CapabilityRefused, match="signature does not verify"):
        verify_capability(KEY, f"{header}.{forged_claims}.{signature}")
    unsigned = jwt.encode({"sub": "admin"}, key=None, algorithm="none")  # type: ignore[arg-type]
    with pytest.raises(CapabilityRefused, match="not valid"):
        verify_capability(KEY, unsigned)


def test_a_claim_of_the_wrong_shape_is_refused() -> None:
    token = jwt.encode(
        {"sub": "a", "tid": "t", "grants": "hub:*", "denied": [], "iat": 1,
         "exp": int(time.time()) + 60, "aud": "hub-agent-worker-mcp"},
        KEY,
        algorithm="HS256",
    )  # fmt: skip
    with pytest.raises(CapabilityRefused, match="'grants' claim is not a list of strings"):
        verify_capability(KEY, token)


def test_read_capability_checks_expiry_but_not_the_signature() -> None:
    assert read_capability(mint()).agent_id == "agent-a"
    with pytest.raises(CapabilityRefused, match="expired"):
        read_capability(mint(expires_at=time.time() - 30))


def test_keys_too_short_to_sign_with_are_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="CAPABILITY_KEY must be at least 32 characters"):
        check_key("short")
    with pytest.raises(ValueError, match="at least 32"):
        mint_capability(
            "short",
            agent_id="a",
            task_id="t",
            grants=GRANTS,
            expires_at=0,
            scope=TaskScope.nothing(),
        )
    monkeypatch.setenv("CAPABILITY_KEY", "short")
    with pytest.raises(ValueError, match="capability_key"):
        Settings()


def test_the_key_is_a_secret_the_worker_redacts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPABILITY_KEY", KEY)
    assert KEY in Settings().secret_values()
    assert KEY not in repr(Settings())


def test_a_resumed_task_gets_a_capability_that_ends_at_its_kept_deadline(
    redis: fakeredis.FakeRedis,
) -> None:
    # The first run fixed a deadline 5 s out; this re-run's agent allows 600 s.
    kept = fix_task_deadline(redis, "t-1", 5.0).epoch_s
    config = AgentConfig.model_validate(
        {
            "name": "agent-a",
            "brain": {"provider": "openai", "model": "gpt-4o-mini"},
            "limits": {"max_duration_s": 600},
        }
    )
    agent = AgentDefinition(config=config, system_prompt="")
    task = Task.model_validate({"task_id": "t-1", "type": "exploration", "agent_id": "agent-a"})
    settings = Settings(capability_key=KEY)  # type: ignore[arg-type]

    token = _capability(settings, agent, task, GRANTS, None, redis, ScopeCell())()
    without_redis = _capability(settings, agent, task, GRANTS, None, None, ScopeCell())()

    assert token is not None and without_redis is not None
    assert read_capability(token).expires_at == int(kept) + 1
    assert read_capability(without_redis).expires_at > kept + 500  # no deadline known: fresh
