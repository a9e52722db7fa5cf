"""A replay as files a capacity planner can plot: CSV or JSON rows, and an SVG picture (pure).

CSV and JSON have one row per step and priority (the step's own figures repeated on each of
its rows), so a spreadsheet can pivot by either. The SVG draws, over the trace's time, the
devices demanded, the devices met, and the devices the fleet holds of the demanded profiles
(its capacity), as step lines: what a step sets holds until the next step.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from xml.sax.saxutils import escape

from agent.coordinator.planning.replay import StepResult

__all__ = ["COLUMNS", "report_csv", "report_json", "report_rows", "report_svg"]

COLUMNS = (
    "time_s",
    "label",
    "priority",
    "demand",
    "met",
    "unmet",
    "step_demand",
    "step_met",
    "capacity",
    "destroyed",
    "created",
    "gpus_reconfigured",
    "idle_slices",
    "total_slices",
    "duration_s",
    "gpu_hours_idle",
)


def report_rows(steps: Sequence[StepResult]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for s in steps:
        common = {
            "time_s": s.time,
            "label": s.label,
            "step_demand": s.demand,
            "step_met": s.met,
            "capacity": s.capacity,
            "destroyed": s.disrupted,
            "created": s.created,
            "gpus_reconfigured": s.gpus_changed,
            "idle_slices": s.idle_slices,
            "total_slices": s.total_slices,
            "duration_s": s.duration_s,
            "gpu_hours_idle": round(s.gpu_hours_idle, 4),
        }
        for p in s.by_priority or ():
            rows.append(
                {
                    **common,
                    "priority": p.priority,
                    "demand": p.demand,
                    "met": p.met,
                    "unmet": p.unmet,
                }
            )
    return [{k: r[k] for k in COLUMNS} for r in rows]


def report_csv(steps: Sequence[StepResult]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(report_rows(steps))
    return out.getvalue()


def report_json(steps: Sequence[StepResult]) -> str:
    return json.dumps(report_rows(steps), indent=2) + "\n"


_W, _H = 800, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 60, 150, 20, 40
_SERIES = (("demand", "#d62728"), ("capacity", "#1f77b4"), ("met", "#2ca02c"))


def report_svg(steps: Sequence[StepResult], title: str = "Demand vs capacity") -> str:
    """Step lines of demand, capacity and met devices over the trace's time."""
    if not steps:
        return _svg([f'<text x="{_LEFT}" y="{_TOP + 20}">no steps</text>'], title)
    start = steps[0].time
    last = steps[-1]
    span = (last.time - start) + (last.duration_s or 0.0)
    if span <= 0:
        span = 1.0
    # The last step without a duration is drawn a tenth of the span wide, so it shows.
    ends = [s.time - start for s in steps[1:]] + [
        (last.time - start) + (last.duration_s or span / 10)
    ]
    span = max(span, ends[-1])
    top = max(max(s.demand, s.capacity, s.met) for s in steps) or 1
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + plot_w * t / span

    def y(v: float) -> float:
        return _TOP + plot_h * (1 - v / top)

    parts = [
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#999"/>',
    ]
    for tick in range(5):
        value = top * tick / 4
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end" '
            f'font-size="11">{value:.0f}</text>'
        )
    unit, scale = _time_unit(span)
    for tick in range(5):
        t = span * tick / 4
        parts.append(
            f'<text x="{x(t):.1f}" y="{_H - _BOTTOM + 16}" text-anchor="middle" '
            f'font-size="11">{t / scale:.1f}</text>'
        )
    parts.append(
        f'<text x="{_LEFT + plot_w / 2}" y="{_H - 6}" text-anchor="middle" font-size="12">'
        f"time since the trace's start ({unit})</text>"
    )
    parts.append(
        f'<text x="14" y="{_TOP + plot_h / 2}" font-size="12" '
        f'transform="rotate(-90 14 {_TOP + plot_h / 2})" text-anchor="middle">devices</text>'
    )
    for i, (series, colour) in enumerate(_SERIES):
        points = []
        for s, until in zip(steps, ends, strict=True):
            value = float(getattr(s, series))
            points += [f"{x(s.time - start):.1f},{y(value):.1f}", f"{x(until):.1f},{y(value):.1f}"]
        parts.append(
            f'<polyline class="{series}" fill="none" stroke="{colour}" stroke-width="2" '
            f'points="{" ".join(points)}"/>'
        )
        ly = _TOP + 16 + 20 * i
        parts.append(
            f'<line x1="{_W - _RIGHT + 12}" y1="{ly - 4}" x2="{_W - _RIGHT + 36}" y2="{ly - 4}" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        parts.append(f'<text x="{_W - _RIGHT + 42}" y="{ly}" font-size="12">{series}</text>')
    return _svg(parts, title)


def _time_unit(span: float) -> tuple[str, float]:
    if span >= 3 * 3600:
        return "h", 3600.0
    if span >= 180:
        return "min", 60.0
    return "s", 1.0


def _svg(parts: Sequence[str], title: str) -> str:
    body = "\n  ".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" font-family="sans-serif">\n'
        f"  <title>{escape(title)}</title>\n  {body}\n</svg>\n"
    )
