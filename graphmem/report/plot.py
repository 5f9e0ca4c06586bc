"""Charts, drawn to SVG (built in) or PNG (with matplotlib).

`write_plot`: memory over one training step (inspect, rewrite). Each series is the
estimated live bytes while each op of the step runs, in execution order; series of
different lengths (a rewrite adds ops) share the x axis as a fraction of the step.
`write_tradeoff_plot`: peak memory against extra compute (plan), one point per plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from graphmem.errors import UsageError
from graphmem.formats.save import write_atomic
from graphmem.units import format_bytes

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


@dataclass
class Series:
    label: str
    values: list[int]


def write_plot(path: str | Path, series: list[Series], title: str) -> Path:
    return _write(path, lambda: _svg(series, title), lambda: _png(series, title))


def _write(path: str | Path, svg, png) -> Path:
    """Write the chart as the path's suffix says: `svg()` gives the SVG text, `png()` the
    PNG bytes (matplotlib); called only for the format written."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        write_atomic(path, svg().encode("utf-8"))
    elif suffix == ".png":
        write_atomic(path, png())
    else:
        raise UsageError(f"--plot writes .svg or .png files, not {path.name!r}")
    return path


def _svg(series: list[Series], title: str, width: int = 900, height: int = 420) -> str:
    left, right, top, bottom = 80, 20, 40, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    top_value = max((max(s.values, default=0) for s in series), default=0) or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="24" font-size="15">{escape(title)}</text>']
    for k in range(5):  # horizontal grid with byte labels
        value = top_value * k / 4
        y = top + plot_h - plot_h * k / 4
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                     'stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f'{escape(format_bytes(int(value)))}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 12}" text-anchor="middle">'
                 'progress through the training step (ops in execution order)</text>')
    for n, s in enumerate(series):
        color = COLORS[n % len(COLORS)]
        if not s.values:
            continue
        count = max(len(s.values) - 1, 1)
        points = " ".join(f"{left + plot_w * i / count:.1f},"
                          f"{top + plot_h - plot_h * v / top_value:.1f}"
                          for i, v in enumerate(s.values))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                     f'points="{points}"/>')
        peak_i = max(range(len(s.values)), key=s.values.__getitem__)
        px = left + plot_w * peak_i / count
        py = top + plot_h - plot_h * s.values[peak_i] / top_value
        parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{color}"/>')
        label = f"{s.label}: peak {format_bytes(s.values[peak_i])}"
        parts.append(f'<text x="{left + plot_w - 4}" y="{top + 16 + 16 * n}" '
                     f'text-anchor="end" fill="{color}">{escape(label)}</text>')
    parts.append("</svg>\n")
    return "\n".join(parts)


def _png(series: list[Series], title: str) -> bytes:
    try:
        import matplotlib  # noqa: PLC0415 - optional, only for PNG

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise UsageError("PNG plots need matplotlib (pip install matplotlib); "
                         "or write an .svg") from None
    import io  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    for n, s in enumerate(series):
        if not s.values:
            continue
        count = max(len(s.values) - 1, 1)
        xs = [i / count for i in range(len(s.values))]
        mib = [v / 2**20 for v in s.values]
        color = COLORS[n % len(COLORS)]
        ax.plot(xs, mib, color=color, lw=1.2,
                label=f"{s.label}: peak {format_bytes(max(s.values))}")
        peak_i = max(range(len(s.values)), key=s.values.__getitem__)
        ax.plot([xs[peak_i]], [mib[peak_i]], "o", color=color)
    ax.set_title(title)
    ax.set_xlabel("progress through the training step (ops in execution order)")
    ax.set_ylabel("estimated live memory (MiB)")
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


@dataclass
class ChartPoint:
    label: str
    extra_flops_share: float  # x: extra forward FLOPs, a share of the forward pass's
    peak_bytes: int  # y


@dataclass
class TradeoffChart:
    """What the `plan` chart draws: one point per plan of the curve, the policies where
    they are, and two levels across it (the original graph's peak and the floor, the peak
    no plan goes under: analysis/floor.py)."""
    curve: list[ChartPoint]
    policies: list[ChartPoint]
    original_peak_bytes: int
    floor_bytes: int


def tradeoff_chart(tradeoff) -> TradeoffChart:
    curve = [ChartPoint(p.label, p.extra_flops_share, p.peak_bytes)
             for p in sorted(tradeoff.points, key=lambda p: p.extra_flops_share)]
    policies = [ChartPoint(f"{p.label} policy", p.extra_flops_share, p.peak_bytes)
                for p in tradeoff.policies]
    return TradeoffChart(curve, policies, tradeoff.original_peak_bytes,
                         tradeoff.floor.get("bytes") or tradeoff.smallest_peak_bytes)


def write_tradeoff_plot(path: str | Path, tradeoff, title: str) -> Path:
    """Peak memory (y) against extra compute (x), as SVG (built in) or PNG (matplotlib)."""
    chart = tradeoff_chart(tradeoff)
    return _write(path, lambda: _tradeoff_svg(chart, title),
                  lambda: _tradeoff_png(chart, title))


_X_LABEL = "extra compute (recomputed forward FLOPs, share of the forward pass)"
_Y_LABEL = "estimated step peak"


def _tradeoff_svg(chart: TradeoffChart, title: str, width: int = 900,
                  height: int = 460) -> str:
    left, right, top, bottom = 80, 30, 40, 90
    plot_w, plot_h = width - left - right, height - top - bottom
    points = chart.curve + chart.policies
    y_top = max([chart.original_peak_bytes, *(p.peak_bytes for p in points)], default=0) or 1
    x_top = max([p.extra_flops_share for p in points], default=0) or 1.0

    def xy(x: float, y: float) -> tuple[float, float]:
        return left + plot_w * x / x_top, top + plot_h - plot_h * y / y_top

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="24" font-size="15">{escape(title)}</text>']
    for k in range(5):
        _, y = xy(0, y_top * k / 4)
        x, _ = xy(x_top * k / 4, 0)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                     'stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f'{escape(format_bytes(int(y_top * k / 4)))}</text>')
        parts.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
                     f'+{x_top * k / 4:.0%}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h + 36}" '
                 f'text-anchor="middle">{escape(_X_LABEL)}</text>')
    parts.append(f'<text transform="translate(16,{top + plot_h / 2}) rotate(-90)" '
                 f'text-anchor="middle">{_Y_LABEL}</text>')
    for level, label, dash in ((chart.original_peak_bytes, "original", "6,4"),
                               (chart.floor_bytes, "floor", "2,3")):
        _, y = xy(0, level)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                     f'stroke="#555" stroke-dasharray="{dash}" class="level"/>')
        parts.append(f'<text x="{left + plot_w - 4}" y="{y - 4:.1f}" text-anchor="end" '
                     f'fill="#555">{escape(label)}: {escape(format_bytes(level))}</text>')
    if chart.curve:
        coords = " ".join("{:.1f},{:.1f}".format(*xy(p.extra_flops_share, p.peak_bytes))
                          for p in chart.curve)
        parts.append(f'<polyline fill="none" stroke="{COLORS[0]}" stroke-width="1.5" '
                     f'points="{coords}"/>')
    for p in chart.curve:
        x, y = xy(p.extra_flops_share, p.peak_bytes)
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{COLORS[0]}" '
                     f'class="plan"><title>{escape(p.label)}</title></circle>')
    for n, p in enumerate(chart.policies):
        color = COLORS[(n + 1) % len(COLORS)]
        x, y = xy(p.extra_flops_share, p.peak_bytes)
        parts.append(f'<rect x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10" '
                     f'fill="{color}" class="policy"/>')
        parts.append(f'<text x="{x + 8:.1f}" y="{y - 8:.1f}" fill="{color}">'
                     f'{escape(p.label)}</text>')
    legend_y = height - 24
    parts.append(f'<circle cx="{left}" cy="{legend_y - 4}" r="4" fill="{COLORS[0]}"/>'
                 f'<text x="{left + 10}" y="{legend_y}">budget plans (one point per plan)'
                 '</text>')
    for n, p in enumerate(chart.policies):
        color = COLORS[(n + 1) % len(COLORS)]
        x0 = left + 260 + 250 * n
        parts.append(f'<rect x="{x0 - 5}" y="{legend_y - 9}" width="10" height="10" '
                     f'fill="{color}"/><text x="{x0 + 10}" y="{legend_y}">'
                     f'{escape(p.label)}: {escape(format_bytes(p.peak_bytes))}, '
                     f'+{p.extra_flops_share:.0%}</text>')
    parts.append("</svg>\n")
    return "\n".join(parts)


def _tradeoff_png(chart: TradeoffChart, title: str) -> bytes:
    plt = _pyplot()
    import io  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=100)
    mib = 2**20
    if chart.curve:
        ax.plot([p.extra_flops_share * 100 for p in chart.curve],
                [p.peak_bytes / mib for p in chart.curve], "o-", color=COLORS[0],
                label="budget plans (one point per plan)")
    for n, p in enumerate(chart.policies):
        ax.plot([p.extra_flops_share * 100], [p.peak_bytes / mib], "s", ms=9,
                color=COLORS[(n + 1) % len(COLORS)],
                label=f"{p.label}: {format_bytes(p.peak_bytes)}, +{p.extra_flops_share:.0%}")
    ax.axhline(chart.original_peak_bytes / mib, color="#555", ls="--",
               label=f"original: {format_bytes(chart.original_peak_bytes)}")
    ax.axhline(chart.floor_bytes / mib, color="#555", ls=":",
               label=f"floor (no plan goes under): {format_bytes(chart.floor_bytes)}")
    ax.set_title(title)
    ax.set_xlabel(_X_LABEL.replace("share", "%"))
    ax.set_ylabel(f"{_Y_LABEL} (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best")
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _pyplot():
    try:
        import matplotlib  # noqa: PLC0415 - optional, only for PNG

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise UsageError("PNG plots need matplotlib (pip install matplotlib); "
                         "or write an .svg") from None
    return plt
