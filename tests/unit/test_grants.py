from __future__ import annotations

from pathlib import Path

import pytest

from worker.agents import AgentDefinition
from worker.agents._config import AgentConfig
from worker.exceptions import AgentConfigError, ConfigurationError
from worker.pipeline._runtime import effective_grants
from worker.settings import Settings
from worker.tools._grants import (
    EffectiveGrants,
    GrantPolicy,
    check_grant_pattern,
    check_required_grant,
    grant_covers,
    load_grant_policy,
)


@pytest.mark.parametrize(
    ("held", "required", "covered"),
    [
        ("hub:read", "hub:read", True),
        ("hub:read", "hub:write", False),
        ("hub:*", "hub:read", True),
        ("hub:*", "hub:write:post-1", True),
        ("hub:*", "github:read", False),
        ("hub:write", "hub:write:post-1", True),
        ("hub:write:post-1", "hub:write", False),
        ("hub:write:post-1", "hub:write:post-2", False),
        ("hub:write:*", "hub:write:post-1", True),
        ("hub:write:*", "hub:write", False),
        ("hubx:read", "hub:read", False),
        ("hub:re", "hub:read", False),
        # Pattern against pattern: does the first cover everything the second does?
        ("hub:*", "hub:write:*", True),
        ("hub:read", "hub:*", False),
    ],
)
def test_grant_covers(held: str, required: str, covered: bool) -> None:
    assert grant_covers(held, required) is covered


@pytest.mark.parametrize("pattern", ["*", "hub", "hub:", ":read", "Hub:read", "hub:*:x", "a:b:c:d"])
def test_invalid_grant_patterns_are_rejected(pattern: str) -> None:
    with pytest.raises(ValueError, match="grant must look like"):
        check_grant_pattern(pattern)


@pytest.mark.parametrize("grant", ["write", "hub:*", "hub:write:*", "*"])
def test_required_grants_must_be_concrete(grant: str) -> None:
    with pytest.raises(ValueError, match=r"svc:scope\[:res\]"):
        check_required_grant(grant)


def test_required_grant_may_name_a_resource() -> None:
    assert check_required_grant("github:write:org/repo") == "github:write:org/repo"


def test_without_policy_requested_grants_are_effective() -> None:
    grants = load_grant_policy(None).effective_grants("any-agent", ["hub:*", "time:read"])
    assert grants.covers("hub:write:post-9")
    assert grants.covers("time:read")
    assert not grants.covers("github:read")


def test_policy_intersects_wildcards_and_denied_wins() -> None:
    policy = GrantPolicy.model_validate(
        {"default": {"allowed_grants": ["hub:read", "time:*"], "denied_grants": ["time:admin"]}}
    )
    grants = policy.effective_grants("writer", ["hub:*", "time:*", "github:read"])
    # requested hub:* ∩ allowed hub:read is hub:read
    assert grants.allowed == frozenset({"hub:read", "time:*"})
    assert grants.covers("hub:read")
    assert not grants.covers("hub:write")
    assert not grants.covers("github:read")
    assert grants.covers("time:read")
    assert not grants.covers("time:admin")
    assert not grants.covers("time:admin:clock")


def test_denied_pattern_carves_a_hole_in_a_requested_wildcard() -> None:
    policy = GrantPolicy.model_validate({"default": {"denied_grants": ["hub:write"]}})
    grants = policy.effective_grants("writer", ["hub:*"])
    assert grants.covers("hub:read")
    assert grants.covers("hub:read:thread-1")
    assert not grants.covers("hub:write")
    assert not grants.covers("hub:write:post-1")
    assert str(grants) == "hub:* (except hub:write)"


def test_narrower_request_survives_a_broader_allowance() -> None:
    policy = GrantPolicy.model_validate({"default": {"allowed_grants": ["hub:*"]}})
    grants = policy.effective_grants("reader", ["hub:read"])
    assert grants.allowed == frozenset({"hub:read"})
    assert not grants.covers("hub:write")


def test_agent_entry_overrides_the_default_key_by_key(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "default: {allowed_grants: ['hub:read'], denied_grants: ['hub:admin']}\n"
        "agents:\n"
        "  devops-agent: {allowed_grants: ['hub:*']}\n"
        "  locked-agent: {allowed_grants: []}\n"
    )
    policy = load_grant_policy(path)
    devops = policy.effective_grants("devops-agent", ["hub:*"])
    assert devops.covers("hub:write")
    assert not devops.covers("hub:admin")  # the default's denied_grants still apply
    other = policy.effective_grants("other-agent", ["hub:*"])
    assert other.covers("hub:read")
    assert not other.covers("hub:write")
    locked = policy.effective_grants("locked-agent", ["hub:*"])
    assert not locked.covers("hub:read")


def test_empty_policy_file_caps_nothing(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("")
    assert load_grant_policy(path).effective_grants("a", ["hub:write"]).covers("hub:write")


def test_policy_errors_name_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("agents:\n  writer: {allowed_grants: ['*']}\n")
    with pytest.raises(ConfigurationError) as error:
        load_grant_policy(path)
    assert str(error.value).startswith(f"{path}: agents.writer.allowed_grants: grant must look")

    path.write_text("default: {allow: ['hub:read']}\n")
    with pytest.raises(ConfigurationError, match=r"default\.allow: Extra inputs"):
        load_grant_policy(path)

    path.write_text("- hub:read\n")
    with pytest.raises(ConfigurationError, match="expected a mapping"):
        load_grant_policy(path)

    with pytest.raises(ConfigurationError, match="cannot read the grant policy"):
        load_grant_policy(tmp_path / "missing.yaml")


def test_bad_requested_grant_names_the_agent() -> None:
    with pytest.raises(AgentConfigError, match=r"agent 'writer': grants: .*got '\*'"):
        GrantPolicy().effective_grants("writer", ["*"])


def test_effective_grants_of_validates_patterns() -> None:
    assert EffectiveGrants.of(["hub:*"]).covers("hub:read")
    with pytest.raises(ValueError, match="grant must look like"):
        EffectiveGrants.of(["hub"])


@pytest.mark.parametrize(
    ("operator_strict", "definition_strict", "strict"),
    [(False, False, False), (True, False, True), (False, True, True), (True, True, True)],
)
def test_a_tasks_grants_are_strict_under_the_operators_switch_or_the_definitions(
    operator_strict: bool, definition_strict: bool, strict: bool
) -> None:
    agent = AgentDefinition(
        config=AgentConfig.model_validate(
            {
                "name": "strict-agent",
                "brain": {"provider": "openai", "model": "m"},
                "capabilities": {"grants": ["hub:read"]},
                "behavior": {"strict_grants": definition_strict},
            }
        ),
        system_prompt="s",
    )

    grants = effective_grants(Settings(strict_grants=operator_strict), agent)

    assert grants.strict is strict
    assert grants.allowed == frozenset({"hub:read"})


SCOPE_POLICY = GrantPolicy.model_validate(
    {
        "default": {"allow_comment_on_any_post": False, "allowed_post_in": ["m/news"]},
        "agents": {
            "herald": {"allowed_post_in": ["*"]},
            "mute": {"allowed_post_in": []},
            "roamer": {"allow_comment_on_any_post": True},
        },
    }
)


@pytest.mark.parametrize(
    ("agent", "any_post", "post_in", "refused"),
    [
        ("scout", False, ["m/news"], []),
        (
            "scout",
            True,
            ["m/news", "m/general"],
            ["scope.comment_on_any_post", "scope.post_in m/general"],
        ),
        ("scout", False, ["*"], ["scope.post_in *"]),
        # An agent entry replaces the default key by key.
        ("herald", False, ["*", "m/general"], []),
        ("herald", True, [], ["scope.comment_on_any_post"]),
        ("mute", False, ["m/news"], ["scope.post_in m/news"]),
        ("roamer", True, ["m/news"], []),
    ],
)
def test_the_policy_caps_the_scope_opt_ins_key_by_key(
    agent: str, any_post: bool, post_in: list[str], refused: list[str]
) -> None:
    found = SCOPE_POLICY.refused_opt_ins(agent, comment_on_any_post=any_post, post_in=post_in)
    assert found == refused


def test_a_policy_without_scope_keys_caps_no_opt_in() -> None:
    policy = GrantPolicy.model_validate({"default": {"allowed_grants": ["hub:read"]}})
    assert policy.refused_opt_ins("scout", comment_on_any_post=True, post_in=["*"]) == []
