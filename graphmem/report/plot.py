"""Memory over one training step, drawn to SVG (built in) or PNG (with matplotlib).

Each series is the estimated live bytes while each op of the step runs, in execution order;
series of different lengths (a rewrite adds ops) share the x axis as a fraction of the step.
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
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        write_atomic(path, _svg(series, title).encode("utf-8"))
    elif suffix == ".png":
        write_atomic(path, _png(series, title))
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


def write_tradeoff_plot(path: str | Path, tradeoff, title: str) -> Path:
    """The trade-off curve as an SVG (or PNG): peak against extra compute."""
    path = Path(path)
    pts = sorted(tradeoff.points, key=lambda p: p.extra_flops_share)
    curve = Series("budget plans (model)", [p.peak_bytes for p in pts])
    marks = [Series(f"{p.label} policy (estimate, +{p.extra_flops_share:.0%} FLOPs)",
                    [p.peak_bytes]) for p in tradeoff.policies]
    return write_plot(path, [curve, *marks], title + " (x: plans by extra compute)")
