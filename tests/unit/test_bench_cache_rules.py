"""The prompt-cache benchmark's simulated providers follow the published caching rules.

A wrong simulator makes the benchmark's figure meaningless, so each rule it applies is
checked here on hand-sized requests whose expected usage can be worked out on paper.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench._cache_rules import (
    ANTHROPIC_LOOKBACK_BLOCKS,
    AnthropicCache,
    CacheRuleError,
    OpenAICache,
    anthropic_blocks,
    cached_tokens,
    tokens_of,
)

MARK = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


def text(chars: int, fill: str = "a") -> str:
    return fill * chars


def block(content: str, mark: dict[str, str] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"type": "text", "text": content}
    if mark is not None:
        found["cache_control"] = mark
    return found


def body(system: list[dict[str, Any]], *turns: list[dict[str, Any]]) -> dict[str, Any]:
    roles = ("user", "assistant")
    messages = [{"role": roles[n % 2], "content": content} for n, content in enumerate(turns)]
    return {"model": "claude-sonnet-4-5", "system": system, "messages": messages}


def size(*blocks: dict[str, Any]) -> int:
    """Tokens of these blocks as the simulator counts them."""
    return sum(tokens_of(b.text) for b in anthropic_blocks(body(list(blocks))))


def test_nothing_is_cached_without_a_mark() -> None:
    cache = AnthropicCache(minimum_tokens=100)
    request = body([block(text(8000))], [block("hi")])

    first, second = cache.request(request, 0.0), cache.request(request, 1.0)

    assert first.cache_read == first.cache_write == 0
    assert second.cache_read == second.cache_write == 0
    assert second.input_tokens == first.input_tokens > 2000


def test_a_marked_prefix_is_written_once_then_read_and_the_rest_is_input() -> None:
    cache = AnthropicCache(minimum_tokens=100)
    stable = block(text(8000), MARK)
    request = body([stable], [block("question one")])

    first = cache.request(request, 0.0)
    second = cache.request(body([stable], [block("question two, longer")]), 10.0)

    prefix = size(stable)
    assert (first.cache_read, first.cache_write_5m) == (0, prefix)
    assert (second.cache_read, second.cache_write) == (prefix, 0)
    assert second.input_tokens == second.total - prefix > 0


def test_a_prefix_below_the_models_minimum_is_not_cached() -> None:
    cache = AnthropicCache(minimum_tokens=1024)
    short = body([block(text(2000), MARK)], [block("q")])  # 500 tokens

    cache.request(short, 0.0)
    again = cache.request(short, 1.0)

    assert again.cache_read == again.cache_write == 0


def test_the_order_is_tools_system_messages_so_a_changed_tool_misses_the_system_entry() -> None:
    cache = AnthropicCache(minimum_tokens=100)
    tool = {"name": "search", "description": "find", "input_schema": {"type": "object"}}
    request = body([block(text(8000), MARK)], [block("q")]) | {"tools": [tool]}
    cache.request(request, 0.0)

    changed = request | {"tools": [tool | {"description": "find posts"}]}

    assert cache.request(changed, 1.0).cache_read == 0
    assert cache.request(request, 2.0).cache_read > 0


def test_an_entry_expires_after_its_ttl_from_its_last_use() -> None:
    cache = AnthropicCache(minimum_tokens=100)
    request = body([block(text(8000), MARK)], [block("q")])
    cache.request(request, 0.0)

    assert cache.request(request, 290.0).cache_read > 0  # a read refreshes it
    assert cache.request(request, 580.0).cache_read > 0
    expired = cache.request(request, 881.0)
    assert expired.cache_read == 0 and expired.cache_write_5m > 0


def test_a_one_hour_entry_outlives_five_minutes_and_bills_as_a_one_hour_write() -> None:
    cache = AnthropicCache(minimum_tokens=100)
    request = body([block(text(8000), HOUR)], [block("q")])

    written = cache.request(request, 0.0)
    later = cache.request(request, 3000.0)

    assert (written.cache_write_5m, written.cache_write_1h) == (0, size(block(text(8000))))
    assert later.cache_read == written.cache_write_1h


def test_a_one_hour_mark_after_a_five_minute_one_is_refused() -> None:
    cache = AnthropicCache(minimum_tokens=100)
    with pytest.raises(CacheRuleError):
        cache.request(body([block("a", MARK), block("b", HOUR)], [block("q")]), 0.0)


def test_more_than_four_marks_are_refused() -> None:
    cache = AnthropicCache(minimum_tokens=100)
    marked = [block(f"part {n}", MARK) for n in range(5)]
    with pytest.raises(CacheRuleError):
        cache.request(body(marked, [block("q")]), 0.0)


def test_a_moving_mark_reads_the_previous_end_within_the_lookback_and_writes_the_new_part() -> None:
    cache = AnthropicCache(minimum_tokens=100)
    system = [block(text(8000), MARK)]
    step_one = [block("first question " * 20, MARK)]
    cache.request(body(system, step_one), 0.0)

    # The next step: the old last turn unmarked, an answer and a new user turn marked.
    step_two = body(
        system, [block("first question " * 20)], [block("an answer")], [block("more", MARK)]
    )
    usage = cache.request(step_two, 6.0)

    read = size(system[0]) + size(block("first question " * 20))
    assert usage.cache_read == read
    assert usage.cache_write_5m == usage.total - read  # the new turns, up to the mark


def test_a_hit_further_back_than_the_lookback_is_missed() -> None:
    cache = AnthropicCache(minimum_tokens=100)
    system = [block(text(8000), MARK)]
    cache.request(body(system, [block("q")]), 0.0)
    cache.request(body([block(text(8000))], [block("q")]), 1.0)  # nothing marked: no entry

    # The only mark sits more than 20 blocks after the cached system prefix.
    turns = [[block(f"turn {n}")] for n in range(ANTHROPIC_LOOKBACK_BLOCKS + 2)]
    turns[-1] = [block("last", MARK)]
    far = cache.request(body([block(text(8000))], *turns), 2.0)
    turns_near = turns[-ANTHROPIC_LOOKBACK_BLOCKS + 1 :]
    near = cache.request(body([block(text(8000))], *turns_near), 3.0)

    assert far.cache_read == 0
    assert near.cache_read == size(system[0])


def test_openai_caches_nothing_under_1024_tokens_then_1024_plus_128_token_steps() -> None:
    assert cached_tokens(1023, 1023) == 0
    assert cached_tokens(5000, 1000) == 0
    assert cached_tokens(5000, 1024) == 1024
    assert cached_tokens(5000, 1151) == 1024
    assert cached_tokens(5000, 1152) == 1152
    assert cached_tokens(1500, 9000) == 1408


def chat(system: str, user: str, key: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    if key is not None:
        request["prompt_cache_key"] = key
    return request


def test_openai_serves_a_seen_prefix_and_forgets_it_after_five_idle_minutes() -> None:
    cache = OpenAICache()
    system = text(8000)

    first = cache.request(chat(system, "one"), 0.0)
    second = cache.request(chat(system, "two"), 10.0)
    late = cache.request(chat(system, "three"), 10.0 + 301.0)

    assert first[1] == 0
    assert 1024 <= second[1] <= second[0] and (second[1] - 1024) % 128 == 0
    assert second[0] - second[1] < 128 + 10  # all but the last partial step and the question
    assert late[1] == 0


def test_openai_routes_by_key_so_a_busy_shared_prefix_spills_without_one() -> None:
    """Forty agents sharing their first 256 tokens (the tools), each a request a minute:
    without a key they are one route, spill past 15 a minute and miss; keyed, each agent
    is a route of its own on its machine."""

    def run(keyed: bool) -> float:
        cache = OpenAICache()
        tools = text(2000, "t")
        served = total = 0
        for minute in range(6):
            for agent in range(40):
                request = chat(tools + text(6000, chr(65 + agent % 26)) + str(agent), "q")
                if keyed:
                    request["prompt_cache_key"] = f"agent-{agent}"
                prompt, cached = cache.request(request, minute * 60.0 + agent)
                if minute:
                    served += cached
                    total += prompt
        return served / total

    assert run(keyed=True) > 0.95
    assert run(keyed=False) < 0.5
