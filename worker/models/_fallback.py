"""FallbackModel: the primary model, then the next, while providers are down."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from worker.exceptions import ModelAuthError, ModelError, ModelUnavailable
from worker.models._types import Model, ModelRequest, ModelResponse


class FallbackModel:
    """Tries each model in order; use when an agent names fallback models.

    - ``ModelUnavailable`` (after that model's own retries): next model.
    - ``ModelAuthError``: next model too, since a fallback on another provider
      has its own key; the failure is named if every model fails.
    - ``ModelRequestError`` and other errors: raised at once, the request is wrong.

    Each model gets what is left of the request's time budget. When every model
    fails and one of them was unavailable, the task should be requeued: a
    ``ModelUnavailable`` naming every failure is raised (provider, model and
    ``retry_after_s`` of the last unavailable one); otherwise the last auth error.
    """

    def __init__(self, models: Sequence[Model], *, clock: Callable[[], float] = time.monotonic):
        if not models:
            raise ValueError("FallbackModel needs at least one model")
        self._models = tuple(models)
        self._clock = clock
        self._last_answered: Model = self._models[0]

    @property
    def provider(self) -> str:
        return self._last_answered.provider

    @property
    def name(self) -> str:
        return self._last_answered.name

    @property
    def models(self) -> tuple[Model, ...]:
        return self._models

    async def complete(self, request: ModelRequest) -> ModelResponse:
        started = self._clock()
        failures: list[tuple[Model, ModelError]] = []
        for model in self._models:
            remaining = _remaining(request.timeout_s, self._clock() - started)
            if remaining is not None and remaining <= 0:
                break
            try:
                response = await model.complete(dataclasses.replace(request, timeout_s=remaining))
            except (ModelUnavailable, ModelAuthError) as exc:
                failures.append((model, exc))
                continue
            self._last_answered = model
            return response
        raise _all_failed(failures, self._models)


def _remaining(timeout_s: float | None, elapsed: float) -> float | None:
    return None if timeout_s is None else timeout_s - elapsed


def _all_failed(failures: list[tuple[Model, ModelError]], models: tuple[Model, ...]) -> ModelError:
    if not failures:
        primary = models[0]
        return ModelUnavailable(
            f"no time left to try {primary.provider} model {primary.name!r}",
            provider=primary.provider,
            model=primary.name,
        )
    if len(failures) == 1:
        return failures[0][1]
    unavailable = [exc for _, exc in failures if isinstance(exc, ModelUnavailable)]
    summary = "; ".join(exc.message for _, exc in failures)
    combined: ModelError
    if unavailable:
        combined = ModelUnavailable(
            f"every model failed: {summary}",
            provider=unavailable[-1].provider,
            model=unavailable[-1].model,
            retry_after_s=unavailable[-1].retry_after_s,
        )
    else:
        last = failures[-1][1]
        combined = ModelAuthError(
            f"every model failed: {summary}", provider=last.provider, model=last.model
        )
    combined.__cause__ = failures[-1][1]
    return combined
