"""``agent-worker check`` on files and settings (``--offline``): one line per problem, named."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import fakeredis
import pytest
import yaml

from tests.support.definitions import SHIPPED_DEMO_AGENTS, write_agent
from worker.agents import AgentStore
from worker.operations import check_at_start
from worker.operations._check_report import CheckReport, Severity
from worker.operations._checks import main, run_checks
from worker.settings import Settings


def good_config(name: str, extra: str = "") -> str:
    return f"name: {name}\nbrain: {{provider: openai, model: gpt-4o-mini}}\n{extra}"


# The definitions here use openai models: their key is set unless a test says otherwise.
MODEL_KEY = "sk-unit-4b8e2c61f07d93a5"


def offline(**settings: object) -> CheckReport:
    config = Settings(**{"openai_api_key": MODEL_KEY, **settings})  # type: ignore[arg-type]
    return run_checks(config, redis=False, network=False)


def lines(report: CheckReport) -> list[str]:
    return [problem.line() for problem in report.problems]


def test_the_demo_definitions_pass(tmp_path: Path) -> None:
    report = offline(agents_dir=str(SHIPPED_DEMO_AGENTS))
    assert report.problems == []
    assert "1 of 1 agent definitions load" in report.checked
    assert "1 skills parse" in report.checked


def test_a_missing_agents_dir_is_one_error_naming_the_variable(tmp_path: Path) -> None:
    report = offline(agents_dir=str(tmp_path / "nowhere"))
    assert lines(report) == [f"error: AGENTS_DIR: {tmp_path / 'nowhere'} does not exist"]


def test_agents_dir_pointing_inside_the_tree_says_to_use_its_parent(tmp_path: Path) -> None:
    write_agent(tmp_path, "helper-agent", good_config("helper-agent"))
    report = offline(agents_dir=str(tmp_path / "agents"))
    (problem,) = report.errors
    assert problem.subject == "AGENTS_DIR" and "point AGENTS_DIR at its parent" in problem.message


def test_an_empty_tree_is_a_warning_not_an_error(tmp_path: Path) -> None:
    report = offline(agents_dir=str(tmp_path))
    assert report.errors == []
    assert [p.subject for p in report.warnings] == ["AGENTS_DIR"]


def test_broken_definitions_name_file_and_field_and_only_concern_their_agent(
    tmp_path: Path,
) -> None:
    write_agent(tmp_path, "good-agent", good_config("good-agent"))
    write_agent(
        tmp_path,
        "hot-agent",
        "name: hot-agent\nbrain: {provider: openai, model: m, temperature: 9}\n",
    )
    write_agent(tmp_path, "mute-agent", good_config("mute-agent"), prompt=None)
    write_agent(tmp_path, "typo-agent", good_config("typo-agent", "behaviour: {}\n"))
    report = offline(agents_dir=str(tmp_path))
    errors = {p.agent: p.line() for p in report.errors}
    assert errors["hot-agent"].startswith(
        "error: agents/hot-agent/config.yaml: brain.temperature: Input should be less than"
    )
    assert "agents/mute-agent/system-prompt.md" in errors["mute-agent"]
    (warning,) = report.warnings
    assert warning.subject == "agents/typo-agent/config.yaml" and "behaviour" in warning.message
    assert "2 of 4 agent definitions load" in report.checked


def test_skills_without_skill_md_or_with_bad_front_matter(tmp_path: Path) -> None:
    write_agent(tmp_path, "good-agent", good_config("good-agent"))
    (tmp_path / "skills" / "empty").mkdir(parents=True)
    (tmp_path / "skills" / "broken").mkdir()
    (tmp_path / "skills" / "broken" / "SKILL.md").write_text("no front matter\n")
    report = offline(agents_dir=str(tmp_path))
    assert [p.subject for p in report.warnings] == ["skills/empty"]
    assert [p.subject for p in report.errors] == ["skills/broken/SKILL.md"]


def test_mcp_config_stdio_command_missing_from_path_is_an_error(tmp_path: Path) -> None:
    write_agent(
        tmp_path,
        "tool-agent",
        good_config("tool-agent", "capabilities: {mcp_servers: [time, gh]}\n"),
    )
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text(
        "servers:\n"
        '  time: {command: mcp-server-tme, tools: {"*": time:read}}\n'
        f'  py: {{command: "{sys.executable}", tools: {{"*": py:run}}}}\n'
        '  abs: {command: /nonexistent/server, tools: {"*": abs:run}}\n'
    )
    report = offline(agents_dir=str(tmp_path), mcp_config=mcp)
    assert sorted(p.line() for p in report.errors) == [
        f"error: MCP_CONFIG ({mcp}): servers.abs.command: '/nonexistent/server' is not an "
        "executable file",
        f"error: MCP_CONFIG ({mcp}): servers.time.command: 'mcp-server-tme' not found on PATH",
    ]
    # The agent names a server MCP_CONFIG lacks: its tools would silently be missing.
    (warning,) = report.warnings
    assert warning.agent == "tool-agent" and "'gh' is not in MCP_CONFIG" in warning.message


def test_unreadable_mcp_config_grant_policy_and_prices(tmp_path: Path) -> None:
    write_agent(tmp_path, "good-agent", good_config("good-agent"))
    policy = tmp_path / "policy.yaml"
    policy.write_text("default: {allowed_grants: ['hub:*']}\nagents: {ghost-agent: {}}\n")
    report = offline(
        agents_dir=str(tmp_path),
        mcp_config=tmp_path / "missing.yaml",
        grant_policy=policy,
        prices_file=tmp_path / "prices.yaml",
    )
    assert {p.subject for p in report.errors} == {"MCP_CONFIG", "PRICES_FILE"}
    assert [p.message for p in report.warnings] == ["agents.ghost-agent: no such agent"]
    policy.write_text("default: {allowed_grants: 7}\n")
    report = offline(agents_dir=str(tmp_path), grant_policy=policy)
    assert [p.subject for p in report.errors] == ["GRANT_POLICY"]


def test_main_prints_one_line_per_problem_and_exits_1_on_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTS_DIR", str(tmp_path / "nowhere"))
    assert main(["--offline"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"error: AGENTS_DIR: {tmp_path / 'nowhere'} does not exist"
    assert out[-1].startswith("check: 1 errors, 0 warnings")
    assert main(["--offline", "--json"]) == 1
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["ok"] is False and parsed["problems"][0]["subject"] == "AGENTS_DIR"


def test_main_names_a_bad_setting_without_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HUB_URL", "not-a-url")
    assert main(["--offline"]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("error: HUB_URL: must be an http(s) URL")


def test_strict_turns_warnings_into_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTS_DIR", str(tmp_path))  # empty tree: a warning
    assert main(["--offline"]) == 0
    assert main(["--offline", "--strict"]) == 1


def test_check_at_start_stops_on_fleet_errors_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], log_stream: io.StringIO
) -> None:
    write_agent(tmp_path, "hot-agent", "name: hot-agent\nbrain: {provider: nope, model: m}\n")
    # An agent's own error is logged; the rest of the fleet keeps serving.
    check_at_start(Settings(agents_dir=str(tmp_path), hub_url="http://127.0.0.1:9"), timeout_s=0.5)
    assert capsys.readouterr().err == ""
    events = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    logged = {
        (e["level"], e["subject"], e["agent"]) for e in events if e["event"] == "config_problem"
    }
    assert logged == {
        ("error", "agents/hot-agent/config.yaml", "hot-agent"),
        ("warning", "HUB_URL", None),  # nothing listens on port 9
    }
    with pytest.raises(SystemExit) as stopped:
        check_at_start(Settings(agents_dir=str(tmp_path / "gone")), timeout_s=0.5)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"agent-worker: error: AGENTS_DIR: {tmp_path / 'gone'} does not exist"
    ]


def test_a_definition_warning_is_logged_once_at_start_not_again_by_the_first_task(
    tmp_path: Path, log_stream: io.StringIO, redis: fakeredis.FakeRedis
) -> None:
    write_agent(tmp_path, "typo-agent", good_config("typo-agent", "behaviour: {}\n"))
    config = Settings(agents_dir=str(tmp_path), hub_url="http://127.0.0.1:9")

    check_at_start(config, timeout_s=0.5, agent_cache=redis)
    # The worker's first task reads the definition as every task does.
    first_task = AgentStore(str(tmp_path), redis=redis, ttl_s=config.agent_cache_ttl_s)
    definition = first_task.load("typo-agent")

    events = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    warned = [e for e in events if e["event"] == "agent_definition_warnings"]
    assert [e["agent"] for e in warned] == ["typo-agent"]
    assert definition.warnings == tuple(warned[0]["warnings"])


def test_severity_values_are_the_line_prefixes() -> None:
    assert [s.value for s in Severity] == ["error", "warning"]


def test_memory_tool_grants_without_a_memory_are_a_warning(tmp_path: Path) -> None:
    grants = "capabilities: {grants: [memory:read, memory:write], mcp_servers: [memory]}\n"
    memory = "memory: {enabled: true, retrieval: {strategy: recent}}\n"
    write_agent(tmp_path, "forgetful", good_config("forgetful", grants))
    write_agent(tmp_path, "note-taker", good_config("note-taker", grants + memory))

    report = offline(agents_dir=str(tmp_path))

    (warning,) = report.warnings
    assert warning.agent == "forgetful"
    assert "memory:read, memory:write without memory.enabled" in warning.message


def test_check_at_start_names_the_providers_whose_sdks_the_worker_loads(tmp_path: Path) -> None:
    write_agent(tmp_path, "local-agent", good_config("local-agent"))
    write_agent(tmp_path, "typo-agent", "name: typo-agent\nbrain: {provider: nope, model: m}\n")
    config = Settings(agents_dir=str(tmp_path), hub_url="http://127.0.0.1:9")
    assert check_at_start(config, timeout_s=0.5) == {"openai"}


def test_a_worker_loads_only_the_sdks_of_the_providers_its_agents_use() -> None:
    # In a fresh process, as the worker parent preloads before it forks job processes.
    probe = (
        "import sys; from worker.pipeline import preload; preload({'openai'}); "
        "print(sorted(name for name in ('openai', 'anthropic') if name in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.split() == ["['openai']"]


def test_a_widened_scope_is_shown_for_each_opt_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    widened = "scope: {comment_on_any_post: true, post_in: [m/releases, m/ops]}\n"
    write_agent(tmp_path, "announcer", good_config("announcer", widened))
    write_agent(tmp_path, "narrow-agent", good_config("narrow-agent"))
    monkeypatch.setenv("AGENTS_DIR", str(tmp_path))
    monkeypatch.setenv("OPENAI_API_KEY", MODEL_KEY)

    assert main(["--offline"]) == 0

    out = capsys.readouterr().out.splitlines()
    shown = [line for line in out if "widened scope" in line]
    assert shown == [
        "warning: agents/announcer/config.yaml: widened scope: scope.comment_on_any_post (its "
        "tasks may write beyond the thread or feed they were given; an injected instruction "
        "may use that too)",
        "warning: agents/announcer/config.yaml: widened scope: scope.post_in: m/releases, m/ops "
        "(its tasks may write beyond the thread or feed they were given; an injected "
        "instruction may use that too)",
    ]


def test_check_shows_when_each_agent_is_private_and_where_it_may_then_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    servers = {
        "hub": {"url": "http://127.0.0.1:9/mcp", "first_party": True, "tools": {"*": "hub:read"}},
        "web": {
            "url": "http://127.0.0.1:9/mcp",
            "first_party": True,
            "tools": {"fetch": "web:read"},
        },
        "lookup": {"url": "https://lookup.example/mcp", "tools": {"search": "lookup:read"}},
        "clock": {"url": "https://clock.example/mcp", "tools": {"now": "c:r"}, "private_ok": ["*"]},
    }
    mcp = tmp_path / "mcp.yaml"
    mcp.write_text(yaml.safe_dump({"servers": servers}))
    grants = "capabilities: {grants: [hub:read, web:read, lookup:read, c:r]}\n"
    write_agent(tmp_path, "helper", good_config("helper", grants))
    write_agent(tmp_path, "vault", good_config("vault", grants + "scope: {private: true}\n"))
    write_agent(tmp_path, "reader", good_config("reader", "capabilities: {grants: [hub:read]}\n"))
    for name, value in {
        "AGENTS_DIR": str(tmp_path),
        "MCP_CONFIG": str(mcp),
        "OPENAI_API_KEY": MODEL_KEY,
        "EGRESS_ALLOW": "https://docs.example.com/",
    }.items():
        monkeypatch.setenv(name, value)

    assert main(["--offline"]) == 0

    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("reach:")]
    there = (
        "there clock__now unbounded (private_ok); lookup__search withheld; web__fetch loads "
        "the person's own links and EGRESS_ALLOW (https://docs.example.com/)"
    )
    assert shown == [
        "reach: helper: private in direct messages, threads the Hub calls not public or does "
        f"not mark, and tasks that recall a private memory; {there}",
        f"reach: vault: private in every task (scope.private); {there}",
    ]
