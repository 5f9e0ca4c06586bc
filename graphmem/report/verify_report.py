"""Presenting a VerifyResult."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphmem.report.tables import print_table
from graphmem.runtime.verify import VerifyResult
from graphmem.units import format_bytes

if TYPE_CHECKING:  # rich is imported by the renderers: JSON output needs none of it
    from rich.console import Console


def verify_document(r: VerifyResult, batch_size: int | None = None,
                    batch_from: str | None = None) -> dict:
    def run(g):
        return {"path": g.path, "losses": [s.loss for s in g.steps],
                "measured_peak_bytes": g.measured_peak_bytes,
                "step_peaks_bytes": [s.peak_bytes for s in g.steps],
                "median_step_seconds": g.median_step_seconds}

    return {"same_training": r.same_training, "original": run(r.original),
            "rewritten": run(r.rewritten), "max_loss_diff": r.max_loss_diff,
            "max_variable_diff": r.max_variable_diff, "worst_variable": r.worst_variable,
            "variables_compared": r.variables_compared, "rtol": r.rtol, "atol": r.atol,
            "inter_op_threads": r.inter_op_threads, "warmup_steps": r.original.warmup,
            "batch_size": batch_size, "batch_from": batch_from,
            "mismatches": r.mismatches}


def render_verify(r: VerifyResult, console: Console, batch_size: int | None = None,
                  batch_from: str | None = None) -> None:
    from rich.table import Table

    warmup = r.original.warmup
    batch = ""
    if batch_from and batch_from != "not needed":
        batch = f" at batch {batch_size} (from {batch_from})"
    title = (f"{len(r.original.steps)} training steps{batch}, inter-op threads "
             f"{r.inter_op_threads}")
    if warmup:
        title += f"; the first {warmup} compared too, not listed or measured"
    pairs = list(zip(r.original.steps, r.rewritten.steps, strict=True))[warmup:]
    losses = [x.loss for a, b in pairs for x in (a, b)]
    digits = _loss_digits(losses)
    t = Table(title=title, title_justify="left")
    t.add_column("step", justify="right")
    t.add_column("loss\noriginal", justify="right")
    t.add_column("loss\nrewritten", justify="right")
    t.add_column("peak\noriginal", justify="right", no_wrap=True)
    t.add_column("peak\nrewritten", justify="right", no_wrap=True)
    for k, (a, b) in enumerate(pairs, start=warmup):
        t.add_row(str(k + 1), f"{a.loss:.{digits}f}", f"{b.loss:.{digits}f}",
                  format_bytes(a.peak_bytes), format_bytes(b.peak_bytes))
    print_table(console, t)
    pa, pb = r.original.measured_peak_bytes, r.rewritten.measured_peak_bytes
    ratio = f" ({pb / pa:.2f}x)" if pa else ""
    ta, tb = r.original.median_step_seconds, r.rewritten.median_step_seconds
    which = f"after {warmup} warm-up steps" if warmup else "first step left out"
    console.print(f"measured step peak (median, {which}): {format_bytes(pa)} -> "
                  f"[bold]{format_bytes(pb)}[/]{ratio}")
    console.print(f"step time (median): {ta * 1000:.1f} ms -> {tb * 1000:.1f} ms"
                  + (f" ({tb / ta:.2f}x)" if ta else ""))
    worst = f" (largest in {r.worst_variable})" if r.worst_variable and r.max_variable_diff \
        else ""
    console.print(f"{r.variables_compared} variables compared; largest difference: loss "
                  f"{r.max_loss_diff:.3g}, variables {r.max_variable_diff:.3g}{worst}")
    if r.same_training:
        console.print(f"[green]same training[/] (rtol {r.rtol:g}, atol {r.atol:g})")
    else:
        console.print(f"[red]training differs[/]: {'; '.join(r.mismatches[:5])}")


def _loss_digits(losses: list[float]) -> int:
    """Decimals that show every loss with 7 significant digits, the same for all rows (so
    the column lines up and equal losses look equal)."""
    import math

    finite = [abs(x) for x in losses if math.isfinite(x) and x != 0]
    if not finite:
        return 6
    return max(0, min(12, 6 - math.floor(math.log10(min(finite)))))
