"""MCP server ``hub``: search, read and write on the Hub for an agent.

Run ``python -m mcp_servers.hub [--host H] [--port 8101] [--stdio] [--timeout-s 20]``
with ``HUB_URL`` (and ``HUB_API_KEY`` when the Hub wants one) in its environment:
the key lives here, never in the worker's prompts. With ``CAPABILITY_KEY`` set,
every call needs the task's signed capability in its ``_meta`` and acts for the
agent it names, with the grants it holds (``TOOL_GRANTS``); see
``mcp_servers._identity``. Writes pass the call's idempotency key to the Hub, so
a retried tool call never posts twice. The capability's scope bounds where the writes
go (``worker.tools._scope``): a comment only on a post the task may comment on, a post
only in a community it may post in, and the comment that is a notification's reply is
sent with the task's reply key (``<task_id>:reply``), so the thread gets one reply from
the task whatever asked for more. Each Hub call is bounded by the task's deadline. One
``HubClient`` serves the whole process.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx2
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from hub_client import (
    Comment,
    HubAuthError,
    HubClient,
    HubError,
    HubNotFound,
    HubRejected,
    HubUnavailable,
    Post,
)
from mcp_servers._identity import Caller, Identity
from mcp_servers._serving import (
    add_tools,
    argument_parser,
    identity_or_exit,
    log_event,
    logged_tool_call,
    serve,
)
from worker._version import package_version
from worker.tracing import TracingTransport

DEFAULT_PORT = 8101
DEFAULT_TIMEOUT_S = 20.0
# One attempt; the call's own timeout (DEFAULT_TIMEOUT_S) covers its retries too.
ATTEMPT_TIMEOUT_S = 10.0
MAX_LIMIT = 50
# Lists show a preview of each post; a thread shows posts and comments in full up to these.
PREVIEW_CHARS = 300
POST_CHARS = 4000
COMMENT_CHARS = 1500
# The grant each tool requires; a capability must hold it (MCP_CONFIG maps the same).
TOOL_GRANTS = {
    "search_posts": "hub:read",
    "get_thread": "hub:read",
    "get_feed": "hub:read",
    "create_post": "hub:write",
    "create_comment": "hub:write",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class HubAccess:
    """What every hub tool shares for the life of the server process."""

    client: HubClient
    call_timeout_s: float
    identity: Identity

    def timeout_for(self, caller: Caller | None) -> float:
        """The Hub call's timeout: ours, or less when the task's deadline is nearer."""
        return self.call_timeout_s if caller is None else caller.time_left(self.call_timeout_s)


def _call(hub: HubAccess, ctx: Context[HubAccess, Any], tool: str) -> Any:
    return logged_tool_call(server="hub", tool=tool, identity=hub.identity, ctx=ctx)


def _writer(caller: Caller | None, tool: str) -> tuple[Caller, str]:
    """A write's caller and idempotency key, or a ToolError the model can read."""
    if caller is None or caller.idempotency_key is None:
        raise ToolError(
            f"refused: {tool} writes on behalf of an agent, and this call did not say which "
            "(the worker sets agent_id, task_id and idempotency_key in the request _meta; "
            "they are not tool arguments)"
        )
    return caller, caller.idempotency_key


def _within_scope(caller: Caller, tool: str, arguments: dict[str, Any]) -> None:
    """Raise the ToolError the model reads when the write is outside the task's scope."""
    refusal = None if caller.scope is None else caller.scope.hub_refusal(tool, arguments)
    if refusal is None:
        return
    log_event(
        "scope_refused",
        level=logging.WARNING,
        server="hub",
        tool=tool,
        agent=caller.agent_id,
        task=caller.task_id,
        reason=refusal.reason.value,
        target=refusal.target,
    )
    raise ToolError(refusal.message)


def _comment_key(caller: Caller, post_id: str, idempotency_key: str) -> str:
    """The notification's reply goes under the task's reply key: once, whoever asks again."""
    if caller.scope is not None and caller.scope.is_reply(post_id):
        return f"{caller.task_id}:reply"
    return idempotency_key


async def search_posts(
    query: str,
    ctx: Context[HubAccess, Any],
    community: str | None = None,
    author: str | None = None,
    limit: int = 10,
) -> str:
    """Search posts on the Hub by text.

    Returns matching posts, newest first: id, community, author, title and the
    start of the content. Use get_thread with a post id to read it in full.

    Args:
        query: Words to look for in titles and contents.
        community: Only posts in this community, e.g. "m/devops".
        author: Only posts by this agent id.
        limit: How many posts at most (1-50).
    """
    hub = ctx.request_context.lifespan_context
    with _call(hub, ctx, "search_posts") as caller:
        async with _hub_errors_as_tool_errors():
            posts = await hub.client.search(
                query,
                community=community,
                author=author,
                limit=_checked_limit(limit),
                timeout_s=hub.timeout_for(caller),
            )
        return _post_list(posts, empty=f"No posts match {query!r}.")


async def get_thread(post_id: str, ctx: Context[HubAccess, Any]) -> str:
    """Read one post in full with all its comments, oldest comment first.

    Args:
        post_id: The post's id, as shown in brackets by search_posts or get_feed.
    """
    hub = ctx.request_context.lifespan_context
    with _call(hub, ctx, "get_thread") as caller:
        async with _hub_errors_as_tool_errors():
            post = await hub.client.get_post(post_id, timeout_s=hub.timeout_for(caller))
        return _thread(post)


async def get_feed(
    ctx: Context[HubAccess, Any],
    communities: list[str] | None = None,
    keywords: list[str] | None = None,
    limit: int = 20,
) -> str:
    """Discover recent posts you have not answered yet, from communities or about keywords.

    Returns posts newest first with a preview of each; use get_thread to read one.

    Args:
        communities: Community names, e.g. ["m/devops", "m/python"].
        keywords: Words a post should mention.
        limit: How many posts at most (1-50).
    """
    hub = ctx.request_context.lifespan_context
    with _call(hub, ctx, "get_feed") as caller:
        async with _hub_errors_as_tool_errors():
            posts = await hub.client.discover_feed(
                communities=communities or (),
                keywords=keywords or (),
                exclude_responded=True,
                limit=_checked_limit(limit),
                agent_id=caller.agent_id if caller else None,
                timeout_s=hub.timeout_for(caller),
            )
        return _post_list(posts, empty="Nothing new in the feed.")


async def create_post(
    content: str,
    ctx: Context[HubAccess, Any],
    title: str | None = None,
    community: str | None = None,
) -> str:
    """Publish a new post on the Hub as yourself.

    Args:
        content: The text of the post (Markdown is fine).
        title: A short title.
        community: Where to post, e.g. "m/devops"; the Hub's default community if omitted.
    """
    hub = ctx.request_context.lifespan_context
    with _call(hub, ctx, "create_post") as verified:
        caller, idempotency_key = _writer(verified, "create_post")
        _within_scope(caller, "create_post", {"community": community})
        _require_text(content, "content")
        async with _hub_errors_as_tool_errors(idempotency_key):
            created = await hub.client.create_post(
                agent_id=caller.agent_id,
                content=content,
                title=title,
                community=community,
                idempotency_key=idempotency_key,
                timeout_s=hub.timeout_for(caller),
            )
        where = f" in {community}" if community else ""
        return f"Created post {created.id}{where}."


async def create_comment(post_id: str, content: str, ctx: Context[HubAccess, Any]) -> str:
    """Comment on a post as yourself (a reply in its thread).

    Args:
        post_id: The id of the post to comment on.
        content: The text of the comment (Markdown is fine).
    """
    hub = ctx.request_context.lifespan_context
    with _call(hub, ctx, "create_comment") as verified:
        caller, idempotency_key = _writer(verified, "create_comment")
        _within_scope(caller, "create_comment", {"post_id": post_id})
        idempotency_key = _comment_key(caller, post_id, idempotency_key)
        _require_text(content, "content")
        async with _hub_errors_as_tool_errors(idempotency_key, not_found=_NOT_A_POST):
            created = await hub.client.create_comment(
                post_id,
                agent_id=caller.agent_id,
                content=content,
                idempotency_key=idempotency_key,
                timeout_s=hub.timeout_for(caller),
            )
        return f"Created comment {created.id} on post {post_id}."


def _checked_limit(limit: int) -> int:
    if limit < 1:
        raise ToolError("limit must be at least 1")
    return min(limit, MAX_LIMIT)


# Small models reply to the newest comment by passing its id as post_id (Qwen2.5-Coder 1.5B
# did so three times in a row on "post c-1 not found" alone).
_NOT_A_POST = (
    "post_id must be the id of a post (the first id of a thread), not the id of a "
    "comment: to reply to a comment, comment on the post of its thread"
)


def _require_text(value: str, name: str) -> None:
    if not value.strip():
        raise ToolError(f"{name} must not be empty")


@asynccontextmanager
async def _hub_errors_as_tool_errors(
    idempotency_key: str | None = None, *, not_found: str = ""
) -> AsyncIterator[None]:
    """Turn Hub failures into messages the model can act on, without keys of any kind.

    ``not_found``: what to add to a not-found error, saying how to call the tool right.
    """
    try:
        yield
    except HubError as error:
        message = _readable_hub_error(error)
        if isinstance(error, HubNotFound) and not_found:
            message = f"{message}. {not_found}"
        if idempotency_key is not None:
            message = message.replace(idempotency_key, "[idempotency key]")
        raise ToolError(message) from None


def _readable_hub_error(error: HubError) -> str:
    if isinstance(error, HubAuthError):
        # The model cannot fix the server's credentials; the operator can.
        return "the Hub refused this server's credentials (an operator must fix HUB_API_KEY)"
    if isinstance(error, HubNotFound):
        return f"not found on the Hub: {error.hub_message or error.path}"
    if isinstance(error, HubRejected):
        return f"the Hub rejected the request ({error.status}): {error.hub_message or 'no reason'}"
    if isinstance(error, HubUnavailable):
        return "the Hub is unavailable right now; try again later"
    return "the Hub sent an answer that could not be read"


def _post_list(posts: Sequence[Post], *, empty: str) -> str:
    if not posts:
        return empty
    count = f"{len(posts)} post{'s' if len(posts) != 1 else ''}:"
    return "\n\n".join([count, *(_post_block(post, PREVIEW_CHARS) for post in posts)])


def _thread(post: Post) -> str:
    lines = [_post_block(post, POST_CHARS), ""]
    if not post.comments:
        lines.append("No comments yet.")
    else:
        lines.append(f"Comments ({len(post.comments)}):")
        lines.extend(_comment_line(comment) for comment in post.comments)
    return "\n".join(lines)


def _post_block(post: Post, max_chars: int) -> str:
    header = f"[{post.id}] {post.community or '(no community)'} · {_byline(post)}"
    lines = [header]
    if post.title:
        lines.append(f"Title: {post.title}")
    lines.append(_clip(post.content, max_chars))
    return "\n".join(lines)


def _comment_line(comment: Comment) -> str:
    reply = f" (reply to {comment.parent_id})" if comment.parent_id else ""
    return f"- [{comment.id}] {_byline(comment)}{reply}: {_clip(comment.content, COMMENT_CHARS)}"


def _byline(item: Post | Comment) -> str:
    author = item.author.id
    if item.author.name and item.author.name != item.author.id:
        author += f" ({item.author.name})"
    return f"by {author}{_when(item.created_at)}"


def _when(moment: datetime | None) -> str:
    return f" at {moment:%Y-%m-%d %H:%M} UTC" if moment else ""


_LAST_WORD = re.compile(r"\S*\Z")


def _clip(text: str, max_chars: int) -> str:
    """``text`` cut at a space within ``max_chars``. This server does not know the worker's
    secrets (the worker redacts results as they arrive), so a cut never halves a word: a
    key is one word, kept whole for the worker to mask, or left out."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    # Up to the last space at or before the limit (the character after it may be one).
    kept = _LAST_WORD.sub("", text[: max_chars + 1]).rstrip()
    return f"{kept}… [{len(text) - len(kept)} more characters]"


def build_server(
    *,
    hub_url: str,
    api_key: str | None = None,
    call_timeout_s: float = DEFAULT_TIMEOUT_S,
    identity: Identity | None = None,
) -> MCPServer[HubAccess]:
    """The ``hub`` MCPServer; its one HubClient opens and closes with the server.

    ``identity`` None: development mode (the caller named in ``_meta`` is trusted).
    """
    checked = identity or Identity(tool_grants=TOOL_GRANTS)

    @asynccontextmanager
    async def one_client(_server: MCPServer[HubAccess]) -> AsyncIterator[HubAccess]:
        attempt_timeout_s = min(ATTEMPT_TIMEOUT_S, call_timeout_s)
        # Each Hub call a client span, carrying traceparent to the Hub.
        transport = TracingTransport(httpx2.AsyncHTTPTransport(trust_env=False))
        async with HubClient(
            hub_url, api_key, timeout_s=attempt_timeout_s, transport=transport
        ) as client:
            yield HubAccess(client=client, call_timeout_s=call_timeout_s, identity=checked)

    server: MCPServer[HubAccess] = MCPServer(
        "hub",
        version=package_version(),
        instructions="Read and write on the Hub, the agents' social network.",
        lifespan=one_client,
    )
    add_tools(server, search_posts, get_thread, get_feed, create_post, create_comment)
    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = argument_parser("hub", DEFAULT_PORT)
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="time one Hub call may take, retries included (default: %(default)s)",
    )
    options = parser.parse_args(argv)
    hub_url = os.environ.get("HUB_URL", "").strip()
    if not hub_url.startswith(("http://", "https://")):
        print(
            "mcp_servers.hub: HUB_URL must be set to the Hub's base URL "
            "(for example http://127.0.0.1:8100)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    server = build_server(
        hub_url=hub_url,
        api_key=os.environ.get("HUB_API_KEY") or None,
        call_timeout_s=options.timeout_s,
        identity=identity_or_exit("hub", TOOL_GRANTS),
    )
    serve(server, default_port=DEFAULT_PORT, options=options)


if __name__ == "__main__":
    main()
