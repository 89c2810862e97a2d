"""The values the fuzzing tests draw from (hypothesis strategies)."""

from __future__ import annotations

from hypothesis import strategies as st

ANY_TEXT = st.text(st.characters(codec=None, categories=None), max_size=60)
"""Every code point, surrogates and NUL included: what an environment variable, a file
decoded with surrogateescape, or a JSON "\\u0000" can put into a Python str."""

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=30)
"""What JSON could carry and more: non-finite numbers, any text, nested."""
