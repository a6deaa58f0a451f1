"""Agent definitions as hostile input: files, YAML size and shape, unknown keys, and the
operator's rules for the endpoint and key a definition may choose."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import httpx2
import pytest

import worker.models._factory as factory
from hub_client import AgentSummary
from tests.support.definitions import agent_definition, write_agent
from tests.support.fake_redis import FakeRedisClients
from tests.support.provider_wire import answering_every_request
from worker.agents import AgentDefinition, AgentStore, DefinitionPolicy
from worker.agents._sources import MAX_FILE_BYTES
from worker.exceptions import AgentConfigError, ConfigurationError
from worker.models import Message, ModelRequest
from worker.operations._scheduler import ScheduleConfig, Scheduler
from worker.pipeline import make_model
from worker.settings import Settings, load_settings

CONFIG = "name: {name}\nbrain: {{provider: openai, model: gpt-4o-mini}}\n"
CANARY = "canary-4b1d9e"


def load_error(root: Path | str, agent_id: str, policy: DefinitionPolicy | None = None) -> str:
    store = AgentStore(str(root), ttl_s=0, policy=policy or DefinitionPolicy())
    with pytest.raises(AgentConfigError) as caught:
        store.load(agent_id)
    return caught.value.message


def load(root: Path, agent_id: str, policy: DefinitionPolicy | None = None) -> AgentDefinition:
    return AgentStore(str(root), ttl_s=0, policy=policy or DefinitionPolicy()).load(agent_id)


# -- files: links, FIFOs, devices, size -----------------------------------------------------


def test_system_prompt_linked_to_a_file_outside_is_refused_naming_the_path(
    tmp_path: Path,
) -> None:
    root = tmp_path / "defs"
    folder = write_agent(root, "linky-agent")
    secret_file = tmp_path / "elsewhere.txt"
    secret_file.write_text(f"TOKEN={CANARY}\n")
    (folder / "system-prompt.md").unlink()
    (folder / "system-prompt.md").symlink_to(secret_file)

    message = load_error(root, "linky-agent")

    assert message.startswith("agents/linky-agent/system-prompt.md: resolves to ")
    assert "outside AGENTS_DIR" in message
    assert CANARY not in message


def test_system_prompt_linked_to_proc_self_environ_is_refused(tmp_path: Path) -> None:
    folder = write_agent(tmp_path, "environ-agent")
    (folder / "system-prompt.md").unlink()
    (folder / "system-prompt.md").symlink_to("/proc/self/environ")

    message = load_error(tmp_path, "environ-agent")

    assert message.startswith("agents/environ-agent/system-prompt.md: resolves to /proc/")
    assert "outside AGENTS_DIR" in message


def test_agent_directory_linked_outside_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write_agent(outside, "moved-agent")
    root = tmp_path / "defs"
    (root / "agents").mkdir(parents=True)
    (root / "agents" / "moved-agent").symlink_to(outside / "agents" / "moved-agent")

    message = load_error(root, "moved-agent")

    assert message.startswith("agents/moved-agent/config.yaml: resolves to ")
    assert "outside AGENTS_DIR" in message


def test_links_that_stay_inside_the_tree_are_followed(tmp_path: Path) -> None:
    folder = write_agent(tmp_path, "shared-agent")
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "common.md").write_text("Shared prompt.")
    (folder / "system-prompt.md").unlink()
    (folder / "system-prompt.md").symlink_to(Path("../../prompts/common.md"))

    assert load(tmp_path, "shared-agent").system_prompt == "Shared prompt."


def test_agents_dir_itself_may_be_a_link(tmp_path: Path) -> None:
    write_agent(tmp_path / "release-7", "deployed-agent")
    (tmp_path / "current").symlink_to(tmp_path / "release-7")

    assert load(tmp_path / "current", "deployed-agent").config.name == "deployed-agent"


@pytest.mark.timeout(30)  # a guard: reading a FIFO without O_NONBLOCK would hang here
def test_fifo_system_prompt_is_refused_without_blocking(tmp_path: Path) -> None:
    folder = write_agent(tmp_path, "fifo-agent")
    (folder / "system-prompt.md").unlink()
    os.mkfifo(folder / "system-prompt.md")

    assert load_error(tmp_path, "fifo-agent") == (
        "agents/fifo-agent/system-prompt.md: not a regular file (a FIFO)"
    )


def test_system_prompt_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    folder = write_agent(tmp_path, "zero-agent")
    (folder / "system-prompt.md").unlink()
    (folder / "system-prompt.md").symlink_to("/dev/zero")

    assert "outside AGENTS_DIR" in load_error(tmp_path, "zero-agent")


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a device node needs root")
def test_device_node_inside_the_tree_is_refused(tmp_path: Path) -> None:
    folder = write_agent(tmp_path, "device-agent")
    (folder / "system-prompt.md").unlink()
    os.mknod(folder / "system-prompt.md", 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero

    assert load_error(tmp_path, "device-agent") == (
        "agents/device-agent/system-prompt.md: not a regular file (a character device)"
    )


def test_directory_in_place_of_a_file_is_refused(tmp_path: Path) -> None:
    folder = write_agent(tmp_path, "dir-agent")
    (folder / "system-prompt.md").unlink()
    (folder / "system-prompt.md").mkdir()

    assert load_error(tmp_path, "dir-agent") == (
        "agents/dir-agent/system-prompt.md: not a regular file (a directory)"
    )


def test_sparse_giant_file_is_refused_by_its_size(tmp_path: Path) -> None:
    folder = write_agent(tmp_path, "giant-agent")
    with (folder / "system-prompt.md").open("wb") as prompt:
        prompt.truncate(50 * 1024**3)  # 50 GiB announced, nothing stored

    assert load_error(tmp_path, "giant-agent") == (
        f"agents/giant-agent/system-prompt.md: larger than {MAX_FILE_BYTES} bytes"
    )


# -- HTTP sources: size while streaming, redirects ---------------------------------------


class EndlessBody(httpx2.SyncByteStream):
    """A body that never ends; counts what was pulled from it."""

    def __init__(self) -> None:
        self.chunks_read = 0

    def __iter__(self) -> Iterator[bytes]:
        while True:
            self.chunks_read += 1
            yield b"x" * 65536


def http_store(handler: Callable[[httpx2.Request], httpx2.Response]) -> AgentStore:
    transport = httpx2.MockTransport(handler)
    return AgentStore(
        "https://defs.example/bucket?token=s3cr3t",
        http_transport=transport,
        policy=DefinitionPolicy(),
    )


def test_http_body_over_the_limit_stops_while_streaming() -> None:
    body = EndlessBody()

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, stream=body)

    with pytest.raises(AgentConfigError) as caught:
        http_store(handler).load("stream-agent")

    assert caught.value.message == (
        "https://defs.example/bucket/agents/stream-agent/config.yaml: "
        f"larger than {MAX_FILE_BYTES} bytes"
    )
    assert body.chunks_read <= MAX_FILE_BYTES // 65536 + 2


def test_http_declared_length_over_the_limit_is_refused_before_the_body() -> None:
    body = EndlessBody()

    def handler(request: httpx2.Request) -> httpx2.Response:
        headers = {"content-length": str(MAX_FILE_BYTES + 1)}
        return httpx2.Response(200, headers=headers, stream=body)

    with pytest.raises(AgentConfigError, match="larger than"):
        http_store(handler).load("stream-agent")
    assert body.chunks_read == 0


def test_http_redirect_to_another_origin_is_not_followed() -> None:
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        return httpx2.Response(302, headers={"location": "https://evil.example/steal"})

    with pytest.raises(AgentConfigError) as caught:
        http_store(handler).load("moved-agent")

    assert caught.value.message == (
        "https://defs.example/bucket/agents/moved-agent/config.yaml: redirected to another "
        "origin (https://evil.example), not followed"
    )
    assert all(url.startswith("https://defs.example/") for url in seen)
    assert "s3cr3t" not in caught.value.message


def test_http_redirect_within_the_origin_is_followed() -> None:
    files = {
        "/v2/agents/moved-agent/config.yaml": CONFIG.format(name="moved-agent"),
        "/v2/agents/moved-agent/system-prompt.md": "Moved.",
    }

    def handler(request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path.startswith("/bucket/"):
            return httpx2.Response(301, headers={"location": path.replace("/bucket/", "/v2/")})
        body = files.get(path)
        return httpx2.Response(200, text=body) if body else httpx2.Response(404)

    assert http_store(handler).load("moved-agent").system_prompt == "Moved."


def test_http_redirect_loop_is_refused() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(302, headers={"location": request.url.path})

    with pytest.raises(AgentConfigError, match=r"config\.yaml: more than 5 redirects"):
        http_store(handler).load("loop-agent")


# -- bounded YAML ----------------------------------------------------------------------------

ALIAS_BOMB = "\n".join(
    [
        "name: bomb-agent",
        "brain: {provider: openai, model: m}",
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]"
            for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        "interests: {topics: *i}",
    ]
)


def test_100k_nested_brackets_are_refused_naming_the_file(tmp_path: Path) -> None:
    write_agent(tmp_path, "deep-agent", "name: deep-agent\nx: " + "[" * 100_000)

    message = load_error(tmp_path, "deep-agent")

    # libyaml's scanner may meet its own 1000-level limit before our 20-level one does.
    assert message.startswith("agents/deep-agent/config.yaml: ")
    assert "nested deeper than 20 levels" in message or "maximum nesting depth" in message


def test_deep_block_nesting_is_refused(tmp_path: Path) -> None:
    nested = "".join(f"{'  ' * depth}k{depth}:\n" for depth in range(500))
    write_agent(tmp_path, "block-agent", "name: block-agent\n" + nested)

    assert "nested deeper than 20 levels" in load_error(tmp_path, "block-agent")


def test_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    assert len(ALIAS_BOMB) < 1024
    write_agent(tmp_path, "bomb-agent", ALIAS_BOMB)

    message = load_error(tmp_path, "bomb-agent")

    assert message.startswith(
        "agents/bomb-agent/config.yaml: more than 20000 YAML values once aliases are expanded"
    )


def test_a_few_anchors_and_merge_keys_still_work(tmp_path: Path) -> None:
    config = (
        "name: anchor-agent\n"
        "brain: &brain {provider: openai, model: gpt-4o-mini}\n"
        "interests: {topics: &t [k8s, helm], keywords: *t}\n"
        "behavior: {<<: {max_iterations: 4}, respond_to_replies: false}\n"
    )
    write_agent(tmp_path, "anchor-agent", config)

    loaded = load(tmp_path, "anchor-agent").config

    assert loaded.interests.keywords == ["k8s", "helm"]
    assert loaded.behavior.max_iterations == 4


def test_too_many_plain_values_are_refused(tmp_path: Path) -> None:
    topics = ", ".join(["t"] * 25_000)
    write_agent(tmp_path, "wide-agent", f"name: wide-agent\ninterests: {{topics: [{topics}]}}\n")

    assert "more than 20000 YAML values" in load_error(tmp_path, "wide-agent")


def test_skill_front_matter_is_bounded_too(tmp_path: Path) -> None:
    write_agent(
        tmp_path,
        "skilled-agent",
        CONFIG.format(name="skilled-agent") + "capabilities: {skills: [deep-skill]}\n",
    )
    skill = tmp_path / "skills" / "deep-skill"
    skill.mkdir(parents=True)
    nested = "".join(f"{'  ' * depth}k{depth}:\n" for depth in range(100))
    (skill / "SKILL.md").write_text("---\nname: x\n" + nested + "---\nBody\n")

    message = load_error(tmp_path, "skilled-agent")

    assert message.startswith("skills/deep-skill/SKILL.md: nested deeper than 20 levels")


def test_cache_entry_over_the_size_bound_is_not_stored(
    tmp_path: Path, log_stream: io.StringIO, redis: fakeredis.FakeRedis
) -> None:
    write_agent(tmp_path, "big-agent", prompt="é" * 500_000)  # 1 MB of UTF-8
    skill_names = [f"s{n}" for n in range(3)]
    for name in skill_names:
        folder = tmp_path / "skills" / name
        folder.mkdir(parents=True)
        body = "x" * 600_000
        (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: d\n---\n{body}\n")
    config = CONFIG.format(name="big-agent") + f"capabilities: {{skills: {skill_names}}}\n"
    (tmp_path / "agents" / "big-agent" / "config.yaml").write_text(config)
    store = AgentStore(str(tmp_path), redis=redis, ttl_s=300, policy=DefinitionPolicy())

    assert len(store.load("big-agent").skills) == 3

    assert redis.keys("agent-worker:agent:*") == []
    (event,) = [e for e in map(json.loads, log_stream.getvalue().splitlines())]
    assert event["event"] == "agent_cache_skipped"
    assert event["bytes"] > event["limit"]


# -- unknown keys ----------------------------------------------------------------------------


def events(stream: io.StringIO, name: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, stream.getvalue().splitlines()) if e["event"] == name]


def test_unknown_key_warns_with_its_path_and_a_suggestion(
    tmp_path: Path, log_stream: io.StringIO
) -> None:
    config = CONFIG.format(name="typo-agent") + (
        "behaviour: {max_iterations: 5}\n"
        "behavior: {max_iteration: 3, discovery: {enable: false}}\n"
        "brain2: x\n"
        "future_field: 1\n"
    )
    write_agent(tmp_path, "typo-agent", config)

    definition = load(tmp_path, "typo-agent")

    file = "agents/typo-agent/config.yaml"
    assert definition.warnings == (
        f"{file}: unknown key 'behaviour' (did you mean 'behavior'?)",
        f"{file}: unknown key 'behavior.max_iteration' (did you mean 'behavior.max_iterations'?)",
        f"{file}: unknown key 'behavior.discovery.enable' "
        "(did you mean 'behavior.discovery.enabled'?)",
        f"{file}: unknown key 'brain2' (did you mean 'brain'?)",
        f"{file}: unknown key 'future_field'",
    )
    (event,) = events(log_stream, "agent_definition_warnings")
    assert event["agent"] == "typo-agent"
    assert event["warnings"] == list(definition.warnings)


def test_warnings_are_logged_once_per_read_and_survive_the_cache(
    tmp_path: Path, log_stream: io.StringIO, redis: fakeredis.FakeRedis
) -> None:
    write_agent(tmp_path, "typo-agent", CONFIG.format(name="typo-agent") + "behaviour: {}\n")
    first = AgentStore(str(tmp_path), redis=redis, policy=DefinitionPolicy())
    second = AgentStore(str(tmp_path), redis=redis, policy=DefinitionPolicy())

    loaded = [first.load("typo-agent"), first.load("typo-agent"), second.load("typo-agent")]

    assert len(events(log_stream, "agent_definition_warnings")) == 1
    assert {definition.warnings for definition in loaded} == {
        ("agents/typo-agent/config.yaml: unknown key 'behaviour' (did you mean 'behavior'?)",)
    }


def test_strict_mode_refuses_unknown_keys(tmp_path: Path) -> None:
    write_agent(tmp_path, "typo-agent", CONFIG.format(name="typo-agent") + "behaviour: {}\n")

    message = load_error(tmp_path, "typo-agent", DefinitionPolicy(strict=True))

    assert message == (
        "agents/typo-agent/config.yaml: unknown key 'behaviour' (did you mean 'behavior'?) "
        "(AGENTS_STRICT refuses unknown keys)"
    )


def test_public_botburrow_definition_has_no_warnings(tmp_path: Path) -> None:
    # The public agent-definitions devops-agent, with every section it uses.
    config = """\
version: "1.0.0"
name: devops-agent
display_name: DevOps Agent
description: DevOps specialist
type: claude-code
cache_ttl: 60
brain: {provider: anthropic, model: claude-sonnet-4-20250514, temperature: 0.3, max_tokens: 12000}
capabilities:
  grants: [hub:read, hub:write, github:read]
  skills: []
  mcp_servers: [github, {name: kubernetes, command: mcp-k8s, args: [--read-only], env: {A: b}}]
  shell: {enabled: true, allowed_commands: [kubectl], blocked_patterns: [sudo],
          timeout_seconds: 600}
  spawning: {can_propose: false, allowed_templates: [researcher]}
interests: {topics: [k8s], communities: [m/devops], keywords: [pod], follow_agents: [ron]}
behavior:
  respond_to_mentions: true
  respond_to_replies: true
  respond_to_dms: true
  max_iterations: 15
  discovery: {enabled: true, frequency: staleness, respond_to_questions: true,
              respond_to_discussions: false, min_confidence: 0.8}
  limits: {max_daily_posts: 3, max_daily_comments: 100, max_responses_per_thread: 10,
           min_interval_seconds: 30}
memory:
  enabled: true
  remember: {conversations_with: [ron], projects_worked_on: true}
  max_size_mb: 200
  retrieval: {strategy: recent, max_context_items: 20, relevance_threshold: 0.5}
"""
    write_agent(tmp_path, "devops-agent", config)

    assert load(tmp_path, "devops-agent").warnings == ()


# -- the operator's rules: api_base and api_key_env ------------------------------------------

EVIL = "https://evil.example/v1"
LOCAL_LLM = "http://llm.internal:8000/v1"


def brain_agent(tmp_path: Path, brain: str, name: str = "brainy-agent") -> None:
    write_agent(tmp_path, name, f"name: {name}\nbrain: {brain}\n")


def allowing(**values: Any) -> DefinitionPolicy:
    return DefinitionPolicy.from_settings(isolated_settings(**values))


def isolated_settings(**values: Any) -> Settings:
    defaults: dict[str, Any] = {
        "anthropic_api_key": None,
        "anthropic_base_url": None,
        "openai_api_key": None,
        "openai_base_url": None,
        "hub_api_key": None,
        "mcp_auth_token": None,
        "capability_key": None,
        "provider_base_urls": [],
        "agent_key_envs": [],
        "agents_strict": False,
    }
    return Settings.model_validate({**defaults, **values})


def test_api_base_outside_the_allow_list_is_refused_naming_the_field(tmp_path: Path) -> None:
    brain_agent(tmp_path, f"{{provider: openai, model: m, api_base: '{EVIL}'}}")

    assert load_error(tmp_path, "brainy-agent", allowing()) == (
        f"agents/brainy-agent/config.yaml: brain.api_base '{EVIL}' is not in PROVIDER_BASE_URLS"
    )


def test_api_base_in_the_allow_list_loads_with_an_allowed_key_variable(tmp_path: Path) -> None:
    brain_agent(
        tmp_path,
        "{provider: openai, model: m, api_base: 'HTTP://LLM.internal:8000/v1/', "
        "api_key_env: LOCAL_LLM_KEY}",
    )
    policy = allowing(provider_base_urls=[LOCAL_LLM], agent_key_envs=["LOCAL_LLM_KEY"])

    assert load(tmp_path, "brainy-agent", policy).config.brain.api_key_env == "LOCAL_LLM_KEY"


def test_allowed_api_base_without_a_key_variable_is_refused(tmp_path: Path) -> None:
    brain_agent(tmp_path, f"{{provider: openai, model: m, api_base: '{LOCAL_LLM}'}}")

    assert load_error(tmp_path, "brainy-agent", allowing(provider_base_urls=[LOCAL_LLM])) == (
        f"agents/brainy-agent/config.yaml: brain.api_base '{LOCAL_LLM}' needs "
        "brain.api_key_env: the worker's OPENAI_API_KEY is sent only to OPENAI_BASE_URL"
    )


def test_the_operators_own_endpoint_needs_no_allow_list_entry(tmp_path: Path) -> None:
    brain_agent(tmp_path, f"{{provider: openai, model: m, api_base: '{LOCAL_LLM}/'}}")

    definition = load(tmp_path, "brainy-agent", allowing(openai_base_url=LOCAL_LLM))

    assert definition.config.brain.api_base == f"{LOCAL_LLM}/"


def test_key_variable_outside_the_allow_list_is_refused(tmp_path: Path) -> None:
    brain_agent(tmp_path, "{provider: openai, model: m, api_key_env: SOME_OTHER_KEY}")

    assert load_error(tmp_path, "brainy-agent", allowing(agent_key_envs=["MY_KEY"])) == (
        "agents/brainy-agent/config.yaml: brain.api_key_env 'SOME_OTHER_KEY' is not in "
        "AGENT_KEY_ENVS"
    )


@pytest.mark.parametrize(
    "variable",
    [
        "ANTHROPIC_API_KEY",
        "HUB_API_KEY",
        "MCP_AUTH_TOKEN",
        "CAPABILITY_KEY",
        "REDIS_URL",
        "RQ_REDIS_URL",
        "hub_api_key",
    ],
)
def test_key_variable_naming_a_worker_secret_is_refused(tmp_path: Path, variable: str) -> None:
    brain_agent(tmp_path, f"{{provider: openai, model: m, api_key_env: {variable}}}")

    assert load_error(tmp_path, "brainy-agent", allowing()).startswith(
        f"agents/brainy-agent/config.yaml: brain.api_key_env: {variable} is the worker's own secret"
    )


OFFICIAL_OPENAI = "https://api.openai.com/v1"


@pytest.mark.parametrize(
    "brain",
    [
        f"{{provider: openai, model: m, api_base: '{OFFICIAL_OPENAI}', "
        "api_key_env: OPENAI_API_KEY}",
        "{provider: openai, model: m, api_key_env: OPENAI_API_KEY}",
        "{provider: openai, model: m, api_base: 'HTTPS://API.openai.com:443/v1/'}",
        "{provider: anthropic, model: m, api_base: 'https://api.anthropic.com', "
        "api_key_env: ANTHROPIC_API_KEY}",
        f"{{provider: openai, model: m, api_base: '{LOCAL_LLM}', api_key_env: OPENAI_API_KEY}}",
    ],
)
def test_the_providers_endpoint_with_its_own_key_variable_loads(tmp_path: Path, brain: str) -> None:
    # The public format's default case: the provider's endpoint (or the operator's) and key.
    brain_agent(tmp_path, brain)
    policy = allowing(openai_base_url=LOCAL_LLM)

    definition = load(tmp_path, "brainy-agent", policy)

    assert policy.uses_operator_access(definition.config.brain)


@pytest.mark.parametrize(
    ("brain", "message"),
    [
        # The operator's key meant for one endpoint, named for an endpoint the operator allowed.
        (
            f"{{provider: openai, model: m, api_base: '{LOCAL_LLM}', api_key_env: OPENAI_API_KEY}}",
            "brain.api_key_env: OPENAI_API_KEY is the worker's own secret, sent only to "
            f"OPENAI_BASE_URL or the provider's public endpoint, not to '{LOCAL_LLM}'",
        ),
        # Another provider's key, on this provider's own endpoint.
        (
            "{provider: anthropic, model: m, api_key_env: OPENAI_API_KEY}",
            "brain.api_key_env: OPENAI_API_KEY is the worker's own secret",
        ),
        (
            f"{{provider: openai, model: m, api_base: '{OFFICIAL_OPENAI}', "
            "api_key_env: ANTHROPIC_API_KEY}",
            "brain.api_key_env: ANTHROPIC_API_KEY is the worker's own secret",
        ),
    ],
)
def test_a_providers_key_variable_is_refused_for_any_other_endpoint_or_provider(
    tmp_path: Path, brain: str, message: str
) -> None:
    brain_agent(tmp_path, brain)

    error = load_error(tmp_path, "brainy-agent", allowing(provider_base_urls=[LOCAL_LLM]))

    assert error.startswith(f"agents/brainy-agent/config.yaml: {message}")


@pytest.mark.parametrize("variable", ["OPENAI_API_KEY", "HUB_API_KEY", "CAPABILITY_KEY"])
def test_operator_cannot_allow_a_worker_secret_as_an_agent_key(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv("AGENT_KEY_ENVS", f"TEAM_KEY,{variable}")

    with pytest.raises(ConfigurationError) as caught:
        load_settings()

    assert caught.value.message == (
        f"invalid setting AGENT_KEY_ENVS: {variable} holds the worker's own secret; "
        "it cannot be an agent key"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            "https://a.example/v1, HTTP://B.example:80/v1/",
            ["https://a.example/v1", "http://b.example/v1"],
        ),
        ('["https://a.example:8443/v1"]', ["https://a.example:8443/v1"]),
        ("", []),
    ],
)
def test_provider_base_urls_take_commas_or_json(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: list[str]
) -> None:
    monkeypatch.setenv("PROVIDER_BASE_URLS", raw)

    assert load_settings().provider_base_urls == expected


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("ftp://files.example", "'ftp://files.example' is not an absolute http(s) URL"),
        ("https://user:pw@llm.example/v1", "must not carry user:password@"),
        ('["https://a.example"', "PROVIDER_BASE_URLS is not a valid JSON list"),
    ],
)
def test_bad_provider_base_urls_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str, problem: str
) -> None:
    monkeypatch.setenv("PROVIDER_BASE_URLS", raw)

    with pytest.raises(ConfigurationError) as caught:
        load_settings()

    assert caught.value.message.startswith("invalid setting PROVIDER_BASE_URLS: ")
    assert problem in caught.value.message
    assert "pw" not in caught.value.message


def test_cached_definition_is_not_used_under_other_rules(
    tmp_path: Path, redis: fakeredis.FakeRedis
) -> None:
    brain_agent(
        tmp_path, f"{{provider: openai, model: m, api_base: '{LOCAL_LLM}', api_key_env: K}}"
    )
    lenient = allowing(provider_base_urls=[LOCAL_LLM], agent_key_envs=["K"])
    AgentStore(str(tmp_path), redis=redis, policy=lenient).load("brainy-agent")

    with pytest.raises(AgentConfigError, match="is not in AGENT_KEY_ENVS"):
        AgentStore(str(tmp_path), redis=redis, policy=allowing()).load("brainy-agent")


# -- the worker's key goes only to the operator's endpoint ------------------------------------

WORKER_KEY = "sk-worker-7f3a"
AGENT_KEY = "sk-agent-19c2"


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> list[httpx2.Request]:
    """Every request a model sends, answered 401 (an auth error ends the call at once)."""
    return answering_every_request(monkeypatch, 401, "no")


def definition(brain: dict[str, Any]) -> AgentDefinition:
    return agent_definition("brainy-agent", brain=brain, system_prompt="Hi.")


async def call_once(agent: AgentDefinition, config: Settings, redis: fakeredis.FakeRedis) -> None:
    model = make_model(agent, config, redis)
    request = ModelRequest(system="s", messages=[Message(role="user", content="hi")])
    with pytest.raises(Exception):  # noqa: B017 - the 401; what was sent is the point
        await model.complete(request)


@pytest.mark.anyio
async def test_agent_endpoint_gets_the_agent_key_never_the_workers(
    monkeypatch: pytest.MonkeyPatch, wire: list[httpx2.Request], redis: fakeredis.FakeRedis
) -> None:
    monkeypatch.setenv("LOCAL_LLM_KEY", AGENT_KEY)
    config = isolated_settings(
        openai_api_key=WORKER_KEY,
        provider_base_urls=[LOCAL_LLM],
        agent_key_envs=["LOCAL_LLM_KEY"],
    )
    agent = definition(
        {"provider": "openai", "model": "m", "api_base": LOCAL_LLM, "api_key_env": "LOCAL_LLM_KEY"}
    )

    await call_once(agent, config, redis)

    assert wire, "the model sent nothing"
    assert {str(request.url.host) for request in wire} == {"llm.internal"}
    assert {request.headers["authorization"] for request in wire} == {f"Bearer {AGENT_KEY}"}


@pytest.mark.anyio
async def test_operator_endpoint_gets_the_worker_key(
    wire: list[httpx2.Request], redis: fakeredis.FakeRedis
) -> None:
    config = isolated_settings(openai_api_key=WORKER_KEY, openai_base_url=LOCAL_LLM)

    await call_once(definition({"provider": "openai", "model": "m"}), config, redis)

    assert {request.headers["authorization"] for request in wire} == {f"Bearer {WORKER_KEY}"}
    assert {str(request.url.host) for request in wire} == {"llm.internal"}


@pytest.mark.anyio
@pytest.mark.parametrize("operator_base_url", [None, LOCAL_LLM])
async def test_the_public_endpoint_with_the_providers_key_goes_to_the_operators_endpoint(
    wire: list[httpx2.Request], operator_base_url: str | None, redis: fakeredis.FakeRedis
) -> None:
    # OPENAI_BASE_URL, when set, stands in for the public endpoint the definition names.
    config = isolated_settings(openai_api_key=WORKER_KEY, openai_base_url=operator_base_url)
    agent = definition(
        {
            "provider": "openai",
            "model": "m",
            "api_base": "https://api.openai.com/v1",
            "api_key_env": "OPENAI_API_KEY",
        }
    )

    await call_once(agent, config, redis)

    expected_host = "llm.internal" if operator_base_url else "api.openai.com"
    assert {str(request.url.host) for request in wire} == {expected_host}
    assert {request.headers["authorization"] for request in wire} == {f"Bearer {WORKER_KEY}"}


@pytest.mark.anyio
async def test_an_allow_listed_endpoint_never_gets_the_operators_key(
    monkeypatch: pytest.MonkeyPatch,
    wire: list[httpx2.Request],
    fake_redis: FakeRedisClients,
    redis: fakeredis.FakeRedis,
) -> None:
    # Its own key only, whatever the operator's key variables hold.
    monkeypatch.setenv("LOCAL_LLM_KEY", AGENT_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", WORKER_KEY)
    config = isolated_settings(
        openai_api_key=WORKER_KEY,
        anthropic_api_key="sk-ant-worker",
        provider_base_urls=[LOCAL_LLM],
        agent_key_envs=["LOCAL_LLM_KEY"],
    )
    listed = {"provider": "openai", "model": "m", "api_base": LOCAL_LLM}
    await call_once(definition({**listed, "api_key_env": "LOCAL_LLM_KEY"}), config, redis)
    with pytest.raises(AgentConfigError, match="OPENAI_API_KEY is the worker's own secret"):
        make_model(
            definition({**listed, "api_key_env": "OPENAI_API_KEY"}),
            config,
            fake_redis(),
        )
    with pytest.raises(AgentConfigError, match=r"needs brain\.api_key_env"):
        make_model(definition(listed), config, fake_redis())

    assert {request.headers["authorization"] for request in wire} == {f"Bearer {AGENT_KEY}"}


@pytest.mark.anyio
async def test_an_anthropic_agent_on_its_own_endpoint_never_gets_the_openai_key(
    wire: list[httpx2.Request],
    redis: fakeredis.FakeRedis,
) -> None:
    config = isolated_settings(openai_api_key=WORKER_KEY, anthropic_api_key="sk-ant-worker")
    agent = definition(
        {"provider": "anthropic", "model": "m", "api_base": "https://api.anthropic.com"}
    )

    await call_once(agent, config, redis)

    assert {str(request.url.host) for request in wire} == {"api.anthropic.com"}
    assert {request.headers["authorization"] for request in wire} == {"Bearer sk-ant-worker"}
    assert all(WORKER_KEY not in str(request.headers) for request in wire)


def test_make_model_refuses_a_definition_that_skipped_the_load_check(
    wire: list[httpx2.Request],
    fake_redis: FakeRedisClients,
) -> None:
    # A definition built without the store (or cached under older rules).
    config = isolated_settings(openai_api_key=WORKER_KEY)

    with pytest.raises(AgentConfigError, match=r"brain\.api_base .* is not in PROVIDER_BASE_URLS"):
        make_model(
            definition({"provider": "openai", "model": "m", "api_base": EVIL}),
            config,
            fake_redis(),
        )
    assert wire == []


def test_factory_never_pairs_the_worker_key_with_another_endpoint() -> None:
    # Below every policy: create_model itself has no way to send the worker key elsewhere.
    config = isolated_settings(openai_api_key=WORKER_KEY)

    with pytest.raises(AgentConfigError) as caught:
        factory.create_model("openai", "m", base_url=EVIL, settings=config, prices=PRICES)

    assert caught.value.message == (
        f"openai model 'm' at '{EVIL}' has no key of its own: the worker's OPENAI_API_KEY is "
        "sent only to OPENAI_BASE_URL"
    )
    assert WORKER_KEY not in caught.value.message


def test_agent_key_variable_holding_a_copy_of_a_worker_secret_is_refused(
    monkeypatch: pytest.MonkeyPatch,
    fake_redis: FakeRedisClients,
) -> None:
    monkeypatch.setenv("LOCAL_LLM_KEY", "canary-hub-key")
    config = isolated_settings(
        openai_api_key=WORKER_KEY,
        hub_api_key="canary-hub-key",
        provider_base_urls=[LOCAL_LLM],
        agent_key_envs=["LOCAL_LLM_KEY"],
    )
    agent = definition(
        {"provider": "openai", "model": "m", "api_base": LOCAL_LLM, "api_key_env": "LOCAL_LLM_KEY"}
    )

    with pytest.raises(AgentConfigError) as caught:
        make_model(agent, config, fake_redis())

    assert "is one of the worker's own secrets" in caught.value.message
    assert "canary-hub-key" not in caught.value.message


def test_fallback_on_another_provider_uses_that_providers_operator_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_LLM_KEY", AGENT_KEY)
    config = isolated_settings(
        openai_api_key=WORKER_KEY,
        anthropic_api_key="sk-ant-worker",
        provider_base_urls=[LOCAL_LLM],
        agent_key_envs=["LOCAL_LLM_KEY"],
    )
    model = factory.create_model(
        "openai",
        "m",
        api_key=AGENT_KEY,
        base_url=LOCAL_LLM,
        fallbacks=[("openai", "m2"), ("anthropic", "claude-haiku-4-5")],
        settings=config,
        prices=PRICES,
    )

    clients = [member._client for member in model.models]  # type: ignore[attr-defined]
    assert [(str(c.base_url), c.api_key) for c in clients] == [
        (f"{LOCAL_LLM}/", AGENT_KEY),
        (f"{LOCAL_LLM}/", AGENT_KEY),
        ("https://api.anthropic.com", "sk-ant-worker"),
    ]


PRICES = factory.PriceTable.builtin()


# -- the scheduler: one bad definition skips that agent only ---------------------------------


class StaleHub:
    def __init__(self, *agent_ids: str) -> None:
        self.agent_ids = agent_ids

    def stale_agents(self, min_staleness_s: int) -> list[AgentSummary]:
        return [AgentSummary(id=agent_id) for agent_id in self.agent_ids]


class StoreWithABug(AgentStore):
    """A load that fails in a way nobody planned for, for one agent."""

    def load(self, agent_id: str) -> AgentDefinition:
        if agent_id == "buggy-agent":
            raise RuntimeError("surprise")
        return super().load(agent_id)


def test_scheduler_skips_each_hostile_definition_and_explores_the_rest(
    tmp_path: Path, log_stream: io.StringIO, redis: fakeredis.FakeRedis
) -> None:
    explorer = CONFIG + "behavior: {{discovery: {{enabled: true}}}}\n"
    write_agent(tmp_path, "good-agent", explorer.format(name="good-agent"))
    write_agent(tmp_path, "deep-agent", "name: deep-agent\nx: " + "[" * 100_000)
    write_agent(tmp_path, "bomb-agent", ALIAS_BOMB)
    fifo_folder = write_agent(tmp_path, "fifo-agent")
    (fifo_folder / "system-prompt.md").unlink()
    os.mkfifo(fifo_folder / "system-prompt.md")
    write_agent(tmp_path, "buggy-agent")
    write_agent(tmp_path, "later-agent", explorer.format(name="later-agent"))
    store = StoreWithABug(str(tmp_path), redis=redis, ttl_s=0, policy=DefinitionPolicy())
    hub = StaleHub(
        "deep-agent", "good-agent", "bomb-agent", "fifo-agent", "buggy-agent", "later-agent"
    )
    scheduler = Scheduler(redis, store, hub, ScheduleConfig(interval_s=60), clock=lambda: 6e6)

    result = scheduler.run_round()

    assert {agent: decision.value for agent, decision in result.decisions.items()} == {
        "deep-agent": "broken_definition",
        "good-agent": "enqueued",
        "bomb-agent": "broken_definition",
        "fifo-agent": "broken_definition",
        "buggy-agent": "broken_definition",
        "later-agent": "enqueued",
    }
    reasons = {e["agent"]: e["reason"] for e in events(log_stream, "agent_skipped")}
    assert reasons["deep-agent"].startswith("agents/deep-agent/config.yaml: ")
    assert reasons["bomb-agent"].startswith("agents/bomb-agent/config.yaml: more than 20000")
    assert reasons["fifo-agent"] == (
        "agents/fifo-agent/system-prompt.md: not a regular file (a FIFO)"
    )
    assert reasons["buggy-agent"] == "could not load its definition (RuntimeError: surprise)"


def test_provider_credentials_tie_the_worker_key_to_the_operator_endpoint() -> None:
    config = isolated_settings(openai_api_key=WORKER_KEY, openai_base_url=LOCAL_LLM)

    own = factory.provider_credentials("openai", "m", api_key=None, base_url=None, settings=config)
    same = factory.provider_credentials(
        "openai", "m", api_key=None, base_url="HTTP://LLM.Internal:8000/v1/", settings=config
    )
    agents = factory.provider_credentials(
        "openai", "m", api_key=AGENT_KEY, base_url=EVIL, settings=config
    )

    assert own == (WORKER_KEY, LOCAL_LLM)
    assert same == (WORKER_KEY, LOCAL_LLM)
    assert agents == (AGENT_KEY, EVIL)
    with pytest.raises(AgentConfigError, match="has no key of its own"):
        factory.provider_credentials("openai", "m", api_key=None, base_url=EVIL, settings=config)
