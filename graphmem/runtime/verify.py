"""`graphmem verify`: do two graphs train the same, and what does each really allocate?"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from graphmem.errors import InputError
from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.runtime.train_runner import RunSpec, StepRecord, make_feeds, make_runner


@dataclass
class GraphRun:
    path: str
    steps: list[StepRecord]
    warmup: int = 0  # steps run before the measured ones

    def _measured(self) -> list[StepRecord]:
        """The steps peaks and times are taken from: after the warm-up, or without one,
        all but the first (its one-time allocations)."""
        if self.warmup:
            return self.steps[self.warmup:] or self.steps
        return self.steps[1:] or self.steps

    @property
    def measured_peak_bytes(self) -> int:
        return int(statistics.median(s.peak_bytes for s in self._measured()))

    @property
    def median_step_seconds(self) -> float:
        return statistics.median(s.seconds for s in self._measured())


@dataclass
class VerifyResult:
    original: GraphRun
    rewritten: GraphRun
    max_loss_diff: float
    max_variable_diff: float
    worst_variable: str | None
    variables_compared: int
    rtol: float
    atol: float
    inter_op_threads: int
    mismatches: list[str] = field(default_factory=list)

    @property
    def same_training(self) -> bool:
        return not self.mismatches


def verify(original: str, rewritten: str, spec: RunSpec, steps: int, rtol: float,
           atol: float, fmt=None, tag=None, function=None, warmup: int = 0,
           on_step=None) -> VerifyResult:
    """Train both graphs `warmup + steps` steps on the same feeds, compare every step's
    loss and the variables at the end; peaks and times come from the last `steps` steps
    after a warm-up (TF's executor runs small ops differently for a training run's first
    ~90 steps, see benchmarks/measure.py), else from all but the first. `on_step(done,
    total)` is told after each step (a progress display)."""
    ws_a = Workspace.open(load_model(original, fmt, tag, function))
    ws_b = Workspace.open(load_model(rewritten, fmt, tag, function))
    a = make_runner(ws_a, spec)
    b = make_runner(ws_b, spec)
    try:
        a.initialize()
        b.initialize()
        b.load_variables(a.variables())
        runs_a, runs_b = [], []
        mismatches = []
        max_loss = 0.0
        for step in range(warmup + steps):
            feeds = a.feeds(step) if hasattr(a, "feeds") else make_feeds(
                a.index, a.regions, spec, step)
            ra, rb = a.step(feeds), b.step(feeds)
            if on_step is not None:  # a progress display: steps done, of all
                on_step(step + 1, warmup + steps)
            runs_a.append(ra)
            runs_b.append(rb)
            diff = abs(ra.loss - rb.loss)
            max_loss = max(max_loss, diff)
            if not np.isclose(rb.loss, ra.loss, rtol=rtol, atol=atol):
                mismatches.append(f"step {step + 1}: loss {ra.loss!r} vs {rb.loss!r}")
        va, vb = a.variables(), b.variables()
        diverged = next((k for k, r in enumerate(runs_a) if not np.isfinite(r.loss)), None)
        if diverged is not None:  # NaN == NaN fails, and equal NaNs would prove nothing
            raise InputError(
                f"the original graph's loss is {runs_a[diverged].loss} at step {diverged + 1}: "
                "it does not train on these inputs, so the comparison cannot show equal "
                "training (feed real data with --feed name=file.npy)")
    finally:
        a.close()
        b.close()
    worst, max_var = None, 0.0
    for name, value in va.items():
        other = vb[name]
        d = float(np.max(np.abs(value.astype(np.float64) - other.astype(np.float64)))) \
            if value.size else 0.0
        if d > max_var or worst is None:
            worst, max_var = (name, d) if d >= max_var else (worst, max_var)
        if not np.allclose(other, value, rtol=rtol, atol=atol):
            mismatches.append(f"variable {name} differs by up to {d:.3g}")
    return VerifyResult(GraphRun(original, runs_a, warmup), GraphRun(rewritten, runs_b, warmup),
                        max_loss,
                        max_var, worst, len(va), rtol, atol, spec.inter_op_threads, mismatches)
