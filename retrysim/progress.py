"""The progress callback every layer takes: a run's stages report one line at a time through
it, and the caller decides what becomes of the lines (the command line prints them, a
notebook or a test may keep or drop them)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None]
