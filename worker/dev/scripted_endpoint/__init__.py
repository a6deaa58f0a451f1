"""A scripted LLM provider endpoint: OpenAI Chat Completions and Anthropic Messages over real HTTP.

Use it wherever a real provider would be called but the answers must be known in
advance: integration tests (a real worker process and the official SDKs talk to
it), chaos tests (429 storms), benchmarks (fixed latency per call) and the demo
(the ``demo`` scenario acts like a sensible agent when no provider key is set).

A scenario is a queue of turns; a request picks its scenario by the first
``[[scenario:NAME]]`` marker in its system prompt or messages, else by its model
name when a scenario of that name exists (``demo`` always does), else ``default``.
An empty queue answers the default turn instead of failing. ``POST /v1/embeddings``
answers deterministic vectors (``_embeddings``: texts sharing words are close), so agent
memory's ``embedding_search`` runs without a model.

In process::

    with ScriptedEndpoint() as endpoint:
        endpoint.set_scenario("default", [{"text": "hello"}])
        client = AsyncOpenAI(base_url=endpoint.openai_base_url, api_key="x")

As a process: ``python -m worker.dev.scripted_endpoint --port 8090``; it is then
scripted through ``/_scripted/scenarios``, ``/_scripted/config``,
``/_scripted/requests``, ``/_scripted/stats`` and ``/_scripted/reset``.
"""

from worker.dev.scripted_endpoint._runner import ScriptedEndpoint as ScriptedEndpoint
