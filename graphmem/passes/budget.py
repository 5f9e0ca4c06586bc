"""Budget policy: the cheapest recompute plan whose estimated peak fits a memory budget.

The forward spine is condensed to a chain of units between candidate cuts (bottlenecks, or
the cheapest cut of each stretch where there are none). Each unit is either kept (its saved
activations stay, no extra compute) or recomputed (its forward ops run again in the backward
pass); a run of recomputed units is split into segments by cuts whose crossing tensors are
kept. The step's peak is modelled as

    base + kept activations + kept cut tensors + the largest recomputed segment,

where base is the estimated peak minus all saved activations. Minimising the recompute
FLOPs under `peak <= budget` is a small mixed-integer program (Checkmate, Jain et al. 2020,
restricted to a chain), solved with SciPy's HiGHS under a time limit; without SciPy, or
when the solver gives no answer in time, a greedy plan over the same model is used.
"""

from __future__ import annotations

import contextlib
import math
from bisect import bisect_left
from dataclasses import dataclass

from graphmem.analysis.cost import op_flops
from graphmem.analysis.spine import Spine
from graphmem.graph.index import GraphIndex, Tensor

MAX_UNITS = 400


@dataclass
class Units:
    cuts: list[int]  # spine positions; unit k ends at cuts[k] (the last unit at the end)
    act: list[int]  # saved-activation bytes per unit
    flops: list[int]  # recompute cost per unit
    cut_bytes: list[int]  # bytes kept when cut k is a checkpoint


@dataclass
class BudgetSolution:
    budget_bytes: int
    method: str  # "milp", or "greedy (why)"
    recompute: list[bool]  # per unit
    keep_cut: list[bool]  # per cut
    model_peak: int
    extra_flops: int
    total_flops: int  # forward FLOPs of the spine, for a relative figure
    feasible: bool
    min_peak: int  # the smallest peak the model reaches (everything recomputed, best cuts)


def build_units(index: GraphIndex, spine: Spine, batch_size: int | None) -> Units:
    n = len(spine.order)
    cuts = sorted(spine.bottleneck_at)
    if len(cuts) < 8 and n > 1:  # few bottlenecks: add the cheapest cut of 32 stretches
        step = max(1, n // 32)
        for lo in range(0, n - 1, step):
            hi = min(lo + step, n - 1)
            cuts.append(min(range(lo, hi), key=spine.cut_bytes.__getitem__))
        cuts = sorted(set(cuts))
    if len(cuts) > MAX_UNITS:  # keep cuts spread evenly in bytes
        total = spine.total or 1
        marks = [spine.cumulative[c] for c in cuts]
        chosen = {cuts[min(bisect_left(marks, total * q / MAX_UNITS), len(cuts) - 1)]
                  for q in range(MAX_UNITS)}
        cuts = sorted(chosen)
    cuts = [c for c in cuts if c < n - 1]
    act, flops = [], []
    start = 0
    for end in cuts + [n - 1]:
        act.append(sum(spine.weight[start:end + 1]))
        flops.append(sum(op_flops(index, spine.order[p], batch_size)
                         for p in range(start, end + 1)))
        start = end + 1
    return Units(cuts, act, flops, [spine.cut_bytes[c] for c in cuts])


def model_peak(units: Units, base: int, recompute: list[bool], keep_cut: list[bool]) -> int:
    peak_segment, segment = 0, 0
    kept = 0
    for k, a in enumerate(units.act):
        if k > 0 and (keep_cut[k - 1] or not recompute[k - 1]):
            segment = 0
        if recompute[k]:
            segment += a
            peak_segment = max(peak_segment, segment)
        else:
            kept += a
            segment = 0
    cut_kept = sum(b for b, on in zip(units.cut_bytes, keep_cut, strict=True) if on)
    return base + kept + cut_kept + peak_segment


def solve_budget(units: Units, base: int, budget: int, time_limit: float = 20.0
                 ) -> BudgetSolution:
    total_flops = sum(units.flops)
    min_sol = _solve(units, base, None, time_limit)
    min_peak = model_peak(units, base, *min_sol[:2]) if min_sol else base + sum(units.act)
    sol = _solve(units, base, budget, time_limit) if min_peak <= budget else None
    if sol is not None:
        recompute, keep_cut, method = sol
    elif min_peak > budget and min_sol is not None:
        recompute, keep_cut, method = min_sol
    else:
        recompute, keep_cut, why = _greedy(units, base, budget)
        method = f"greedy ({why})"
    peak = model_peak(units, base, recompute, keep_cut)
    extra = sum(f for f, r in zip(units.flops, recompute, strict=True) if r)
    return BudgetSolution(budget, method, recompute, keep_cut, peak, extra, total_flops,
                          peak <= budget, min_peak)


def _solve(units: Units, base: int, budget: int | None, time_limit: float):
    """The MILP: minimise recompute FLOPs under the budget, or (budget None) minimise the
    modelled peak. Returns (recompute, keep_cut, "milp") or None."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        return None
    m = len(units.act)  # units; cuts = m - 1
    nr, nx, ns = m, m - 1, m
    size = nr + nx + ns + 1  # r, x, s, M
    r0, x0, s0, mi = 0, nr, nr + nx, nr + nx + ns
    big = float(sum(units.act) + 1)
    rows, lo, hi = [], [], []

    def row(coefs: dict[int, float], low: float, high: float) -> None:
        v = np.zeros(size)
        for j, c in coefs.items():
            v[j] += c
        rows.append(v)
        lo.append(low)
        hi.append(high)

    inf = np.inf
    for k in range(m):
        a = float(units.act[k])
        if k == 0:  # s_0 >= a_0 - BIG (1 - r_0)
            row({s0: 1, r0: -a - big}, -big, inf)
        else:  # s_k >= s_{k-1} + a_k r_k - BIG x_{k-1} - BIG (1 - r_k), and s_k >= a_k r_k
            row({s0 + k: 1, s0 + k - 1: -1, r0 + k: -a - big, x0 + k - 1: big}, -big, inf)
            row({s0 + k: 1, r0 + k: -a}, 0, inf)
            # a recomputed unit after a kept one needs the cut between kept: x >= r_k - r_{k-1}
            row({x0 + k - 1: 1, r0 + k: -1, r0 + k - 1: 1}, 0, inf)
            row({x0 + k - 1: 1, r0 + k: -1}, -inf, 0)  # a cut kept only before recompute
        row({mi: 1, s0 + k: -1}, 0, inf)  # M >= s_k
    # modelled peak = base + sum a - sum a r + sum b x + M
    peak = {r0 + k: -float(units.act[k]) for k in range(m)}
    peak.update({x0 + k: float(units.cut_bytes[k]) for k in range(nx)})
    peak[mi] = 1.0
    constant = base + sum(units.act)
    if budget is not None:
        row(peak, -inf, float(budget - constant))
        c = np.zeros(size)
        c[r0:r0 + nr] = units.flops
    else:
        c = np.zeros(size)
        for j, v in peak.items():
            c[j] = v
        c[r0:r0 + nr] += 1e-9 * np.asarray(units.flops, dtype=float)  # ties: less compute
    integrality = np.zeros(size)
    integrality[:nr + nx] = 1
    bounds = Bounds(np.zeros(size), np.r_[np.ones(nr + nx), np.full(ns + 1, big)])
    with _quiet_fds():  # HiGHS prints progress lines straight to the terminal
        res = milp(c, integrality=integrality, bounds=bounds,
                   constraints=LinearConstraint(np.array(rows), lo, hi),
                   options={"time_limit": time_limit})
    if res.x is None:
        return None
    x = np.round(res.x).astype(int)
    return [bool(v) for v in x[r0:r0 + nr]], [bool(v) for v in x[x0:x0 + nx]], "milp"


@contextlib.contextmanager
def _quiet_fds():
    import os
    import sys

    saved = []
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            saved.append((fd, os.dup(fd)))
            os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        pass
    try:
        yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


def _greedy(units: Units, base: int, budget: int):
    """Everything recomputed with evenly spaced cuts (Chen's sqrt rule), then units kept
    back, cheapest bytes per FLOP saved first, while the model stays within the budget."""
    m = len(units.act)
    recompute = [True] * m
    best = None
    for q in range(1, m):
        every = max(1, m // (q + 1))
        keep_cut = [(k + 1) % every == 0 for k in range(m - 1)]
        peak = model_peak(units, base, recompute, keep_cut)
        if best is None or peak < best[0]:
            best = (peak, keep_cut)
        if peak <= budget:
            break
    keep_cut = best[1] if best else []
    order = sorted(range(m), key=lambda k: -units.flops[k] / max(units.act[k], 1))
    for k in order:
        recompute[k] = False
        if model_peak(units, base, recompute, keep_cut) > budget:
            recompute[k] = True
    return recompute, keep_cut, "scipy not installed or no answer in time"


def checkpoints_for(spine: Spine, units: Units, solution: BudgetSolution,
                    candidates: set[Tensor]) -> list[Tensor]:
    """Tensors to keep for a solution: the saved activations of kept units, and the
    tensors crossing every cut that starts a recomputed segment."""
    keep: list[Tensor] = []
    kept_units = {k for k, r in enumerate(solution.recompute) if not r}
    for s in spine.saved:
        p = spine.pos.get(s.tensor[0])
        if p is None:
            continue
        k = bisect_left(units.cuts, p)
        if k in kept_units:
            keep.append(s.tensor)
    cut_positions = [units.cuts[k] for k in range(len(units.cuts))
                     if solution.keep_cut[k] or (solution.recompute[k + 1]
                                                 and not solution.recompute[k])]
    keep.extend(t for t in spine.crossing(cut_positions) if t in candidates and t not in keep)
    return keep


def choose_budget_checkpoints(index: GraphIndex, regions, facts, candidates: list[Tensor],
                              batch_size: int | None, budget: int, original_peak: int,
                              time_limit: float = 20.0):
    """(CheckpointChoice, BudgetSolution) for a budget in bytes."""
    from graphmem.analysis.spine import analyze_spine
    from graphmem.passes.checkpoints import CheckpointChoice
    from graphmem.units import format_bytes

    cand = set(candidates)
    spine = analyze_spine(index, regions, facts, cand, batch_size)
    if not spine.order:
        return CheckpointChoice("budget", [], "no recomputable forward spine",
                                len(candidates)), None
    units = build_units(index, spine, batch_size)
    base = max(original_peak - sum(units.act), 0)
    sol = solve_budget(units, base, budget, time_limit)
    picks = sorted(checkpoints_for(spine, units, sol, cand),
                   key=lambda t: (index.position[t[0]], t[1]))
    recomputed = sum(sol.recompute)
    share = sol.extra_flops / sol.total_flops if sol.total_flops else 0.0
    note = (f"{sol.method}: {recomputed} of {len(units.act)} units recomputed "
            f"(+{share:.0%} forward FLOPs), modelled peak {format_bytes(sol.model_peak)} "
            f"for a budget of {format_bytes(budget)}")
    if not sol.feasible:
        note += (f"; the budget cannot be met: the smallest reachable peak is "
                 f"{format_bytes(sol.min_peak)}, {format_bytes(sol.min_peak - budget)} over")
    return CheckpointChoice("budget", picks, note, len(candidates)), sol


def parse_budget(text: str, original_peak: int) -> int:
    """'2GiB' -> bytes; '0.5' -> half the original estimated peak."""
    from graphmem.errors import UsageError
    from graphmem.units import parse_size

    try:
        value = float(text)
    except ValueError:
        return parse_size(text)
    if 0 < value <= 1:
        return int(math.floor(value * original_peak))
    if value > 1 and value.is_integer():
        return int(value)
    raise UsageError(f"--budget {text!r}: give a size (2GiB, 500MB) or a fraction of the "
                     "original peak in (0, 1]")
