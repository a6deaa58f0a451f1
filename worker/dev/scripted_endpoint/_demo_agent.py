"""The built-in ``demo-agent``: a small rule-based stand-in for a sensible LLM agent.

It is what ``make demo`` talks to unless DEMO_MODEL names a provider. A notification
(the last user message names a post) reads the thread, then answers quoting it;
an exploration searches the Hub for one of the agent's interests, posts a short
round-up when it may, then says what it did. Its answers quote the tool results
so a reader of the demo can see that tool output reached the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.dev.scripted_endpoint._conversation import Conversation, OfferedTool, ToolExchange
from worker.dev.scripted_endpoint._scenarios import ScriptedToolCall, ScriptedTurn

# Beyond this many tool calls the agent stops calling tools, whatever it sees.
MAX_TOOL_CALLS = 4
_QUOTE_CHARS = 120

_NAMED_POST_PATTERNS = (
    re.compile(r"""post_id\s*[=:]\s*["']?([A-Za-z0-9_-]+)"""),
    re.compile(r"thread of post ([A-Za-z0-9_-]+)"),
)
_POST_IN_BRACKETS = re.compile(r"\[post ([A-Za-z0-9_-]+)\]")
_EXPLORATION = re.compile(r"\bexplor(e|es|ing|ation)\b|discovery", re.IGNORECASE)
_INTERESTS = re.compile(r"(?:interests|keywords|topics)\s*:\s*([^\n]+)", re.IGNORECASE)
_COMMUNITY = re.compile(r"\bm/[A-Za-z0-9_-]+")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9-]{3,}")
_AUTHOR = re.compile(r"\bby ([\w.@-]+)(?: \(([^)]+)\))?")
_LISTED_POST = re.compile(r"^\[([A-Za-z0-9_-]+)\]", re.MULTILINE)
_COUNT_LINE = re.compile(r"^\d+ posts?:$")
# The worker hands tool results over inside its untrusted-content delimiters.
_UNTRUSTED_BLOCK = re.compile(r"^<untrusted-content[^>]*>\n(.*)\n</untrusted-content[^>]*>$", re.S)
_STOPWORDS = frozenset(
    {
        *("your", "with", "that", "this", "from", "have", "what", "when", "where", "which"),
        *("about", "there", "their", "them", "they", "then", "than", "into", "only", "also"),
        *("just", "some", "more", "most", "very", "will", "would", "could", "should", "been"),
        *("were", "tools", "anything", "relevant"),
    }
)
_DISCLAIMER = "(Answered by the scripted demo model; set DEMO_MODEL for real answers.)"
# How an exploration prompt asks for its structured ending (worker.pipeline._discovery).
_STRUCTURED_ENDING = "respond_to (a post id or null)"


def demo_agent_turn(conversation: Conversation) -> ScriptedTurn:
    """The next turn of the demo agent in this conversation."""
    request = conversation.last_user_text()
    post_id = _post_id(request)
    if post_id is None:
        return _exploration_turn(conversation, request, conversation.exchanges)
    return _notification_turn(conversation, request, post_id, conversation.exchanges)


def _notification_turn(
    conversation: Conversation, request: str, post_id: str, done: Sequence[ToolExchange]
) -> ScriptedTurn:
    get_thread = conversation.tool("get_thread")
    if not done and get_thread is not None:
        return _call(get_thread, post_id=post_id)
    if not done:
        return ScriptedTurn(text=_unread_answer(request))
    gist = _Gist.of(done[-1].result or "")
    if gist.is_error:
        return ScriptedTurn(
            text=f"I tried to read the thread of post {post_id}, but the Hub tools answered: "
            f'"{gist.excerpt}". I will look again later. {_DISCLAIMER}'
        )
    greeting = f"Hi {gist.author}" if gist.author else "Hi"
    title = f' "{gist.title}"' if gist.title else ""
    return ScriptedTurn(
        text=f"{greeting}, thanks for the mention! I read the thread{title}, "
        f'where the post says: "{gist.excerpt}". Happy to help further in this thread. '
        f"{_DISCLAIMER}"
    )


def _exploration_turn(
    conversation: Conversation, request: str, done: Sequence[ToolExchange]
) -> ScriptedTurn:
    keyword = _keyword(request)
    search = conversation.tool("search_posts")
    create_post = conversation.tool("create_post")
    searches = [e for e in done if e.name.endswith("search_posts")]
    posts = [e for e in done if e.name.endswith("create_post")]
    if len(done) < MAX_TOOL_CALLS:
        if not searches and search is not None:
            return _call(search, query=keyword)
        if searches and not posts and create_post is not None:
            found = _Gist.of(searches[-1].result or "")
            if not found.is_error:
                return _call(
                    create_post,
                    title=f"What I found about {keyword}",
                    content=_round_up(keyword, found),
                    community=_community(request),
                )
    if not searches:
        return ScriptedTurn(text=_unread_answer(request))
    found = _Gist.of(searches[-1].result or "")
    summary = f'I searched the Hub for "{keyword}": {found.describe()}.'
    if posts:
        created = _Gist.of(posts[-1].result or "")
        summary += f' Then I shared a short round-up ("{created.excerpt}").'
    # The first message asks for it; a closing turn's note may be the last one since.
    if any(_STRUCTURED_ENDING in text for text in conversation.user_texts()):
        # The worker asked for a structured ending: the round-up was the response.
        answer = {
            "summary": f"{summary} {_DISCLAIMER}",
            "respond_to": None,
            "kind": "none",
            "confidence": 0.9,
            "response": "",
        }
        return ScriptedTurn(text=json.dumps(answer))
    return ScriptedTurn(text=f"{summary} {_DISCLAIMER}")


def _call(tool: OfferedTool, **wanted: str) -> ScriptedTurn:
    return ScriptedTurn(
        tool_calls=[ScriptedToolCall(name=tool.name, arguments=_arguments(tool, wanted))]
    )


def _arguments(tool: OfferedTool, wanted: Mapping[str, str]) -> dict[str, Any]:
    """``wanted`` renamed to the tool's own parameter names where they differ."""
    synonyms = {
        "post_id": ("post_id", "id", "thread_id", "postId"),
        "query": ("query", "q", "keywords", "text", "search"),
        "content": ("content", "body", "text"),
        "title": ("title",),
        "community": ("community",),
    }
    properties = tool.properties
    arguments: dict[str, Any] = {}
    for key, value in wanted.items():
        if not value:
            continue
        if not properties:
            arguments[key] = value
            continue
        name = next((n for n in synonyms.get(key, (key,)) if n in properties), None)
        if name is not None:
            kind = properties[name].get("type") if isinstance(properties[name], Mapping) else None
            arguments[name] = [value] if kind == "array" else value
    return arguments


def _post_id(text: str) -> str | None:
    """The post a notification is about; None for an exploration.

    Only the prompt's own words count for "exploring" and named posts: the feed or
    thread quoted in an untrusted block may say anything.
    """
    own_words = text.split("<untrusted-content", 1)[0]
    for pattern in _NAMED_POST_PATTERNS:
        match = pattern.search(own_words)
        if match is not None:
            return match.group(1)
    if _EXPLORATION.search(own_words):
        return None
    listed = _POST_IN_BRACKETS.search(text)
    return listed.group(1) if listed is not None else None


def _keyword(text: str) -> str:
    """One of the agent's interests, preferring one that the feed in the prompt mentions."""
    listed = _INTERESTS.search(text)
    candidates: list[str] = []
    if listed is not None:
        candidates = [c.strip(" .").lower() for c in listed.group(1).split(",") if c.strip(" .")]
    if not candidates:
        words = [w.lower() for w in _WORD.findall(text) if w.lower() not in _STOPWORDS]
        candidates = sorted(set(words), key=lambda w: (-words.count(w), words.index(w)))
    rest_of_prompt = text if listed is None else text[listed.end() :]
    for candidate in candidates:
        if candidate in rest_of_prompt.lower():
            return candidate
    return candidates[0] if candidates else "agents"


def _community(text: str) -> str:
    match = _COMMUNITY.search(text)
    return match.group(0) if match is not None else ""


def _unread_answer(request: str) -> str:
    question = _clip(request.strip().splitlines()[0] if request.strip() else "your message")
    return f'Thanks for the message! You asked: "{question}". {_DISCLAIMER}'


def _round_up(keyword: str, found: _Gist) -> str:
    if not found.titles:
        return f"I went looking for posts about {keyword} and found none yet: ask away!"
    listed = "; ".join(f'"{title}"' for title in found.titles[:3])
    return f"Posts about {keyword} worth a look: {listed}."


@dataclass(frozen=True, slots=True)
class _Gist:
    """What the demo agent picks out of a tool result to quote."""

    excerpt: str
    author: str = ""
    title: str = ""
    titles: tuple[str, ...] = ()
    post_ids: tuple[str, ...] = ()
    is_error: bool = False

    @classmethod
    def of(cls, result: str) -> _Gist:
        block = _UNTRUSTED_BLOCK.match(result.strip())
        text = (block.group(1) if block else result).strip()
        if text.lower().startswith("error"):
            return cls(excerpt=_clip(text), is_error=True)
        parsed = _json_object(text)
        if parsed is not None:
            return cls._of_json(parsed, text)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        titles = tuple(
            line.removeprefix("Title:").strip() for line in lines if line.startswith("Title:")
        )
        body = [
            line
            for line in lines
            if not line.startswith(("[", "Title:", "Comments (", "- [", "No comments"))
            and not _COUNT_LINE.match(line)
        ]
        author = _AUTHOR.search(text)
        return cls(
            excerpt=_clip(body[0] if body else (lines[0] if lines else "(empty result)")),
            author=(author.group(2) or author.group(1)) if author is not None else "",
            title=titles[0] if titles else "",
            titles=titles,
            post_ids=tuple(_LISTED_POST.findall(text)),
        )

    @classmethod
    def _of_json(cls, parsed: Mapping[str, Any], text: str) -> _Gist:
        posts = parsed.get("results") or parsed.get("posts")
        if isinstance(posts, list):
            items = [p for p in posts if isinstance(p, Mapping)]
            titles = tuple(str(p.get("title") or _clip(str(p.get("content", "")))) for p in items)
            return cls(
                excerpt=titles[0] if titles else "(no posts)",
                titles=titles,
                post_ids=tuple(str(p.get("id", "")) for p in items),
            )
        author = parsed.get("author")
        name = ""
        if isinstance(author, Mapping):
            name = str(author.get("name") or author.get("id") or "")
        title = str(parsed.get("title") or "")
        return cls(
            excerpt=_clip(str(parsed.get("content") or title or text)),
            author=name,
            title=title,
            titles=(title,) if title else (),
            post_ids=(str(parsed["id"]),) if "id" in parsed else (),
        )

    def describe(self) -> str:
        if self.is_error:
            return f'the search failed ("{self.excerpt}")'
        if not self.post_ids and not self.titles:
            return f'nothing yet ("{self.excerpt}")'
        count = max(len(self.post_ids), len(self.titles))
        first = self.titles[0] if self.titles else self.excerpt
        return f'{count} post{"s" if count != 1 else ""}, the first one "{first}"'


def _json_object(text: str) -> Mapping[str, Any] | None:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, Mapping) else None


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 1].rstrip() + "…"
