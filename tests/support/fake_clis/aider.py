"""Fake ``aider`` (0.86.x): one ``--message`` run, plain text out, no tools.

Flags: every option of ``aider --help`` 0.86.2 (argparse: a flag shown with a
metavar takes a value, the others are switches).
"""

from __future__ import annotations

import sys

import yaml

from tests.support.fake_clis._common import Arity, Fake, FlagError

_TAKES_VALUE = [
    "--aiderignore",
    "--alias",
    "--analytics-log",
    "--analytics-posthog-host",
    "--analytics-posthog-project-api-key",
    "--anthropic-api-key",
    "--api-key",
    "--apply",
    "--assistant-output-color",
    "--cache-keepalive-pings",
    "--chat-history-file",
    "--chat-language",
    "--chat-mode",
    "--code-theme",
    "--commit-language",
    "--commit-prompt",
    "--completion-menu-bg-color",
    "--completion-menu-color",
    "--completion-menu-current-bg-color",
    "--completion-menu-current-color",
    "--config",
    "--edit-format",
    "--editor",
    "--editor-edit-format",
    "--editor-model",
    "--encoding",
    "--env-file",
    "--file",
    "--input-history-file",
    "--line-endings",
    "--lint-cmd",
    "--list-models",
    "--llm-history-file",
    "--load",
    "--map-multiplier-no-files",
    "--map-refresh",
    "--map-tokens",
    "--max-chat-history-tokens",
    "--message",
    "--message-file",
    "--model",
    "--model-metadata-file",
    "--model-settings-file",
    "--models",
    "--msg",
    "--notifications-command",
    "--openai-api-base",
    "--openai-api-deployment-id",
    "--openai-api-key",
    "--openai-api-type",
    "--openai-api-version",
    "--openai-organization-id",
    "--read",
    "--reasoning-effort",
    "--set-env",
    "--shell-completions",
    "--test-cmd",
    "--thinking-tokens",
    "--timeout",
    "--tool-error-color",
    "--tool-output-color",
    "--tool-warning-color",
    "--user-input-color",
    "--voice-format",
    "--voice-input-device",
    "--voice-language",
    "--weak-model",
    "-c",
    "-f",
    "-m",
]
_SWITCHES = [
    "--3",
    "--35-turbo",
    "--35turbo",
    "--4",
    "--4-turbo",
    "--4o",
    "--add-gitignore-files",
    "--analytics",
    "--analytics-disable",
    "--apply-clipboard-edits",
    "--architect",
    "--attribute-author",
    "--attribute-co-authored-by",
    "--attribute-commit-message-author",
    "--attribute-commit-message-committer",
    "--attribute-committer",
    "--auto-accept-architect",
    "--auto-commits",
    "--auto-lint",
    "--auto-test",
    "--browser",
    "--cache-prompts",
    "--check-model-accepts-settings",
    "--check-update",
    "--commit",
    "--copy-paste",
    "--dark-mode",
    "--deepseek",
    "--detect-urls",
    "--dirty-commits",
    "--disable-playwright",
    "--dry-run",
    "--exit",
    "--fancy-input",
    "--git",
    "--git-commit-verify",
    "--gitignore",
    "--gui",
    "--haiku",
    "--help",
    "--install-main-branch",
    "--just-check-update",
    "--light-mode",
    "--lint",
    "--mini",
    "--multiline",
    "--no-add-gitignore-files",
    "--no-analytics",
    "--no-attribute-author",
    "--no-attribute-co-authored-by",
    "--no-attribute-commit-message-author",
    "--no-attribute-commit-message-committer",
    "--no-attribute-committer",
    "--no-auto-accept-architect",
    "--no-auto-commits",
    "--no-auto-lint",
    "--no-auto-test",
    "--no-browser",
    "--no-cache-prompts",
    "--no-check-model-accepts-settings",
    "--no-check-update",
    "--no-copy-paste",
    "--no-detect-urls",
    "--no-dirty-commits",
    "--no-dry-run",
    "--no-fancy-input",
    "--no-git",
    "--no-git-commit-verify",
    "--no-gitignore",
    "--no-gui",
    "--no-multiline",
    "--no-notifications",
    "--no-pretty",
    "--no-restore-chat-history",
    "--no-show-model-warnings",
    "--no-show-release-notes",
    "--no-stream",
    "--no-suggest-shell-commands",
    "--no-verify-ssl",
    "--no-watch-files",
    "--notifications",
    "--o1-mini",
    "--o1-preview",
    "--opus",
    "--pretty",
    "--restore-chat-history",
    "--show-diffs",
    "--show-model-warnings",
    "--show-prompts",
    "--show-release-notes",
    "--show-repo-map",
    "--skip-sanity-check-repo",
    "--sonnet",
    "--stream",
    "--subtree-only",
    "--suggest-shell-commands",
    "--test",
    "--update",
    "--upgrade",
    "--verbose",
    "--verify-ssl",
    "--version",
    "--vim",
    "--watch-files",
    "--yes-always",
    "-3",
    "-4",
    "-h",
    "-v",
]
FLAGS: dict[str, Arity] = {**dict.fromkeys(_TAKES_VALUE, "one"), **dict.fromkeys(_SWITCHES, "none")}
CHAT_MODES = ("ask", "code", "architect", "help", "context")


def main() -> int:
    fake = Fake("aider")
    try:
        args = fake.parse(sys.argv[1:], FLAGS)
    except FlagError as exc:
        return fake.fail(f"unrecognized arguments: {exc}", code=2)
    if args.has("--version"):
        print("aider 0.86.2")
        return 0
    if args.positionals:
        return fake.fail(f"this fake edits no files, got {args.positionals}")
    chat_mode = args.value("--chat-mode") or args.value("--edit-format")
    if chat_mode is not None and chat_mode not in CHAT_MODES:
        return fake.fail(f"unknown chat mode {chat_mode!r}")
    if args.value("--message-file"):
        fake.remember_file(args.value("--message-file") or "")
    elif not args.value("--message"):
        return fake.fail("this fake only runs one --message or --message-file")
    settings_file = args.value("--model-settings-file")
    if settings_file:
        entries = yaml.safe_load(fake.remember_file(settings_file))
        names = [entry["name"] for entry in entries]
        if args.value("--model") not in names:
            return fake.fail(f"model settings for {names}, not for {args.value('--model')}")
    exit_code = fake.act_out()
    if exit_code is not None:
        return exit_code
    model = args.value("--model")
    print("Aider v0.86.2")
    print(f"Model: {model} with {chat_mode or 'diff'} edit format")
    print("Git repo: none")
    print("Repo-map: disabled")
    print()
    print(fake.scenario.get("answer", "fake aider answer"))
    print()
    print(
        fake.scenario.get(
            "tokens_line", "Tokens: 1.2k sent, 56 received. Cost: $0.0036 message, $0.0036 session."
        )
    )
    return 0
