"""Agent definitions: parsing, errors naming file and field, path safety, and the cache."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import fakeredis
import httpx2
import pytest

import worker.agents._store as store_module
from tests.support.definitions import SHIPPED_DEMO_AGENTS, write_agent
from tests.support.fake_redis import FakeRedisClients
from worker.agents import AgentDefinition, AgentStore, RecallStrategy
from worker.agents._config import AgentConfig
from worker.agents._definition import Skill
from worker.agents._sources import DirectorySource
from worker.exceptions import AgentConfigError, InvalidTask

MINIMAL_CONFIG = """\
name: {name}
brain:
  provider: anthropic
  model: claude-sonnet-4-20250514
"""

# A definition in the public format, with keys this worker does not know about.
PUBLIC_FORMAT_CONFIG = """\
# Agent Configuration - devops-agent
version: "1.0.0"
name: devops-agent
display_name: DevOps Agent
description: DevOps specialist
type: claude-code
brain:
  provider: anthropic
  model: claude-sonnet-4-20250514
  temperature: 0.3
  max_tokens: 12000
  fallbacks:
    - {provider: openai, model: gpt-4o}
capabilities:
  grants: [hub:read, hub:write, github:*, github:write:acme/infra]
  skills: [hub-post, budget-check]
  mcp_servers:
    - github
    - {name: kubernetes, command: mcp-k8s, args: [--read-only]}
  shell:
    enabled: true
    allowed_commands: [kubectl, git]
    blocked_patterns: ["rm -rf"]
    timeout_seconds: 600
  spawning:
    can_propose: false
interests:
  topics: [kubernetes]
  communities: [m/devops, m/agent-errors]
  keywords: [deploy, pod]
  follow_agents: [research-agent]
behavior:
  respond_to_mentions: true
  respond_to_replies: false
  respond_to_dms: true
  max_iterations: 15
  strict_grants: true
  require_done_tool: true
  max_concurrent: 3
  discovery:
    enabled: true
    frequency: staleness
    min_confidence: 0.8
    post_final: true
  limits:
    max_daily_posts: 3
limits:
  max_tokens: 40000
  max_duration_s: 90
  max_cost_usd: 0.5
memory:
  enabled: true
  retrieval: {strategy: recent}
cache_ttl: 60
"""


def skill_text(name: str, description: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\nversion: 1.0.0\n---\n\n{body}\n"


def write_skill(root: Path, name: str, text: str) -> Path:
    skill_dir = root / "skills" / name
    skill_dir.mkdir(parents=True, exist_ok=True)
    path = skill_dir / "SKILL.md"
    path.write_text(text)
    return path


def load_error(root: Path, agent_id: str) -> str:
    with pytest.raises(AgentConfigError) as caught:
        AgentStore(str(root), ttl_s=0).load(agent_id)
    return caught.value.message


# -- parsing -------------------------------------------------------------------


def test_public_format_definition_loads_with_every_field(tmp_path: Path) -> None:
    write_agent(tmp_path, "devops-agent", PUBLIC_FORMAT_CONFIG, prompt="# DevOps\nBe careful.\n")
    write_skill(tmp_path, "hub-post", skill_text("hub-post", "Post to the Hub", "Use create_post."))
    write_skill(tmp_path, "budget-check", skill_text("budget-check", "Check budget", "Ask first."))

    definition = AgentStore(str(tmp_path)).load("devops-agent")
    config = definition.config

    assert definition.warnings == ()  # every key is a known Botburrow one
    assert config.name == "devops-agent"
    assert config.type == "claude-code"
    assert config.brain.provider == "anthropic"
    assert config.brain.temperature == 0.3
    assert config.brain.max_tokens == 12000
    assert [(f.provider, f.model) for f in config.brain.fallbacks] == [("openai", "gpt-4o")]
    assert config.capabilities.grants == [
        "hub:read",
        "hub:write",
        "github:*",
        "github:write:acme/infra",
    ]
    assert config.capabilities.server_names == ["github", "kubernetes"]
    assert config.capabilities.shell.enabled is True
    assert config.capabilities.shell.timeout_seconds == 600
    assert config.interests.communities == ["m/devops", "m/agent-errors"]
    assert config.interests.follow_agents == ["research-agent"]
    assert config.behavior.respond_to_replies is False
    assert config.behavior.max_iterations == 15
    assert config.behavior.strict_grants is True
    assert config.behavior.require_done_tool is True
    assert config.behavior.max_concurrent == 3
    assert config.behavior.discovery.post_final is True
    assert config.behavior.discovery.frequency == "staleness"
    assert config.behavior.limits.max_daily_posts == 3
    assert config.limits.max_tokens == 40000
    assert config.limits.max_duration_s == 90
    assert config.limits.max_cost_usd == 0.5
    assert config.display_name == "DevOps Agent"
    assert definition.system_prompt == "# DevOps\nBe careful.\n"


def test_minimal_config_gets_the_documented_defaults(tmp_path: Path) -> None:
    write_agent(tmp_path, "tiny-agent", MINIMAL_CONFIG.format(name="tiny-agent"))

    config = AgentStore(str(tmp_path)).load("tiny-agent").config

    assert config.type == "native"
    assert config.brain.api_base is None
    assert config.brain.fallbacks == []
    assert config.capabilities.grants == []
    assert config.capabilities.skills == []
    assert config.capabilities.shell.enabled is False
    assert config.capabilities.shell.timeout_seconds == 120
    assert config.interests.topics == []
    assert config.behavior.respond_to_mentions is True
    assert config.behavior.respond_to_dms is True
    assert config.behavior.max_iterations == 10
    assert config.behavior.strict_grants is False
    assert config.behavior.max_concurrent == 1
    assert config.behavior.discovery.enabled is False
    assert config.behavior.discovery.min_confidence == 0.7
    assert config.behavior.discovery.post_final is False
    limits = config.behavior.limits
    assert (limits.max_daily_posts, limits.max_daily_comments) == (5, 50)
    assert (limits.max_responses_per_thread, limits.min_interval_seconds) == (3, 60)
    assert config.brain.temperature == 0.7
    assert config.cache_ttl == 300
    assert config.limits.max_tokens == 100_000
    assert config.limits.max_duration_s == 300
    assert config.limits.max_cost_usd is None


def test_empty_yaml_keys_mean_defaults(tmp_path: Path) -> None:
    config = MINIMAL_CONFIG.format(name="sparse-agent") + (
        "capabilities:\n  skills:\n  shell:\ninterests:\nbehavior:\n  discovery:\n"
    )
    write_agent(tmp_path, "sparse-agent", config)

    loaded = AgentStore(str(tmp_path)).load("sparse-agent").config

    assert loaded.capabilities.skills == []
    assert loaded.capabilities.shell.timeout_seconds == 120
    assert loaded.behavior.discovery.enabled is False


def test_unknown_keys_are_ignored_at_every_level_with_a_warning(tmp_path: Path) -> None:
    config = (
        "name: odd-agent\nfuture_field: 1\n"
        "brain: {provider: openai, model: gpt-4o-mini, reasoning: high}\n"
        "capabilities: {grants: [hub:read], sandbox: {image: x}}\n"
        "behavior: {max_iterations: 4, discovery: {enabled: false, mood: curious}}\n"
        "limits: {max_tokens: 10, per_day: 3}\n"
    )
    write_agent(tmp_path, "odd-agent", config)

    definition = AgentStore(str(tmp_path)).load("odd-agent")
    loaded = definition.config

    assert [warning.split(": ", 1)[1] for warning in definition.warnings] == [
        "unknown key 'future_field'",
        "unknown key 'brain.reasoning'",
        "unknown key 'capabilities.sandbox'",
        "unknown key 'behavior.discovery.mood'",
        "unknown key 'limits.per_day'",
    ]
    assert loaded.brain.model == "gpt-4o-mini"
    assert loaded.behavior.max_iterations == 4
    assert loaded.behavior.discovery.enabled is False
    assert loaded.limits.max_tokens == 10
    assert "future_field" not in loaded.model_dump()


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "name: devops-agent\nbrain: {provider: openai, model: m}\nbehavior:\n"
            "  max_iterations: 51\n",
            "agents/devops-agent/config.yaml: behavior.max_iterations: "
            "Input should be less than or equal to 50",
        ),
        (
            "name: devops-agent\nbrain: {provider: gemini, model: m}\n",
            "agents/devops-agent/config.yaml: brain.provider: "
            "Input should be 'anthropic' or 'openai'",
        ),
        (
            "name: devops-agent\nbrain: {provider: google, model: m}\n",
            "agents/devops-agent/config.yaml: brain.provider: 'google' is in the public "
            "Botburrow format but this worker does not support it: use openai with",
        ),
        (
            "name: devops-agent\ntype: crewai\nbrain: {provider: openai, model: m}\n",
            "agents/devops-agent/config.yaml: type: Input should be 'native', 'claude-code',",
        ),
        (
            "name: devops-agent\n",
            "agents/devops-agent/config.yaml: brain: Field required",
        ),
        (
            "name: devops-agent\nbrain: {provider: openai}\n",
            "agents/devops-agent/config.yaml: brain.model: Field required",
        ),
        (
            "name: devops-agent\nbrain: {provider: openai, model: m, temperature: 2.5}\n",
            "agents/devops-agent/config.yaml: brain.temperature: "
            "Input should be less than or equal to 2",
        ),
        (
            "name: devops-agent\nbrain: {provider: openai, model: m}\n"
            "capabilities: {grants: [hub:read, 'hub']}\n",
            "agents/devops-agent/config.yaml: capabilities.grants.1: String should match pattern",
        ),
        (
            "name: devops-agent\nbrain: {provider: openai, model: m}\n"
            "capabilities: {skills: ['../../etc']}\n",
            "agents/devops-agent/config.yaml: capabilities.skills.0: String should match pattern",
        ),
        (
            "name: devops-agent\nbrain: {provider: openai, model: m}\ninterests: {topics: k8s}\n",
            "agents/devops-agent/config.yaml: interests.topics: Input should be a valid list",
        ),
        (
            "name: devops-agent\nbrain: {provider: openai, model: m}\n"
            "behavior: {max_concurrent: 0}\n",
            "agents/devops-agent/config.yaml: behavior.max_concurrent: "
            "Input should be greater than or equal to 1",
        ),
        (
            "name: devops-agent\nbrain: {provider: openai, model: m}\nlimits: {max_tokens: 0}\n",
            "agents/devops-agent/config.yaml: limits.max_tokens: "
            "Input should be greater than or equal to 1",
        ),
        (
            "name: devops-agent\nbrain: {provider: openai, model: m}\n"
            "capabilities: {shell: {enabled: maybe}}\n",
            "agents/devops-agent/config.yaml: capabilities.shell.enabled: "
            "Input should be a valid boolean",
        ),
        (
            "name: devops-agent\nbrain: {provider: openai, model: m, api_key_env: HUB_API_KEY}\n",
            "agents/devops-agent/config.yaml: brain.api_key_env: "
            "HUB_API_KEY is the worker's own secret",
        ),
        (
            "name: other-agent\nbrain: {provider: openai, model: m}\n",
            "agents/devops-agent/config.yaml: name: 'other-agent' must equal its directory "
            "name 'devops-agent'",
        ),
    ],
)
def test_wrong_values_name_the_file_and_field(
    tmp_path: Path, yaml_text: str, expected: str
) -> None:
    write_agent(tmp_path, "devops-agent", yaml_text)

    assert load_error(tmp_path, "devops-agent").startswith(expected)


def test_every_wrong_field_is_reported(tmp_path: Path) -> None:
    write_agent(
        tmp_path,
        "devops-agent",
        "name: devops-agent\nbrain: {provider: x, model: m}\nbehavior: {max_iterations: 0}\n",
    )

    message = load_error(tmp_path, "devops-agent")

    assert "brain.provider:" in message
    assert "behavior.max_iterations:" in message


def test_invalid_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    write_agent(tmp_path, "yaml-agent", "name: yaml-agent\nbrain:\n  provider: a: b\n")

    assert load_error(tmp_path, "yaml-agent").startswith(
        "agents/yaml-agent/config.yaml: invalid YAML at line 3, column 14: mapping values"
    )


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("- name: list-agent\n", "expected a YAML mapping at the top level, got a list"),
        ("just some words\n", "expected a YAML mapping at the top level, got a string"),
        ("", "is empty; expected a YAML mapping"),
    ],
)
def test_config_that_is_not_a_mapping_is_refused(
    tmp_path: Path, yaml_text: str, expected: str
) -> None:
    write_agent(tmp_path, "list-agent", yaml_text)

    assert load_error(tmp_path, "list-agent") == f"agents/list-agent/config.yaml: {expected}"


def test_non_utf8_config_names_the_file(tmp_path: Path) -> None:
    agent_dir = write_agent(tmp_path, "latin-agent", "")
    (agent_dir / "config.yaml").write_bytes(b"name: latin-agent\ndescription: caf\xe9\n")

    message = load_error(tmp_path, "latin-agent")

    assert message.startswith("agents/latin-agent/config.yaml: not valid UTF-8")


def test_non_utf8_system_prompt_names_the_file(tmp_path: Path) -> None:
    agent_dir = write_agent(tmp_path, "latin-agent", MINIMAL_CONFIG.format(name="latin-agent"))
    (agent_dir / "system-prompt.md").write_bytes(b"\xff\xfe broken")

    assert load_error(tmp_path, "latin-agent").startswith(
        "agents/latin-agent/system-prompt.md: not valid UTF-8"
    )


def test_missing_system_prompt_names_the_file(tmp_path: Path) -> None:
    write_agent(tmp_path, "mute-agent", MINIMAL_CONFIG.format(name="mute-agent"), prompt=None)

    assert load_error(tmp_path, "mute-agent").startswith(
        "agents/mute-agent/system-prompt.md: not found in "
    )


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    write_agent(
        tmp_path, "huge-agent", MINIMAL_CONFIG.format(name="huge-agent"), prompt="x" * 1_100_000
    )

    assert "agents/huge-agent/system-prompt.md: larger than" in load_error(tmp_path, "huge-agent")


# -- skills --------------------------------------------------------------------


def config_with_skills(name: str, skills: list[str]) -> str:
    return MINIMAL_CONFIG.format(name=name) + f"capabilities:\n  skills: {json.dumps(skills)}\n"


def test_skills_follow_the_config_order_in_the_full_prompt(tmp_path: Path) -> None:
    write_agent(
        tmp_path,
        "skilled-agent",
        config_with_skills("skilled-agent", ["zeta-skill", "alpha-skill", "zeta-skill"]),
        prompt="You are skilled-agent.",
    )
    write_skill(tmp_path, "alpha-skill", skill_text("alpha-skill", "First letter", "Say alpha."))
    write_skill(tmp_path, "zeta-skill", skill_text("zeta-skill", "Last letter", "Say zeta."))

    definition = AgentStore(str(tmp_path)).load("skilled-agent")
    prompt = definition.full_system_prompt()

    assert definition.skills == [
        Skill(name="zeta-skill", description="Last letter", instructions="Say zeta."),
        Skill(name="alpha-skill", description="First letter", instructions="Say alpha."),
    ]
    assert prompt.startswith("You are skilled-agent.")
    assert prompt.index("Skill: zeta-skill") < prompt.index("Say zeta.")
    assert prompt.index("Say zeta.") < prompt.index("Skill: alpha-skill")
    assert prompt.index("Skill: alpha-skill") < prompt.index("First letter")
    assert prompt.index("First letter") < prompt.index("Say alpha.")
    assert prompt.count("Say zeta.") == 1


def test_full_prompt_without_skills_is_the_system_prompt() -> None:
    config = AgentConfig.model_validate(
        {"name": "plain-agent", "brain": {"provider": "openai", "model": "m"}}
    )
    definition = AgentDefinition(config=config, system_prompt="Be plain.\n", skills=[])

    assert definition.full_system_prompt() == "Be plain."


def test_missing_skill_names_the_skill_path_and_the_config(tmp_path: Path) -> None:
    write_agent(tmp_path, "needy-agent", config_with_skills("needy-agent", ["ghost-skill"]))

    message = load_error(tmp_path, "needy-agent")

    assert message.startswith("skills/ghost-skill/SKILL.md: not found in ")
    assert "agents/needy-agent/config.yaml capabilities.skills" in message


@pytest.mark.parametrize(
    ("skill_md", "expected"),
    [
        ("# No front matter\n", "must start with YAML front matter"),
        ("---\nname: bad-skill\ndescription: never closed\n", "front matter has no closing"),
        ("---\nname: bad-skill\n---\nBody.\n", "front matter: description: Field required"),
        ("---\ndescription: nameless\n---\nBody.\n", "front matter: name: Field required"),
        ("---\n- a\n- b\n---\nBody.\n", "expected a YAML mapping at the top level, got a list"),
        ("---\nname: bad-skill\ndescription: a: b\n---\n", "invalid YAML at line 3, column 15"),
    ],
)
def test_skill_front_matter_errors_name_the_skill_file(
    tmp_path: Path, skill_md: str, expected: str
) -> None:
    write_agent(tmp_path, "needy-agent", config_with_skills("needy-agent", ["bad-skill"]))
    write_skill(tmp_path, "bad-skill", skill_md)

    message = load_error(tmp_path, "needy-agent")

    assert message.startswith("skills/bad-skill/SKILL.md: ")
    assert expected in message


def test_skill_front_matter_ignores_unknown_keys(tmp_path: Path) -> None:
    write_agent(tmp_path, "needy-agent", config_with_skills("needy-agent", ["rich-skill"]))
    write_skill(
        tmp_path,
        "rich-skill",
        "---\nname: rich-skill\ndescription: Has extras\nrequires_grants: [hub:write]\n"
        "triggers: {keywords: [post]}\n---\n\n# Rich\n\nDo things.\n",
    )

    (skill,) = AgentStore(str(tmp_path)).load("needy-agent").skills

    assert skill == Skill(
        name="rich-skill", description="Has extras", instructions="# Rich\n\nDo things."
    )


# -- ids and paths -------------------------------------------------------------


@pytest.mark.parametrize(
    "agent_id",
    [
        "../../etc",
        "../../agents/secret",
        "../secret",
        "agents/../x",
        "ab",
        "Demo-Agent",
        "demo-agent\n",
        "a" * 51,
        "",
    ],
)
def test_malformed_agent_ids_are_refused_before_any_read(tmp_path: Path, agent_id: str) -> None:
    root = tmp_path / "defs"
    # A readable config just outside the tree: a traversal would find it.
    write_agent(tmp_path, "secret", MINIMAL_CONFIG.format(name="secret"))
    (root / "agents").mkdir(parents=True)

    with pytest.raises(InvalidTask, match="invalid agent id"):
        AgentStore(str(root)).load(agent_id)


def test_unknown_agent_is_an_invalid_task(tmp_path: Path) -> None:
    with pytest.raises(InvalidTask) as caught:
        AgentStore(str(tmp_path)).load("nobody-here")

    assert caught.value.message == (
        f"unknown agent 'nobody-here': no agents/nobody-here/config.yaml in {tmp_path}"
    )


def test_list_agents_lists_directories_with_a_config(tmp_path: Path) -> None:
    write_agent(tmp_path, "zulu-agent", MINIMAL_CONFIG.format(name="zulu-agent"))
    write_agent(tmp_path, "alpha-agent", MINIMAL_CONFIG.format(name="alpha-agent"))
    (tmp_path / "agents" / "no-config").mkdir()
    write_agent(tmp_path, "Bad_Name", MINIMAL_CONFIG.format(name="bad"))

    assert AgentStore(str(tmp_path)).list_agents() == ["alpha-agent", "zulu-agent"]
    assert AgentStore(str(tmp_path / "missing")).list_agents() == []


# -- the cache -----------------------------------------------------------------


def make_cached_agent(root: Path, name: str = "cached-agent") -> Path:
    agent_dir = write_agent(
        root, name, config_with_skills(name, ["memo-skill"]), prompt="Remember me."
    )
    write_skill(root, "memo-skill", skill_text("memo-skill", "Memo", "Keep notes."))
    return agent_dir


@pytest.fixture
def config_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each config.yaml a directory source reads, in order (a cache hit reads none)."""
    seen: list[str] = []
    read = DirectorySource.read

    def counting(source: DirectorySource, relative_path: str) -> bytes | None:
        if relative_path.endswith("config.yaml"):
            seen.append(relative_path)
        return read(source, relative_path)

    monkeypatch.setattr(DirectorySource, "read", counting)
    return seen


def test_a_cached_definition_is_used_while_its_files_are_unchanged_until_invalidated(
    tmp_path: Path, redis: fakeredis.FakeRedis, config_reads: list[str]
) -> None:
    make_cached_agent(tmp_path)
    store = AgentStore(str(tmp_path), redis=redis, ttl_s=300)
    first = store.load("cached-agent")
    second = store.load("cached-agent")

    assert second == first and len(config_reads) == 1
    assert second.full_system_prompt() == first.full_system_prompt()
    assert 0 < redis.ttl("agent-worker:agent:cached-agent") <= 300
    assert store.invalidate("cached-agent") == 1
    assert redis.exists("agent-worker:agent:cached-agent") == 0
    store.load("cached-agent")
    assert len(config_reads) == 2


@pytest.mark.parametrize(
    "edited", ["agents/cached-agent/system-prompt.md", "agents/cached-agent/config.yaml",
               "skills/memo-skill/SKILL.md"]
)  # fmt: skip
def test_an_edited_file_of_a_cached_definition_is_read_by_the_next_load(
    tmp_path: Path, redis: fakeredis.FakeRedis, edited: str
) -> None:
    make_cached_agent(tmp_path)
    store = AgentStore(str(tmp_path), redis=redis, ttl_s=300)
    before = store.load("cached-agent")
    path = tmp_path / edited
    # A same-size edit within the same clock tick still changes the inode (an editor's
    # save writes a new file and renames it over the old one).
    replacement = tmp_path / "replacement"
    text = path.read_text()
    for was, now in (("Remember", "Remindme"), ("Keep", "Drop"), ("0514", "0515")):
        text = text.replace(was, now)
    replacement.write_text(text)
    replacement.replace(path)

    after = AgentStore(str(tmp_path), redis=redis, ttl_s=300).load("cached-agent")

    assert after != before
    assert store.load("cached-agent") == after


def test_a_cached_agent_whose_files_are_gone_is_unknown(
    tmp_path: Path, redis: fakeredis.FakeRedis
) -> None:
    agent_dir = make_cached_agent(tmp_path)
    store = AgentStore(str(tmp_path), redis=redis, ttl_s=300)
    store.load("cached-agent")
    for path in agent_dir.iterdir():
        path.unlink()

    with pytest.raises(InvalidTask, match="unknown agent 'cached-agent'"):
        store.load("cached-agent")


def test_cache_is_shared_by_stores_on_the_same_redis(
    tmp_path: Path, redis: fakeredis.FakeRedis, config_reads: list[str]
) -> None:
    make_cached_agent(tmp_path)
    AgentStore(str(tmp_path), redis=redis).load("cached-agent")

    other_process_store = AgentStore(str(tmp_path), redis=redis)

    assert other_process_store.load("cached-agent").system_prompt == "Remember me."
    assert len(config_reads) == 1


def test_entries_cached_for_another_source_are_not_used(
    tmp_path: Path, redis: fakeredis.FakeRedis
) -> None:
    make_cached_agent(tmp_path / "one")
    AgentStore(str(tmp_path / "one"), redis=redis).load("cached-agent")

    with pytest.raises(InvalidTask, match="unknown agent"):
        AgentStore(str(tmp_path / "two"), redis=redis).load("cached-agent")


def test_invalidate_all_drops_every_cached_agent(
    tmp_path: Path, redis: fakeredis.FakeRedis
) -> None:
    make_cached_agent(tmp_path, "first-agent")
    make_cached_agent(tmp_path, "second-agent")
    redis.set("unrelated", "kept")
    store = AgentStore(str(tmp_path), redis=redis)
    store.load("first-agent")
    store.load("second-agent")

    assert store.invalidate() == 2
    assert redis.keys("agent-worker:agent:*") == []
    assert redis.get("unrelated") == b"kept"
    assert store.invalidate() == 0
    assert store.invalidate("first-agent") == 0


def test_agent_cache_ttl_only_shortens_the_store_ttl(
    tmp_path: Path, redis: fakeredis.FakeRedis
) -> None:
    write_agent(
        tmp_path, "fresh-agent", MINIMAL_CONFIG.format(name="fresh-agent") + "cache_ttl: 60\n"
    )
    write_agent(
        tmp_path, "lazy-agent", MINIMAL_CONFIG.format(name="lazy-agent") + "cache_ttl: 3600\n"
    )
    store = AgentStore(str(tmp_path), redis=redis, ttl_s=300)
    store.load("fresh-agent")
    store.load("lazy-agent")

    assert 0 < redis.ttl("agent-worker:agent:fresh-agent") <= 60
    assert 60 < redis.ttl("agent-worker:agent:lazy-agent") <= 300


def test_damaged_cache_entry_is_read_again_from_the_source(
    tmp_path: Path, redis: fakeredis.FakeRedis
) -> None:
    make_cached_agent(tmp_path)
    redis.set("agent-worker:agent:cached-agent", b"{not json")

    definition = AgentStore(str(tmp_path), redis=redis).load("cached-agent")

    assert definition.system_prompt == "Remember me."
    cached = json.loads(redis.get("agent-worker:agent:cached-agent") or b"")
    assert cached["system_prompt"] == "Remember me."


def test_definitions_load_while_redis_is_down(tmp_path: Path, fake_redis: FakeRedisClients) -> None:
    server = fakeredis.FakeServer()
    server.connected = False
    make_cached_agent(tmp_path)

    definition = AgentStore(str(tmp_path), redis=fake_redis(server=server)).load("cached-agent")

    assert definition.skills[0].name == "memo-skill"


def test_errors_are_not_cached(tmp_path: Path, redis: fakeredis.FakeRedis) -> None:
    agent_dir = write_agent(tmp_path, "fixed-agent", "name: fixed-agent\n")
    store = AgentStore(str(tmp_path), redis=redis)
    with pytest.raises(AgentConfigError):
        store.load("fixed-agent")

    (agent_dir / "config.yaml").write_text(MINIMAL_CONFIG.format(name="fixed-agent"))

    assert store.load("fixed-agent").config.brain.provider == "anthropic"


def test_without_redis_a_process_memo_respects_the_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config_reads: list[str]
) -> None:
    now = [1_000.0]
    monkeypatch.setattr(store_module, "monotonic", lambda: now[0])
    make_cached_agent(tmp_path)
    store = AgentStore(str(tmp_path), ttl_s=30)
    store.load("cached-agent")

    now[0] += 29
    assert store.load("cached-agent").system_prompt == "Remember me."
    assert len(config_reads) == 1
    now[0] += 2
    store.load("cached-agent")
    assert len(config_reads) == 2


def test_without_redis_invalidate_drops_the_memo(tmp_path: Path, config_reads: list[str]) -> None:
    make_cached_agent(tmp_path)
    store = AgentStore(str(tmp_path))
    store.load("cached-agent")

    assert store.invalidate() == 1
    store.load("cached-agent")
    assert len(config_reads) == 2


def test_ttl_zero_disables_caching(
    tmp_path: Path, redis: fakeredis.FakeRedis, config_reads: list[str]
) -> None:
    make_cached_agent(tmp_path)
    store = AgentStore(str(tmp_path), redis=redis, ttl_s=0)
    store.load("cached-agent")
    store.load("cached-agent")

    assert redis.keys("*") == []
    assert len(config_reads) == 2


# -- HTTP sources (transport fake; tests/integration serves a real tree) -------


def http_store(
    handler: Callable[[httpx2.Request], httpx2.Response],
    base: str = "https://defs.example/bucket?token=s3cr3t",
) -> AgentStore:
    return AgentStore(base, http_transport=httpx2.MockTransport(handler))


def test_http_source_keeps_the_query_token_on_requests_but_out_of_errors() -> None:
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        return httpx2.Response(503)

    with pytest.raises(AgentConfigError) as caught:
        http_store(handler).load("remote-agent")

    assert seen == ["https://defs.example/bucket/agents/remote-agent/config.yaml?token=s3cr3t"]
    assert caught.value.message == (
        "https://defs.example/bucket/agents/remote-agent/config.yaml: HTTP 503"
    )
    assert "s3cr3t" not in str(caught.value)


def test_http_source_hides_user_credentials_in_errors() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    with pytest.raises(AgentConfigError) as caught:
        http_store(handler, base="https://user:pa55@defs.example/").load("remote-agent")

    assert caught.value.message == (
        "https://defs.example/agents/remote-agent/config.yaml: could not be fetched (ConnectError)"
    )


def test_http_source_404_on_a_skill_names_the_skill() -> None:
    files = {
        "/agents/remote-agent/config.yaml": config_with_skills("remote-agent", ["lost-skill"]),
        "/agents/remote-agent/system-prompt.md": "Remote.",
    }

    def handler(request: httpx2.Request) -> httpx2.Response:
        body = files.get(request.url.path)
        return httpx2.Response(200, text=body) if body is not None else httpx2.Response(404)

    store = http_store(handler, base="https://defs.example")

    with pytest.raises(AgentConfigError, match=r"^skills/lost-skill/SKILL.md: not found in "):
        store.load("remote-agent")
    assert store.list_agents() == []


# -- the demo definitions --------------------------------------------------------


def test_demo_agent_loads_from_the_demo_tree() -> None:
    store = AgentStore(str(SHIPPED_DEMO_AGENTS))
    definition = store.load("demo-agent")
    config = definition.config

    assert store.list_agents() == ["demo-agent"]
    assert config.type == "native"
    assert (config.brain.provider, config.brain.model) == ("openai", "gpt-4o-mini")
    assert set(config.capabilities.grants) == {"hub:read", "hub:write"}
    assert config.interests.communities == ["m/general"]
    assert config.interests.keywords
    # Public keys only: make demo adds this worker's extensions to its copy.
    assert config.behavior.discovery.post_final is False
    assert config.capabilities.skills == ["hub-etiquette"]
    assert [skill.name for skill in definition.skills] == ["hub-etiquette"]
    assert "Skill: hub-etiquette" in definition.full_system_prompt()
    assert definition.system_prompt.strip()


def test_a_memory_strategy_is_read_as_its_enum_and_an_unknown_one_is_refused(
    tmp_path: Path,
) -> None:
    brain = "brain: {provider: openai, model: gpt-4o-mini}\n"
    write_agent(tmp_path, "recent-agent", f"name: recent-agent\n{brain}{RECENT_MEMORY}")
    write_agent(tmp_path, "vector-agent", f"name: vector-agent\n{brain}{VECTOR_MEMORY}")

    recent = AgentStore(str(tmp_path), ttl_s=0).load("recent-agent")

    assert recent.config.memory.retrieval.strategy is RecallStrategy.RECENT
    message = load_error(tmp_path, "vector-agent")
    assert "memory.retrieval.strategy" in message
    assert "'embedding_search', 'keyword' or 'recent'" in message


RECENT_MEMORY = "memory: {enabled: true, retrieval: {strategy: recent}}\n"
VECTOR_MEMORY = "memory: {enabled: true, retrieval: {strategy: vectors}}\n"
