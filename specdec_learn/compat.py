"""What differs between the transformers releases this library supports (docs/COMPAT.md), in one place.

Each shim names the release that changed a thing and reads the installed
version once; the teaching code calls these instead of branching itself.
"""

from __future__ import annotations

import transformers
from transformers import DynamicCache

# transformers 5.25 renamed the cache argument of every forward (`past_key_values`, and the linear-attention
# mixers' `cache_params`) to `cache`; the old names warn until 5.40 removes them, and 5.19 knows only those.
CACHE_RENAMED = tuple(int(part) for part in transformers.__version__.split(".")[:2]) >= (5, 25)


def cache_arg(cache: DynamicCache, old: str = "past_key_values") -> dict:
    """{keyword: cache} for a forward call, in the name the installed transformers reads."""
    return {"cache" if CACHE_RENAMED else old: cache}


def cached_length(cache: DynamicCache) -> int:
    """How many positions `cache` holds, as a plain int.

    Up to transformers 5.24 the cache reads this from its first attention
    layer. Since 5.25 it asks layer 0 whatever its kind, and a linear-attention
    layer answers with its own token count: a 0-d tensor that later forwards
    update in place, so a length kept without int() would change under you.
    """
    return int(cache.get_seq_length())
