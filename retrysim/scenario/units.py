"""Value syntax of scenario files: durations, RocketMQ delay-level strings, rates, ranges.

Durations are integer milliseconds everywhere after parsing. A stored scenario (the runs
table's ``config_json``) holds them as milliseconds already, so the parsers accept those too.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo

from retrysim.scenario import limits

_DURATION_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
# RocketMQ's own messageDelayLevel units (ScheduleMessageService.parseDelayLevel): s m h d.
_DELAY_TOKEN_RE = re.compile(r"^(\d+)([smhd])$")


STORED = "stored"


def is_stored(info: ValidationInfo | None) -> bool:
    """Validating a stored scenario (scenario_from_json), not an author's file?"""
    return bool(info is not None and info.context and info.context.get(STORED))


def _written_ms(value: Any) -> float | None:
    """The milliseconds a duration written with its unit (``1500ms``, ``0.4ms``, ``2h``)
    stands for, or None for anything else."""
    match = _DURATION_RE.match(value) if isinstance(value, str) else None
    return float(match.group(1)) * _DURATION_UNITS_MS[match.group(2)] if match else None


def parse_duration(value: Any, info: ValidationInfo | None = None) -> int:
    """``1500ms``, ``10s``, ``5m``, ``2h``, ``1d`` (or ``0``) to integer milliseconds; a stored
    scenario holds them as milliseconds already."""
    if is_stored(info) and isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 10s, got {value!r}")
    if isinstance(value, int) and value == 0:
        return 0
    written = _written_ms(value)
    if written is not None:
        return round(written)
    raise ValueError(
        f"malformed duration {value!r}: use a number with a unit ms, s, m, h or d "
        "(e.g. 1500ms, 10s, 5m, 2h, 1d)"
    )


def parse_fine_duration(value: Any, info: ValidationInfo | None = None) -> float:
    """A duration finer than a millisecond (``0.4ms``, ``1.5ms``, ``0``) as float
    milliseconds; a stored scenario holds the milliseconds."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and (value == 0 or is_stored(info)):
        return float(value)
    written = _written_ms(value)
    if written is not None:  # to the nanosecond, so that 2.4ms is 2 and 0.4 as written
        return round(written, 6)
    raise ValueError(
        f"malformed duration {value!r}: use a number with a unit such as ms (e.g. 0.4ms, 2ms)"
    )


def parse_delay_levels(text: Any, info: ValidationInfo | None = None) -> tuple[int, ...]:
    """RocketMQ's ``messageDelayLevel`` string ("1s 5s 10s ...") to per-level milliseconds
    (a stored scenario holds the milliseconds)."""
    if is_stored(info) and isinstance(text, (list, tuple)):
        return tuple(int(ms) for ms in text)
    if not isinstance(text, str) or not text.split():
        raise ValueError('expected space-separated delays such as "1s 5s 10s 30s 1m"')
    levels = []
    for position, token in enumerate(text.split(), start=1):
        match = _DELAY_TOKEN_RE.match(token)
        if not match:
            raise ValueError(
                f"level {position} token {token!r} is not a whole number followed by one of "
                "s, m, h, d (RocketMQ's messageDelayLevel format, e.g. 10s or 2h)"
            )
        levels.append(int(match.group(1)) * _DURATION_UNITS_MS[match.group(2)])
    if len(levels) > limits.MAX_DELAY_LEVELS:
        raise ValueError(f"{len(levels)} levels; at most {limits.MAX_DELAY_LEVELS} are allowed")
    return tuple(levels)


def format_duration(ms: int) -> str:
    """The shortest exact spelling of a millisecond count: 90000 -> 90s, 7200000 -> 2h."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _DURATION_UNITS_MS[unit] == 0:
            return f"{ms // _DURATION_UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


def human_ms(value: float) -> str:
    """46ms, 12.3s, 15m41s, 4h45m41s."""
    if value < 1_000:
        return f"{value:.0f}ms"
    if value < 60_000:
        return f"{value / 1000:.1f}s"
    seconds = round(value / 1000)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def in_range(low: float | None, high: float | None, duration: bool = False):
    def show(bound: float) -> str:
        if duration:
            return format_duration(int(bound))
        return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"

    def check(value: float) -> float:
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = (
                f"between {show(low)} and {show(high)}"
                if low is not None and high is not None
                else (f">= {show(low)}" if low is not None else f"<= {show(high)}")
            )
            raise ValueError(f"must be {bounds}")
        return value

    return AfterValidator(check)


def _duration_field(value: Any, info: ValidationInfo) -> int:
    return parse_duration(value, info)


def _fine_duration_field(value: Any, info: ValidationInfo) -> float:
    return parse_fine_duration(value, info)


def _delay_levels_field(value: Any, info: ValidationInfo) -> tuple[int, ...]:
    return parse_delay_levels(value, info)


Duration = Annotated[int, BeforeValidator(_duration_field)]
NonNegativeDuration = Annotated[Duration, in_range(0, None, duration=True)]
FineDuration = Annotated[float, BeforeValidator(_fine_duration_field)]
PositiveDuration = Annotated[Duration, in_range(1, None, duration=True)]
Probability = Annotated[float, in_range(0.0, 1.0)]
StrictInt = Annotated[int, Field(strict=True)]
DelayLevels = Annotated[tuple[int, ...], BeforeValidator(_delay_levels_field)]

_RATE_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|m|h)\s*$")
MAX_REPLAY_RATE_PER_S = 1_000_000.0


def parse_rate(value: Any) -> float:
    """``100/s``, ``6000/m``, ``1/h`` or a bare number (per second) to messages per second."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rate = float(value)
    elif isinstance(value, str) and _RATE_RE.match(value):
        match = _RATE_RE.match(value)
        rate = float(match.group(1)) / _RATE_UNITS_S[match.group(2)]
    else:
        raise ValueError(f"malformed rate {value!r}: use e.g. 100/s, 6000/m or 1/h")
    if not 0 < rate <= MAX_REPLAY_RATE_PER_S:
        raise ValueError(f"rate must be above 0 and at most {MAX_REPLAY_RATE_PER_S:,.0f}/s")
    return rate
