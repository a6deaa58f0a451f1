from __future__ import annotations

from pathlib import Path

import pytest

from worker.exceptions import ConfigurationError
from worker.tools._config import McpConfig, McpServerConfig, load_mcp_config

EXAMPLE = """
servers:
  hub:  {url: http://127.0.0.1:8101/mcp,
         tools: {search_posts: hub:read, get_thread: hub:read,
                 create_post: hub:write, create_comment: hub:write}}
  time: {command: mcp-server-time, args: [--local-timezone, UTC], cwd: /tmp,
         tools: {"*": time:read}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mcp.yaml"
    path.write_text(text)
    return path


def test_loads_the_design_example(tmp_path: Path) -> None:
    config = load_mcp_config(write(tmp_path, EXAMPLE))
    hub = config.servers["hub"]
    time = config.servers["time"]
    assert hub.is_http
    assert hub.url == "http://127.0.0.1:8101/mcp"
    assert not time.is_http
    assert time.command == "mcp-server-time"
    assert time.args == ("--local-timezone", "UTC")
    assert time.cwd == Path("/tmp")


def test_required_grant_uses_the_map_then_the_star(tmp_path: Path) -> None:
    config = McpConfig.model_validate(
        {
            "servers": {
                "hub": {"url": "http://h/mcp", "tools": {"create_post": "hub:write"}},
                "gh": {"command": "gh-mcp", "tools": {"*": "github:read", "merge": "github:write"}},
            }
        }
    )
    assert config.required_grant("hub", "create_post") == "hub:write"
    assert config.required_grant("hub", "delete_post") is None
    assert config.required_grant("gh", "merge") == "github:write"
    assert config.required_grant("gh", "list_issues") == "github:read"
    assert config.required_grant("nowhere", "merge") is None


def test_no_servers_means_no_tools(tmp_path: Path) -> None:
    assert load_mcp_config(write(tmp_path, "")).servers == {}
    assert load_mcp_config(write(tmp_path, "servers: {}\n")).servers == {}


def test_bad_grant_error_names_file_server_and_tool(tmp_path: Path) -> None:
    path = write(tmp_path, "servers:\n  hub: {url: http://h/mcp, tools: {create_post: write}}\n")
    with pytest.raises(ConfigurationError) as error:
        load_mcp_config(path)
    assert str(error.value) == (
        f"{path}: servers.hub.tools.create_post: grant must look like svc:scope[:res], got 'write'"
    )


@pytest.mark.parametrize(
    ("server_yaml", "expected"),
    [
        (
            "{url: http://h/mcp, command: x, tools: {'*': a:b}}",
            "servers.s: give exactly one of url (HTTP server) or command (stdio server)",
        ),
        ("{tools: {'*': a:b}}", "servers.s: give exactly one of url"),
        ("{url: ftp://h, tools: {'*': a:b}}", "servers.s.url: url must start with http://"),
        ("{url: http://h, env: {A: b}, tools: {'*': a:b}}", "servers.s: args, env and cwd belong"),
        ("{command: x, headers: {A: b}, tools: {'*': a:b}}", "servers.s: headers and token belong"),
        ("{command: x, token: t, tools: {'*': a:b}}", "servers.s: headers and token belong"),
        (
            "{url: http://h, token: t, headers: {authorization: x}, tools: {'*': a:b}}",
            "servers.s: give token or an Authorization header, not both",
        ),
        ("{url: http://h, first_party: maybe, tools: {'*': a:b}}", "servers.s.first_party:"),
        ("{command: x, tools: {}}", "servers.s.tools: map at least one tool"),
        ("{command: x}", "servers.s.tools: Field required"),
        ("{command: x, tool: {'*': a:b}, tools: {'*': a:b}}", "servers.s.tool: Extra inputs"),
        ("{command: x, tools: {'*': 'hub:*'}}", "servers.s.tools.*: grant must look like"),
    ],
)
def test_server_errors_name_the_field(tmp_path: Path, server_yaml: str, expected: str) -> None:
    path = write(tmp_path, f"servers:\n  s: {server_yaml}\n")
    with pytest.raises(ConfigurationError) as error:
        load_mcp_config(path)
    assert str(error.value).startswith(f"{path}: {expected}")


@pytest.mark.parametrize("name", ["Hub", "hub__x", "hub.x", "hub x", "hub_", "_hub", "_", "a___b"])
def test_server_names_that_break_tool_names_are_refused_naming_the_server(
    tmp_path: Path, name: str
) -> None:
    # "hub_" + "__" + "x" would read back as server "hub", tool "_x": refused at load.
    path = write(tmp_path, f"servers:\n  '{name}': {{command: x, tools: {{'*': a:b}}}}\n")
    with pytest.raises(ConfigurationError) as error:
        load_mcp_config(path)
    assert f"server name {name!r} must match" in str(error.value)
    assert str(error.value).startswith(f"{path}: servers")


@pytest.mark.parametrize("name", ["hub", "h_b", "my-hub_2", "a-"])
def test_server_names_that_split_cleanly_load(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, f"servers:\n  '{name}': {{command: x, tools: {{'*': a:b}}}}\n")
    assert name in load_mcp_config(path).servers


def test_the_worker_token_goes_only_to_first_party_servers_without_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THIRD_TOKEN", "third-party-secret")
    path = write(
        tmp_path,
        "servers:\n"
        "  ours:   {url: http://a/mcp, first_party: true, tools: {'*': a:b}}\n"
        "  ours2:  {url: http://b/mcp, first_party: true, token: own-token, tools: {'*': a:b}}\n"
        "  third:  {url: http://c/mcp, token: '${THIRD_TOKEN}', tools: {'*': a:b}}\n"
        "  plain:  {url: http://d/mcp, headers: {X-Tenant: t1}, tools: {'*': a:b}}\n",
    )
    servers = load_mcp_config(path).servers
    assert servers["ours"].http_headers("worker-token") == {"Authorization": "Bearer worker-token"}
    assert servers["ours2"].http_headers("worker-token") == {"Authorization": "Bearer own-token"}
    assert servers["third"].http_headers("worker-token") == {
        "Authorization": "Bearer third-party-secret"
    }
    assert servers["plain"].http_headers("worker-token") == {"X-Tenant": "t1"}
    assert servers["ours"].http_headers(None) == {}
    assert not servers["third"].first_party
    assert "third-party-secret" not in repr(servers)


def test_unreadable_or_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the MCP configuration"):
        load_mcp_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigurationError, match="cannot read the MCP configuration"):
        load_mcp_config(write(tmp_path, "servers: {a: [\n"))
    with pytest.raises(ConfigurationError, match="expected a mapping with 'servers'"):
        load_mcp_config(write(tmp_path, "- a\n"))


def test_environment_references_are_expanded_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GH_TOKEN", "ghp-secret-value")
    monkeypatch.setenv("HUB_PORT", "8101")
    path = write(
        tmp_path,
        "servers:\n"
        "  gh:  {command: gh-mcp, args: ['${GH_TOKEN}'], env: {GITHUB_TOKEN: '${GH_TOKEN}'},\n"
        "        tools: {'*': github:read}}\n"
        "  hub: {url: 'http://127.0.0.1:${HUB_PORT}/mcp',\n"
        "        headers: {Authorization: 'token ${GH_TOKEN}'}, tools: {'*': hub:read}}\n",
    )
    config = load_mcp_config(path)
    gh = config.servers["gh"]
    hub = config.servers["hub"]
    assert gh.env["GITHUB_TOKEN"].get_secret_value() == "ghp-secret-value"
    # args are not expanded: a secret there would show in every process listing.
    assert gh.args == ("${GH_TOKEN}",)
    assert hub.url == "http://127.0.0.1:8101/mcp"
    assert hub.headers["Authorization"].get_secret_value() == "token ghp-secret-value"
    assert "ghp-secret-value" not in repr(config)


def test_missing_environment_variable_names_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    path = write(
        tmp_path,
        "servers:\n  gh: {command: x, env: {TOKEN: '${NOT_SET_ANYWHERE}'}, tools: {'*': a:b}}\n",
    )
    with pytest.raises(ConfigurationError) as error:
        load_mcp_config(path)
    assert str(error.value) == (
        f"{path}: servers.gh.env.TOKEN: environment variable NOT_SET_ANYWHERE is not set"
    )


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_mcp_config(write(tmp_path, EXAMPLE))
    with pytest.raises(ValueError, match="frozen"):
        config.servers["hub"].url = "http://elsewhere/mcp"  # type: ignore[misc]


def test_pool_marks_a_stdio_server_shared(tmp_path: Path) -> None:
    text = "servers:\n  time: {command: mcp-server-time, pool: true, tools: {'*': time:read}}\n"
    config = load_mcp_config(write(tmp_path, text))
    assert config.servers["time"].pool
    assert not load_mcp_config(write(tmp_path, EXAMPLE)).servers["time"].pool


def test_pool_on_an_http_server_is_refused_naming_the_server(tmp_path: Path) -> None:
    path = write(tmp_path, "servers:\n  hub: {url: http://h/mcp, pool: true, tools: {'*': h:r}}\n")
    with pytest.raises(ConfigurationError) as error:
        load_mcp_config(path)
    assert str(error.value).startswith(f"{path}: servers.hub: pool belongs to stdio servers")


def test_identity_changes_with_any_field_and_hides_secrets() -> None:
    def identity(name: str = "kit", **fields: object) -> str:
        entry = {"command": "kit-mcp", "env": {"TOKEN": "s3cret-value"}, "tools": {"*": "k:r"}}
        return McpServerConfig.model_validate(entry | fields).identity(name)

    assert identity() == identity()
    assert identity() != identity("other")
    assert identity() != identity(env={"TOKEN": "another-secret"})
    assert identity() != identity(args=["--flag"])
    assert identity() != identity(pool=True)
    assert "s3cret" not in identity()
