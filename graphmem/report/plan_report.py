"""The terminal view of a Tradeoff (`graphmem plan`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphmem.report.tables import print_table
from graphmem.units import format_bytes

if TYPE_CHECKING:  # rich is imported by the renderers: JSON output needs none of it
    from rich.console import Console

    from graphmem.plan import Tradeoff

_HOW = {"model": "model", "estimate": "rewritten"}  # how the peak was found


def render_plan(result: Tradeoff, console: Console, plot: str | None = None) -> None:
    from rich.table import Table

    original = max(result.original_peak_bytes, 1)
    table = Table(title=f"peak memory against extra compute (original peak "
                        f"{format_bytes(result.original_peak_bytes)})", title_justify="left")
    table.add_column("plan")
    table.add_column("peak", justify="right", no_wrap=True)
    table.add_column("x original", justify="right")
    table.add_column("extra FLOPs", justify="right")
    table.add_column("modelled step, 1 | 2 threads", justify="right")
    table.add_column("from")
    for p in result.points + result.policies:
        step = p.modelled_step_time
        table.add_row(p.label, format_bytes(p.peak_bytes), f"{p.peak_bytes / original:.2f}",
                      f"+{p.extra_flops_share:.0%}",
                      f"{step[0]:.2f} | {step[1]:.2f}x" if step else "",
                      _HOW.get(p.how, p.how))
    print_table(console, table)
    console.print(f"lowest peak reachable: {format_bytes(result.smallest_peak_bytes)}; "
                  f"with early updates only: {format_bytes(result.early_updates_peak_bytes)}")
    if result.floor.get("bytes"):
        parts = ", ".join(f"{p['role']} {p['name']} {format_bytes(p['bytes'])}"
                          for p in result.floor["parts"][:3])
        console.print(f"floor: {format_bytes(result.floor['bytes'])} "
                      f"({result.floor['bytes'] / original:.2f}x), no plan peaks lower "
                      f"({result.floor['op']} runs with {parts})")
    if result.floor_note:
        console.print(result.floor_note)
    if plot:
        console.print(f"plot written to {plot}")
