"""The one estimate of tokens from characters, used wherever a count must come before
the provider's: the loop's budget, the fleet limiter's charge and memory's embeddings.

3.5 characters a token, not the common 4: English prose tokenises at about 4, code,
JSON and non-Latin scripts denser. Every user of the estimate wants the safe side: the
loop must not let a call carry a run past ``max_tokens``, memory checks an embeddings
call against what is left of it, and the limiter's overcharge is refunded as soon as the
call reports its usage (``FleetLimiter.settle``), so erring high costs nothing lasting.
"""

from __future__ import annotations

import math

CHARS_PER_TOKEN = 3.5


def tokens_of(chars: int) -> int:
    """The tokens ``chars`` characters make, by the estimate, rounded up."""
    return math.ceil(chars / CHARS_PER_TOKEN)
