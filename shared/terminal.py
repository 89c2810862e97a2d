"""What a job carries, made harmless for a person's terminal: ``status``, ``list``,
``logs`` on a terminal and the console log format all show a job's bytes through
``harmless``. A job's output, error or argv may hold escape sequences that move the cursor,
clear the screen, retitle the window or write the clipboard (OSC 52); shown as ``\\xNN``,
they are read, never obeyed."""

from __future__ import annotations

_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))
             if c not in (0x09, 0x0A)}


def harmless(text: str) -> str:
    """A job's text made safe for a person's terminal: control characters (escape
    sequences that could move the cursor, retitle the window or write the clipboard) shown
    as ``\\xNN``; tabs and newlines kept."""
    return text.translate(_CONTROLS)
