"""Server-rendered SVG charts of the last 24 hours: stacked bars and lines, no JavaScript, nothing fetched.

Each chart is an inline ``<svg role="img">`` labelled by its ``<title>`` and ``<desc>`` (the text summary the
page also shows under it), with a ``<title>`` per bar or point for the hour's figures. Colours are CSS classes
(``fabrika-series--…``) whose values ``admin.css`` takes from variables set for the admin's light and dark
themes; text and grid lines use the admin's own ``--body-quiet-color`` and ``--hairline-color``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

# The drawing's own units; the SVG scales to its box (width 100%), the text stays legible at 1280 px.
_WIDTH, _HEIGHT = 480, 150
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 10, 12, 24
_PLOT_W, _PLOT_H = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM


@dataclass(frozen=True)
class Series:
    """One band of a stacked bar chart or one line: a label, a CSS class suffix, a value per hour."""

    label: str
    css: str
    values: Sequence[float | None]


def _hour(slot: datetime) -> str:
    return slot.strftime("%H:%M")


def _nice_ceiling(value: float) -> float:
    """Round the axis top up to 1, 2 or 5 times a power of ten, so its label reads well."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if value <= step * power * (1 + 1e-9))


def _number(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3g} s" if value < 100 else f"{value:.0f} s"
    return f"{value:g}"


def _frame(
    chart_id: str, title: str, summary: str, top: float, unit: str, slots: list[datetime], body: SafeString
) -> SafeString:
    """The chart's box: title and description for assistive technology, the y axis, hour ticks, and ``body``."""
    ticks = format_html_join(
        "",
        '<text class="fabrika-chart-axis" x="{}" y="{}" text-anchor="middle">{}</text>',
        (
            (f"{_LEFT + (index + 0.5) * _PLOT_W / len(slots):.1f}", _HEIGHT - 6, _hour(slot))
            for index, slot in enumerate(slots)
            if index % 6 == 0 or index == len(slots) - 1
        ),
    )
    return format_html(
        '<svg class="fabrika-chart" id="{id}" viewBox="0 0 {w} {h}" role="img" aria-labelledby="{id}-title {id}-desc"'
        ' preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">'
        '<title id="{id}-title">{title}</title><desc id="{id}-desc">{summary}</desc>'
        '<line class="fabrika-chart-grid" x1="{left}" x2="{right}" y1="{top}" y2="{top}"/>'
        '<line class="fabrika-chart-grid" x1="{left}" x2="{right}" y1="{mid}" y2="{mid}"/>'
        '<line class="fabrika-chart-base" x1="{left}" x2="{right}" y1="{base}" y2="{base}"/>'
        '<text class="fabrika-chart-axis" x="{label_x}" y="{top_label}" text-anchor="end">{top_value}</text>'
        '<text class="fabrika-chart-axis" x="{label_x}" y="{base_label}" text-anchor="end">0</text>'
        "{ticks}{body}</svg>",
        id=chart_id,
        w=_WIDTH,
        h=_HEIGHT,
        title=title,
        summary=summary,
        left=_LEFT,
        right=_WIDTH - _RIGHT,
        top=_TOP,
        mid=f"{_TOP + _PLOT_H / 2:.1f}",
        base=_TOP + _PLOT_H,
        label_x=_LEFT - 4,
        top_label=_TOP + 4,
        base_label=_TOP + _PLOT_H,
        top_value=_number(top, unit),
        ticks=ticks,
        body=body,
    )


def stacked_bars(chart_id: str, title: str, summary: str, slots: list[datetime], bands: list[Series]) -> SafeString:
    """Draw one bar per hour, its bands stacked bottom-up in the order given (zero bands are left out)."""
    totals = [sum(band.values[index] or 0 for band in bands) for index in range(len(slots))]
    top = _nice_ceiling(max(totals, default=0))
    slot_w = _PLOT_W / len(slots)
    rects = []
    for index, slot in enumerate(slots):
        floor = 0.0
        for band in bands:
            value = band.values[index] or 0
            if not value:
                continue
            height = value / top * _PLOT_H
            y = _TOP + _PLOT_H - (floor + value) / top * _PLOT_H
            rects.append(
                (
                    band.css,
                    f"{_LEFT + index * slot_w + 1:.1f}",
                    f"{y:.1f}",
                    f"{max(slot_w - 2, 1):.1f}",
                    f"{height:.1f}",
                    f"{_hour(slot)} UTC: {value:g} {band.label}",
                )
            )
            floor += value
    # Plain strings escaped once: a page of twenty charts draws a thousand shapes, and format_html per shape
    # costs more than the database's reads.
    body = mark_safe(  # noqa: S308  every value below is a number or escaped
        "".join(
            f'<rect class="fabrika-series--{css}" x="{x}" y="{y}" width="{w}" height="{h}">'
            f"<title>{escape(tip)}</title></rect>"
            for css, x, y, w, h, tip in rects
        )
    )
    return _frame(chart_id, title, summary, top, "", slots, body)


def lines(
    chart_id: str, title: str, summary: str, slots: list[datetime], series: list[Series], unit: str = ""
) -> SafeString:
    """Draw one line per series through the hours that have a value, with a dot on each (gaps stay gaps)."""
    values = [value for line in series for value in line.values if value is not None]
    top = _nice_ceiling(max(values, default=0))
    slot_w = _PLOT_W / len(slots)
    parts = []
    for line in series:
        points = [
            (
                f"{_LEFT + (index + 0.5) * slot_w:.1f}",
                f"{_TOP + _PLOT_H - value / top * _PLOT_H:.1f}",
                slots[index],
                value,
            )
            for index, value in enumerate(line.values)
            if value is not None
        ]
        if not points:
            continue
        path = " ".join(f"{x},{y}" for x, y, _slot, _value in points)
        label = escape(line.label)
        dots = "".join(
            f'<circle class="fabrika-series--{line.css}" cx="{x}" cy="{y}" r="2.5">'
            f"<title>{_hour(slot)} UTC: {label} {escape(_number(value, unit))}</title></circle>"
            for x, y, slot, value in points
        )
        parts.append(f'<polyline class="fabrika-line--{line.css}" points="{path}"/>{dots}')
    return _frame(chart_id, title, summary, top, unit, slots, mark_safe("".join(parts)))  # noqa: S308  as above


def legend(series: list[Series]) -> SafeString:
    """A legend of swatches and labels, as HTML under the chart (readable text, not part of the drawing)."""
    return format_html(
        '<ul class="fabrika-legend">{}</ul>',
        format_html_join(
            "",
            '<li><span class="fabrika-swatch fabrika-series--{}" aria-hidden="true"></span>{}</li>',
            ((line.css, line.label) for line in series),
        ),
    )
