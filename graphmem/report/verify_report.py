"""Presenting a VerifyResult."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphmem.runtime.verify import VerifyResult
from graphmem.units import format_bytes

if TYPE_CHECKING:  # rich is imported by the renderers: JSON output needs none of it
    from rich.console import Console


def verify_document(r: VerifyResult) -> dict:
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
            "mismatches": r.mismatches}


def render_verify(r: VerifyResult, console: Console) -> None:
    from rich.table import Table

    warmup = r.original.warmup
    title = f"{len(r.original.steps)} training steps, inter-op threads {r.inter_op_threads}"
    if warmup:
        title += f" (the first {warmup} compared too, not listed or measured)"
    t = Table(title=title, title_justify="left")
    t.add_column("step", justify="right")
    t.add_column("loss (original)", justify="right")
    t.add_column("loss (rewritten)", justify="right")
    t.add_column("peak (original)", justify="right")
    t.add_column("peak (rewritten)", justify="right")
    pairs = list(zip(r.original.steps, r.rewritten.steps, strict=True))
    for k, (a, b) in enumerate(pairs[warmup:], start=warmup):
        t.add_row(str(k + 1), f"{a.loss:.7g}", f"{b.loss:.7g}", format_bytes(a.peak_bytes),
                  format_bytes(b.peak_bytes))
    console.print(t)
    pa, pb = r.original.measured_peak_bytes, r.rewritten.measured_peak_bytes
    ratio = pb / pa if pa else 1.0
    ta, tb = r.original.median_step_seconds, r.rewritten.median_step_seconds
    which = f"after {warmup} warm-up steps" if warmup else "first step excluded"
    console.print(f"measured step peak (median, {which}): {format_bytes(pa)} -> "
                  f"[bold]{format_bytes(pb)}[/] ({ratio:.2f}x); step time "
                  f"{ta * 1000:.1f} ms -> {tb * 1000:.1f} ms ({tb / ta if ta else 1:.2f}x)")
    console.print(f"{r.variables_compared} variables compared; max difference: loss "
                  f"{r.max_loss_diff:.3g}, variables {r.max_variable_diff:.3g}"
                  + (f" ({r.worst_variable})" if r.worst_variable else ""))
    if r.same_training:
        console.print(f"[green]same training[/] (rtol {r.rtol:g}, atol {r.atol:g})")
    else:
        console.print(f"[red]training differs[/]: {'; '.join(r.mismatches[:5])}")
