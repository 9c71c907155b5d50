"""Charts as inline SVG, drawn on the server: no script, no library, nothing fetched.

Pure functions of the data (points in time and value), so a page is complete as served and a
test can read the numbers back from the markup (each point carries a ``<title>``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape

#: Colours per series name; others cycle through PALETTE.
COLOURS = {
    "DISPATCHED": "#4e79a7",
    "STARTED": "#76b7b2",
    "SUCCEEDED": "#59a14f",
    "FAILED": "#f28e2b",
    "RETRYING": "#edc948",
    "DEAD": "#e15759",
    "MISSED": "#b07aa1",
    "SKIPPED": "#9c755f",
    "STALE": "#bab0ac",
    "CANCELLED": "#7f7f7f",
    "p50": "#59a14f",
    "p95": "#edc948",
    "p99": "#f28e2b",
    "max": "#e15759",
}
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1")

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 12, 40


def colour(name: str, index: int) -> str:
    return COLOURS.get(name, PALETTE[index % len(PALETTE)])


def _nice_max(value: float) -> float:
    """The top of the y axis: 1, 2 or 5 times a power of ten, at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M")


def _number(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:g}"


def line_chart(
    series: Mapping[str, Sequence[tuple[int, float]]],
    *,
    start_ms: int,
    end_ms: int,
    title: str,
    unit: str = "",
    empty: str = "no data in this time range",
) -> str:
    """Lines (one per series) over time; points are ``(epoch ms, value)``."""
    names = [n for n in series if series[n]]
    top = _nice_max(max((v for n in names for _, v in series[n]), default=0.0))
    span = max(1, end_ms - start_ms)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: int) -> float:
        return LEFT + plot_w * (min(max(t, start_ms), end_ms) - start_ms) / span

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [_frame(title, top, unit, start_ms, end_ms, x)]
    if not names:
        parts.append(
            f'<text class="empty" x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2:.0f}" '
            f'text-anchor="middle">{escape(empty)}</text>'
        )
    for index, name in enumerate(names):
        points = sorted(series[name])
        stroke = colour(name, index)
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        parts.append(
            f'<polyline fill="none" stroke="{stroke}" stroke-width="2" points="{path}" '
            f'data-series="{escape(name)}"/>'
        )
        for t, v in points:
            parts.append(
                f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.5" fill="{stroke}">'
                f"<title>{escape(name)} {_clock(t)}: {_number(v)}{escape(unit)}</title></circle>"
            )
    parts.append(_legend(names))
    return _svg(title, parts)


def stacked_bars(
    series: Mapping[str, Sequence[tuple[int, float]]],
    *,
    start_ms: int,
    end_ms: int,
    bucket_ms: int,
    title: str,
    unit: str = "",
    empty: str = "no data in this time range",
) -> str:
    """One bar per time bucket, stacked by series (e.g. run events per minute by state)."""
    names = [n for n in series if series[n]]
    totals: dict[int, float] = {}
    for name in names:
        for t, v in series[name]:
            totals[t] = totals.get(t, 0.0) + v
    top = _nice_max(max(totals.values(), default=0.0))
    span = max(1, end_ms - start_ms)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    bar_w = max(1.0, plot_w * bucket_ms / span - 1)

    def x(t: int) -> float:
        return LEFT + plot_w * (min(max(t, start_ms), end_ms) - start_ms) / span

    parts = [_frame(title, top, unit, start_ms, end_ms, x)]
    if not names:
        parts.append(
            f'<text class="empty" x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2:.0f}" '
            f'text-anchor="middle">{escape(empty)}</text>'
        )
    base: dict[int, float] = {}
    for index, name in enumerate(names):
        fill = colour(name, index)
        for t, v in sorted(series[name]):
            below = base.get(t, 0.0)
            base[t] = below + v
            y_top = TOP + plot_h * (1 - (below + v) / top)
            height = plot_h * v / top
            parts.append(
                f'<rect x="{x(t):.1f}" y="{y_top:.1f}" width="{bar_w:.1f}" '
                f'height="{height:.1f}" fill="{fill}" data-series="{escape(name)}">'
                f"<title>{escape(name)} {_clock(t)}: {_number(v)}{escape(unit)}</title></rect>"
            )
    parts.append(_legend(names))
    return _svg(title, parts)


def _frame(title: str, top: float, unit: str, start_ms: int, end_ms: int, x: object) -> str:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    lines = []
    for i in range(5):
        value = top * i / 4
        y = TOP + plot_h * (1 - i / 4)
        lines.append(
            f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_number(value)}{escape(unit)}</text>"
        )
    ticks = 6
    for i in range(ticks + 1):
        t = start_ms + (end_ms - start_ms) * i // ticks
        tx = LEFT + plot_w * i / ticks
        anchor = "end" if i == ticks else "middle"  # the last label stays inside the chart
        lines.append(
            f'<text class="axis" x="{tx:.1f}" y="{TOP + plot_h + 16}" text-anchor="{anchor}">'
            f"{_clock(t)}</text>"
        )
    return "".join(lines)


def _legend(names: Sequence[str]) -> str:
    items = []
    x = LEFT
    for index, name in enumerate(names):
        items.append(
            f'<rect x="{x}" y="{HEIGHT - 14}" width="10" height="10" '
            f'fill="{colour(name, index)}"/>'
            f'<text class="legend" x="{x + 14}" y="{HEIGHT - 5}">{escape(name)}</text>'
        )
        x += 24 + 7 * len(name)
    return "".join(items)


def _svg(title: str, parts: Sequence[str]) -> str:
    return (
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{''.join(parts)}</svg>"
    )
