"""Budget policy: the cheapest recompute plan whose estimated peak fits a memory budget.

The forward spine is condensed to a chain of units between candidate cuts (bottlenecks, or
the cheapest cut of each stretch where there are none). Each unit is either kept (its saved
activations stay, no extra compute) or recomputed (its forward ops run again in the backward
pass); a run of recomputed units is split into segments by cuts whose crossing tensors are
kept. The backward pass walks the chain from the top down, so the step's peak is modelled as
the most that is live at any unit on the way (`profile`):

    base + kept activations and cuts below the unit + its segment so far + its gradient,

where base is the estimated peak minus all saved activations. Minimising the recompute
FLOPs under `peak <= budget` is a small mixed-integer program (Checkmate, Jain et al. 2020,
restricted to a chain), solved with SciPy's HiGHS under a time limit on short chains, and
by a dynamic program over (boundary, kept bytes) on any chain (`_solve_dp`: long chains
are where HiGHS runs out of time); the cheaper plan is taken. When neither gives an answer,
a greedy plan over the same model is used.
"""

from __future__ import annotations

import contextlib
import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from graphmem.analysis.cost import op_flops
from graphmem.analysis.spine import Spine
from graphmem.errors import UsageError
from graphmem.graph.index import GraphIndex, Tensor
from graphmem.graph.names import copy_segment, is_copy
from graphmem.units import format_bytes, parse_size

if TYPE_CHECKING:
    from graphmem.analysis.memory import MemoryEstimate
    from graphmem.analysis.schedule import StepTimes
    from graphmem.passes.checkpoints import CheckpointChoice

MAX_UNITS = 400
# Up to this many units the MILP solves in well under a second; beyond it HiGHS often runs
# into its time limit (a uniform 40-unit chain takes ~20 s), so a dynamic program is used.
MILP_UNITS = 24
DP_BUCKETS = 1024  # memory resolution of the dynamic program (of the budget's headroom)


@dataclass
class Units:
    cuts: list[int]  # spine positions; unit k ends at cuts[k] (the last unit at the end)
    act: list[int]  # saved-activation bytes per unit
    flops: list[int]  # recompute cost per unit
    cut_bytes: list[int]  # bytes kept when cut k is a checkpoint
    # bytes the backward pass of unit k holds besides activations and the incoming
    # gradient: its largest weight's gradient, with the weight-decay term or update it
    # meets (a VGG's first fully connected layer: 2 x 392 MiB while the layer's gradient
    # is made, whatever is kept below it)
    transient: list[int] | None = None


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
    chosen: str = "budget"  # the plan written: the model's, or the memory or speed policy's


def build_units(index: GraphIndex, spine: Spine, batch_size: int | None,
                transients: bool = False) -> Units:
    """The chain of units; `transients`: model each unit's weight-gradient transient."""
    n = len(spine.order)
    cuts = sorted(spine.bottleneck_at)
    if n > 1:
        # few bottlenecks: the cheapest cut of each of 32 stretches; many, but a stretch
        # between two of them holding more than LARGE_UNIT of the activations (NASNet's
        # cells each read the two cells before: its bottlenecks are all in the stem and
        # the head, and one unit held every cell, so no plan could cut them): the same
        # inside that stretch
        step = max(1, n // 32)
        gaps = [(0, n - 1)] if len(cuts) < 8 else _large_gaps(spine, cuts)
        for start, end in gaps:
            for lo in range(start, end, step):
                hi = min(lo + step, end)
                cuts.append(min(range(lo, hi), key=spine.cut_bytes.__getitem__))
        cuts = sorted(set(cuts))
    if len(cuts) > MAX_UNITS:  # keep cuts spread evenly in bytes
        total = spine.total or 1
        marks = [spine.cumulative[c] for c in cuts]
        chosen = {cuts[min(bisect_left(marks, total * q / MAX_UNITS), len(cuts) - 1)]
                  for q in range(MAX_UNITS)}
        cuts = sorted(chosen)
    cuts = [c for c in cuts if c < n - 1]
    act, flops, transient = [], [], []
    start = 0
    for end in cuts + [n - 1]:
        act.append(sum(spine.weight[start:end + 1]))
        flops.append(sum(op_flops(index, spine.order[p], batch_size)
                         for p in range(start, end + 1)))
        transient.append(WEIGHT_GRADIENT_COPIES * max(
            (_weight_bytes(index, t, batch_size) for p in range(start, end + 1)
             for t in index.data_inputs[spine.order[p]]), default=0))
        start = end + 1
    return Units(cuts, act, flops, [spine.cut_bytes[c] for c in cuts],
                 transient if transients else None)


# A stretch of the chain between two bottlenecks holding more than this share of the
# activations is cut at its cheapest places too (build_units). Real CNNs' largest
# stretches hold 0.15-0.33 (tf-slim ResNet-50 v2, Inception v1, VGG-16, AlexNet v2, Keras
# ResNet50V2, MobileNet), whose plans it would move; Keras' NASNetMobile's held 0.98
LARGE_UNIT = 1 / 2


def _large_gaps(spine: Spine, cuts: list[int]) -> list[tuple[int, int]]:
    """The stretches [start, end) between consecutive bottleneck positions in `cuts` that
    hold more than LARGE_UNIT of the chain's activation bytes."""
    total = spine.total or 1
    out, start = [], 0
    for end in cuts + [len(spine.order) - 1]:
        held = spine.cumulative[end] - (spine.cumulative[start - 1] if start else 0)
        if held > LARGE_UNIT * total and end > start:
            out.append((start, end))
        start = end + 1
    return out


# A weight's gradient and the weight-decay term (or the optimizer's copy) it meets are live
# together while the layer's backward runs.
WEIGHT_GRADIENT_COPIES = 2


def _weight_bytes(index: GraphIndex, t: Tensor, batch_size: int | None) -> int:
    from graphmem.analysis.regions import is_parameter_read

    if not is_parameter_read(index, t[0]):
        return 0
    return index.tensor_bytes(t, batch_size) or 0


def grad_bytes(units: Units) -> list[int]:
    """Bytes the backward pass holds at each unit besides activations: the gradient flowing
    in (the tensors crossing the cut above it; nothing above the top unit but the loss)
    and the unit's weight-gradient transient."""
    grads = [*units.cut_bytes, 0][:len(units.act)]
    if units.transient:
        grads = [g + t for g, t in zip(grads, units.transient, strict=True)]
    return grads


def model_base(units: Units, peak_without_recompute: int) -> int:
    """The base that makes the model's plan without recompute peak where the estimate says
    the graph without recompute peaks: what the chain leaves out (gradients of weights,
    the loss's inputs, the optimizer) is whatever the chain does not explain."""
    everything_kept = model_peak(units, 0, [False] * len(units.act),
                                 [False] * max(len(units.act) - 1, 0))
    return max(peak_without_recompute - everything_kept, 0)


def model_peak(units: Units, base: int, recompute: list[bool], keep_cut: list[bool]) -> int:
    """The modelled peak of a plan: the largest of `profile`'s per-unit figures."""
    return max(profile(units, base, recompute, keep_cut), default=base)


def profile(units: Units, base: int, recompute: list[bool], keep_cut: list[bool]
            ) -> list[int]:
    """Bytes live while the backward pass is at each unit, top unit last.

    The backward pass walks the chain from the top down and frees what it has passed, so
    at unit k what is live is base, the kept activations and kept cuts *below* and at k,
    the gradient flowing in, and, for a recomputed unit, its segment's recomputed
    activations from the segment's start up to k (a segment is recomputed whole when the
    backward pass reaches its top). Keeping the top units therefore costs nothing more
    than recomputing them: they are live at the start of the backward pass either way,
    which a sum of everything kept (the earlier model) charged as extra."""
    grads = grad_bytes(units)
    out, below, segment = [], base, 0
    for k, a in enumerate(units.act):
        if k > 0 and keep_cut[k - 1]:
            below += units.cut_bytes[k - 1]
        if recompute[k]:
            starts = k == 0 or not recompute[k - 1] or keep_cut[k - 1]
            segment = a if starts else segment + a
            out.append(below + segment + grads[k])
        else:
            below += a
            segment = 0
            out.append(below + grads[k])
    return out


def solve_budget(units: Units, base: int, budget: int, time_limit: float = 20.0
                 ) -> BudgetSolution:
    total_flops = sum(units.flops)
    min_sol = _best(units, base, None, time_limit)
    min_peak = model_peak(units, base, *min_sol[:2]) if min_sol else \
        model_peak(units, base, [False] * len(units.act), [False] * max(len(units.act) - 1, 0))
    sol = _best(units, base, budget, time_limit) if min_peak <= budget else None
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


def _best(units: Units, base: int, budget: int | None, time_limit: float):
    """The dynamic program, and on short chains also the MILP: the better plan (fewer
    FLOPs, or with no budget a lower peak; ties go to the MILP). HiGHS is exact in theory
    but its tolerances sometimes leave a cheaper plan on the table, and beyond MILP_UNITS
    it rarely finishes within its time limit."""
    plans = []
    if len(units.act) <= MILP_UNITS:
        plans.append(_solve(units, base, budget, time_limit))
    plans.append(_solve_dp(units, base, budget, time_limit))
    plans = [p for p in plans if p is not None
             and (budget is None or model_peak(units, base, p[0], p[1]) <= budget)]
    if not plans:
        return None

    def key(plan):
        peak = model_peak(units, base, plan[0], plan[1])
        extra = sum(f for f, r in zip(units.flops, plan[0], strict=True) if r)
        return (peak, extra) if budget is None else (extra, peak)

    return min(plans, key=key)  # min keeps the first (the MILP's) on ties


def _solve(units: Units, base: int, budget: int | None, time_limit: float):
    """The MILP: minimise recompute FLOPs under the budget, or (budget None) minimise the
    modelled peak. One peak row per unit (see `profile`). Returns (recompute, keep_cut,
    "milp") or None. Exact; for small chains."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        return None
    m = len(units.act)  # units; cuts = m - 1
    nr, nx, ns = m, m - 1, m
    size = nr + nx + ns + 1  # r, x, s, P (the peak, when it is minimised)
    r0, x0, s0, pi = 0, nr, nr + nx, nr + nx + ns
    big = float(sum(units.act) + 1)
    grads = grad_bytes(units)
    rows, lo, hi = [], [], []

    def row(coefs: dict[int, float], low: float, high: float) -> None:
        v = np.zeros(size)
        for j, c in coefs.items():
            v[j] += c
        rows.append(v)
        lo.append(low)
        hi.append(high)

    inf = np.inf
    kept_so_far = 0.0  # activation bytes of units 0..k, all kept
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
        # live at unit k: base + sum_{j<=k} a_j (1 - r_j) + sum_{c<k} b_c x_c + s_k + g_k
        kept_so_far += a
        live = {r0 + j: -float(units.act[j]) for j in range(k + 1)}
        live.update({x0 + c: float(units.cut_bytes[c]) for c in range(k)})
        live[s0 + k] = 1.0
        constant = base + kept_so_far + grads[k]
        if budget is not None:
            row(live, -inf, float(budget - constant))
        else:
            live[pi] = -1.0
            row(live, -inf, -float(constant))
    c = np.zeros(size)
    if budget is not None:
        c[r0:r0 + nr] = units.flops
    else:  # minimise P; ties: less compute
        c[pi] = 1.0
        c[r0:r0 + nr] = 1e-9 * np.asarray(units.flops, dtype=float)
    integrality = np.zeros(size)
    integrality[:nr + nx] = 1
    top = float(base + sum(units.act) + sum(units.cut_bytes) + max(grads, default=0))
    bounds = Bounds(np.zeros(size), np.r_[np.ones(nr + nx), np.full(ns, big), top])
    with _quiet_fds():  # HiGHS prints progress lines straight to the terminal
        res = milp(c, integrality=integrality, bounds=bounds,
                   constraints=LinearConstraint(np.array(rows), lo, hi),
                   options={"time_limit": time_limit})
    if res.x is None:
        return None
    x = np.round(res.x).astype(int)
    return [bool(v) for v in x[r0:r0 + nr]], [bool(v) for v in x[x0:x0 + nx]], "milp"


def _solve_dp(units: Units, base: int, budget: int | None, time_limit: float = 20.0):
    """The same problem as `_solve` by dynamic programming, for long chains.

    A plan is a path over the unit boundaries 0..m: a kept unit k is an arc k -> k+1 that
    adds its activations to the bytes kept below; a recomputed segment k..j-1 is an arc
    k -> j that costs its FLOPs and adds the bytes of cut k-1 when k > 0. What is live at a
    unit (`profile`) depends only on the bytes kept below the arc and the arc itself, so
    each arc is checked where it is taken: a kept unit needs kept + a_k + g_k <= headroom,
    a segment needs kept + max over its units i of (a_k + ... + a_i + g_i) <= headroom
    (`reach`, the same for every path). Minimising FLOPs under a budget is a shortest path
    over (boundary, kept bytes in buckets of 1/DP_BUCKETS of the headroom); bytes are rounded
    to the nearest bucket, so each plan is checked with `model_peak` and made again under a
    lower headroom when rounding made it optimistic (and, when no rounded plan fits, the exact
check below gives one). The smallest peak (budget None) is
    found by bisection over exact feasibility checks, each a shortest path over kept bytes
    alone. Returns (recompute, keep_cut, "dp") or None."""
    import time

    import numpy as np

    m = len(units.act)
    if m == 0:
        return [], [], "dp"
    a = np.asarray(units.act, dtype=np.float64)
    f = np.asarray(units.flops, dtype=np.float64)
    b = np.r_[0.0, np.asarray(units.cut_bytes, dtype=np.float64)]  # b[k]: cut before unit k
    g = np.asarray(grad_bytes(units), dtype=np.float64)
    cum_a = np.r_[0.0, np.cumsum(a)]
    cum_f = np.r_[0.0, np.cumsum(f)]
    # reach[k, i]: the most a segment starting at unit k and ending at or after i adds
    # while the backward pass is inside it up to unit i (nondecreasing in i)
    reach = cum_a[None, 1:] - cum_a[:m, None] + g[None, :]
    reach[np.tril_indices(m, -1)] = -np.inf
    reach = np.maximum.accumulate(reach, axis=1)
    deadline = time.monotonic() + time_limit

    def decode(parent, last) -> tuple[list[bool], list[bool]]:
        """parent[j][c]: -1 (unit j-1 kept) or the segment's first unit; `last` the
        column at boundary m; kept bytes per step are undone with `step_bytes`."""
        recompute, keep_cut = [False] * m, [False] * (m - 1)
        j, col = m, last
        while j > 0:
            p = int(parent[j][col])
            if p < 0:  # unit j - 1 kept
                col -= step_kept[j - 1]
                j -= 1
                continue
            for k in range(p, j):
                recompute[k] = True
            if p > 0:
                keep_cut[p - 1] = True
                col -= step_cut[p]
            j = p
        return recompute, keep_cut

    def least_kept(peak: float):
        """A plan whose profile stays within `peak`, keeping the fewest bytes at every
        boundary (ties: fewer FLOPs); parent row per boundary, or None."""
        dist = np.full(m + 1, np.inf)
        cost = np.full(m + 1, np.inf)
        parent = np.full(m + 1, -2, dtype=np.int64)
        dist[0] = cost[0] = base
        cost[0] = 0.0
        for k in range(m):
            if dist[k] == np.inf:
                continue
            kept = dist[k] + a[k]
            if kept + g[k] <= peak and (kept, cost[k]) < (dist[k + 1], cost[k + 1]):
                dist[k + 1], cost[k + 1], parent[k + 1] = kept, cost[k], -1
            start = dist[k] + b[k]
            n = int(np.searchsorted(reach[k, k:], peak - start, side="right"))
            if n == 0:
                continue
            ends = np.arange(k + 1, k + n + 1)
            cc = cost[k] + cum_f[ends] - cum_f[k]
            better = (start < dist[ends]) | ((start == dist[ends]) & (cc < cost[ends]))
            dist[ends[better]] = start
            cost[ends[better]] = cc[better]
            parent[ends[better]] = k
        return parent if dist[m] < np.inf else None

    if budget is None:
        step_kept = [0] * m
        step_cut = [0] * (m + 1)
        lo = int(base + max(g.max(), 0))  # below this nothing fits
        hi = int(model_peak(units, base, [False] * m, [False] * (m - 1)))  # all kept
        while lo < hi:  # the smallest feasible peak, exactly (bytes are integers)
            mid = (lo + hi) // 2
            if least_kept(float(mid)) is None:
                lo = mid + 1
            else:
                hi = mid
        parent = least_kept(float(hi))
        return None if parent is None else (*decode(parent[:, None], 0), "dp")

    headroom = float(budget - base)
    if headroom <= 0:
        return None
    if model_peak(units, base, [False] * m, [False] * (m - 1)) <= budget:
        return [False] * m, [False] * (m - 1), "dp"  # everything kept fits: no recompute
    q = headroom / DP_BUCKETS
    step_kept = [int(round(v / q)) for v in units.act]
    step_cut = [int(round(v / q)) for v in b]

    def cheapest(room: float):
        """Fewest FLOPs with every unit's profile within `room` above base."""
        cap = int(math.floor(room / q + 1e-9))
        if cap < 0:
            return None
        cost = np.full((m + 1, cap + 1), np.inf)
        parent = np.full((m + 1, cap + 1), -2, dtype=np.int32)
        cost[0, 0] = 0.0
        cols = np.arange(cap + 1)
        for k in range(m):
            if time.monotonic() > deadline:
                return None
            row = cost[k]
            if not np.isfinite(row).any():
                continue
            s = step_kept[k]  # keep unit k: kept + a_k + g_k within room
            limit = min(cap, int(math.floor((room - g[k]) / q + 1e-9)))
            if s <= limit:
                target = cost[k + 1, s:limit + 1]
                src = row[:limit + 1 - s]
                better = src < target
                target[better] = src[better]
                parent[k + 1, s:limit + 1][better] = -1
            s = step_cut[k]  # recompute units k..j-1 from the cut before k
            n = int(np.searchsorted(reach[k, k:], room, side="right"))
            if n == 0 or s > cap:
                continue
            limits = np.floor((room - reach[k, k:k + n]) / q + 1e-9)  # per end, on kept
            block = row[None, :cap + 1 - s] + (cum_f[k + 1:k + n + 1] - cum_f[k])[:, None]
            block[cols[None, s:] > limits[:, None]] = np.inf
            target = cost[k + 1:k + n + 1, s:]
            better = block < target
            target[better] = block[better]
            parent[k + 1:k + n + 1, s:][better] = k
        final = cost[m]
        if not np.isfinite(final).any():
            return None
        return decode(parent, int(np.argmin(final)))  # ties: the fewest kept bytes

    room = headroom
    for _ in range(6):  # rounding may make a plan optimistic: retry with less room
        plan = cheapest(room)
        if plan is None:
            break
        over = model_peak(units, base, *plan) - budget
        if over <= 0:
            return (*plan, "dp")
        room -= max(q, over)
    # a budget within a few buckets of the lowest peak: the exact check still finds a plan
    # (the one keeping the fewest bytes, not always the cheapest)
    step_kept, step_cut = [0] * m, [0] * (m + 1)
    parent = least_kept(float(budget))
    return None if parent is None else (*decode(parent[:, None], 0), "dp")

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
                              time_limit: float = 20.0, transients: bool = False):
    """(CheckpointChoice, BudgetSolution) for a budget in bytes (`transients`: see
    build_units)."""
    from graphmem.analysis.spine import analyze_spine
    from graphmem.passes.checkpoints import CheckpointChoice
    cand = set(candidates)
    spine = analyze_spine(index, regions, facts, cand, batch_size)
    if not spine.order:
        return CheckpointChoice("budget", [], "no recomputable forward spine",
                                len(candidates)), None
    units = build_units(index, spine, batch_size, transients)
    base = model_base(units, original_peak)
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


# ---- the search: the model's plans applied and estimated -------------------------------
# A budget plan the estimate finds this far (a share of the budget) below what the model
# said is worth planning again with the model's error taken into account: a cheaper plan
# may fit.
MODEL_SLACK = 0.02
# Plans tried between a budget plan that fits and one that does not (each one more apply
# and estimate), and the model solves that may take to find them
BISECT_STEPS = 3
BISECT_PROBES = 8
# The memory policy writes the plan with the lowest estimated peak of those it tries; a plan
# within this share of that peak is as good (the estimate's own error is larger), and the one
# of them with the least recompute is written: never a plan another one beats on both. Not
# 3%: tf-slim VGG-16 at 224 px, batch 32, where TF runs oneDNN's kernels, has a plan
# estimated 2.6% under the one 3% wrote (1163 against 1194 MiB), and side by side it
# measured 0.40 | 0.35x the original's peak at 1 | 2 inter-op threads against 0.43 | 0.41x
# (docs/findings.md). At 2% the plan written changes on no other network of
# docs/benchmarks.md's summary but Keras' MobileNet (0.5% lower, 0.3% more recompute); at
# 1% it would change tf-slim ResNet-50 v1's and Keras' VGG16's for 1.4% lower estimates at
# 5-44% more recompute (benchmarks/memory_tolerance.py prints each network's picks).
MEMORY_TOLERANCE = 0.02
PARTIAL_LEAD_TRIES = 4  # rounds of segments taken out of a plan's lead (_partial_lead)
# a partial lead is a candidate when its modelled two-thread step is at least this much
# shorter than the plan's without leads: tf-slim ResNet-50 v2's, 2.3% shorter, measured
# no faster (1.26 against 1.21x the original's step, within the processes' spread) and
# Keras' ResNet50's, 5.6% shorter, measured 12% faster (1.14 against 1.30x)
PARTIAL_LEAD_MIN_GAIN = 0.03
LATE_COPY_TRIES = 8  # plans that may peak lowest with late copies, besides the chosen one
# The memory policy recomputes at most this share of the forward pass's FLOPs when any plan
# tried does (and the forward pass holds no loop or function call, whose FLOPs op_flops
# cannot count): step time grows with recompute (tf-slim ResNet-50 v1 at 224 px, batch 32,
# at 1 | 2 inter-op threads: the plan recomputing the whole forward pass measured 1.26 |
# 1.66x, one recomputing 54% of it 1.22 | 1.20x; docs/benchmarks.md), and the last few
# percent of memory are not worth that. `graphmem plan` shows the lower plans; `--budget`
# writes them. Not higher: Keras' ResNet50V2 at 224 px, batch 32, where TF runs Eigen's
# kernels, has its lowest plan at 80.1%, which measured 0.28 | 0.31x the original's peak
# at 1.15 | 1.47x its step time (the plan under the cap: 0.37 | 0.38x at 1.07 | 1.20x).
MEMORY_MAX_RECOMPUTE = 0.8
# ... unless the caps cost more than this share of the peak: the plans they leave out peak
# lower than every plan under them by more (highest estimated steps compared); then the
# FLOPs cap is lifted, and the step-time cap (MEMORY_MAX_STEP_TIME) stays while a plan
# meets it. Keras' ResNet50 as a TF2 train step at 224 px, batch 32: the cap left out the plan estimated
# 1103 MiB for one estimated 1485 MiB, and measured 0.45 | 0.46x at 1.15 | 1.06x step time
# against the plan left out, 0.35 | 0.35x at 1.18 | 1.24x. tf-slim ResNet-50 v1 keeps its
# cap (787 against 668 MiB: the plan left out measured 1.39x at two threads).
MEMORY_CAP_MAX_COST = 1.25
# ... and a plan modelled within this multiple of the original's step time at one and at
# two inter-op threads (issue 21's limit) is not held to the FLOPs cap at all: the cap
# stands in for step time, which the model then says is met. Keras' ResNet50V2 at 224 px,
# batch 32, where TF runs oneDNN's kernels: the budget model's plan recomputing 80.1% of
# the forward FLOPs, three segments not leading, late copies, modelled 1.26 | 1.33x,
# measured 0.29 | 0.31x the original's peak at 1.20 | 1.26x its step time, where the
# plan under the cap (43%) measured 0.35 | 0.36x at 1.10 | 1.22x (docs/findings.md). The
# model has not been found to put a plan's step under what it measured by more than a
# few percent (its errors, in "The modelled step-time cap", are on the safe side).
MEMORY_TARGET_STEP_TIME = 1.35
# Below the cap, recompute beyond MEMORY_FREE_RECOMPUTE of the forward pass's FLOPs must
# pay for itself: of the plans tried, the memory policy writes one with less recompute than
# its lowest when the peak it gives up, as a share of the lower plan's, is less than
# MEMORY_RECOMPUTE_WEIGHT times the share of the forward FLOPs above that level it no
# longer recomputes. Two inter-op threads pay for recompute nearly twice (each segment,
# recomputed just before its own gradient ops, runs alone, while the original runs its
# filter and input gradients side by side): tf-slim ResNet-50 v2 at 224 px, batch 32,
# measured side by side at 1 | 2 threads, the plan recomputing 77% of the forward FLOPs
# (estimated 570 MiB) 0.26 | 0.26x of the original's peak at 1.26 | 1.43x its step time,
# the one recomputing 61% (600 MiB) 0.29 | 0.27x at 1.24 | 1.31x. Keras' ResNet50V2 at 224
# px, batch 32, where TF runs Eigen's kernels: the plan recomputing 79% (estimated 736 MiB
# over the replay with the variables in place) 0.30 | 0.33x at 1.20 | 1.41x (the round
# no other job overlapped; docs/findings.md), the one
# recomputing 43% (825 MiB) 0.37 | 0.38x at 1.07 | 1.20x. The weight trades both plans
# measured above 1.35x at two threads for the cheaper ones (it must be above 0.64 for
# ResNet50V2's), keeps Keras' ResNet50's whole-forward plan (measured 0.35 | 0.35x at 1.18
# | 1.24x, its cheaper plans 1.3x its peak), and keeps tf-slim Inception v1's and v2's
# plans recomputing 72% and 75% (estimated 4% and 6% under the 66% ones), which measured
# 0.31 | 0.30x at 1.21 | 1.18x and 0.29 | 0.28x at 1.26 | 1.21x where TF runs oneDNN's
# kernels, against 0.33 | 0.34x (another run: 0.37 | 0.34x, above OpenAI's 0.36x at one
# thread) and 0.31 | 0.31x for the 66% plans (docs/findings.md, "Inception's plans above
# 60% of the forward pass"). Plans under the level keep the lowest peak (AlexNet's and
# VGG's step times grow little with recompute). The weight was 0.65 until the step-time
# cap took the plans measured above 1.35x out (both are modelled above 1.4x); it must be
# above 0.35 to keep tf-slim Inception v3's 72% plan (859 MiB) over its 82% one (830 MiB)
# and below 0.56 to write Keras' ResNet50V2's 80% plan (MEMORY_TARGET_STEP_TIME) for the
# 10% of peak it saves (estimates of the plans `graphmem rewrite` tries, read with a
# scratch script that logged them: docs/findings.md, "Plans on target above the FLOPs
# cap, and partial leads above a slow plan").
MEMORY_FREE_RECOMPUTE = 0.6
MEMORY_RECOMPUTE_WEIGHT = 0.45
# The memory policy leaves out plans whose modelled step time (analysis/schedule.py: the
# ops' times added up for one inter-op thread, the two-thread walk's length for two) is
# above this multiple of the original's, when any plan tried is not. FLOPs alone miss what
# two threads lose: a segment recomputed just before its own gradient ops runs alone, on
# the step's critical path, where the original runs a filter gradient beside its input
# gradient. Measured side by side (docs/findings.md, "The modelled step-time
# cap"), where TF runs Eigen's kernels, at batch 8: Keras' VGG16 planned at batch 32,
# the plan recomputing block 1 twice, each segment just before its gradient ops, modelled
# 1.17 | 1.48x at 1 | 2 threads, measured 1.12 | 1.50x; the plan this cap writes instead
# modelled 1.05 | 1.14x, measured 1.00 | 1.24x. The model is rough: tf-slim VGG-16's
# plan of the same kind is modelled 1.18 | 1.38x and measured 1.18x at two threads (the
# original's two-thread gain, which the model counts in full, is smaller there), so the
# cap sits above issue 21's 1.35x, where it leaves out what measured 1.5x and keeps that.
MEMORY_MAX_STEP_TIME = 1.4
# Budget-model plans the memory policy tries above the model's lowest peak (as shares of
# it): cheaper plans that may peak about as low once applied and estimated.
MEMORY_PROBES = (1.1, 1.25)


@dataclass
class BudgetCandidate:
    """One candidate plan of the budget policy, applied and estimated."""

    policy: str  # "budget" (the model's), "memory", "speed" or "memory_top"
    choice: CheckpointChoice
    applied: object  # what the runner's `apply` returned for it
    after: MemoryEstimate
    extra_flops: int  # FLOPs of the ops it copies
    solution: BudgetSolution | None = None  # the budget model's, for its own plans
    # a partial lead estimated above the same plan without leads: that plan (_partial_lead);
    # the memory policy takes such a lead only where that plan's step is too slow
    unled_below: BudgetCandidate | None = None


class PlanRunner(Protocol):
    """The rewrite as the search sees it: a black box that applies a checkpoint choice
    (every pass of the pipeline), measures the result, and undoes it."""

    def apply(self, choice: CheckpointChoice) -> object:
        """Rewrite the workspace for `choice`; returns what `measure` reads."""

    def measure(self, applied: object) -> tuple[MemoryEstimate, int]:
        """(estimate, FLOPs of the copies) of the graph as `apply` left it."""

    def restore(self) -> None:
        """Put the original graph back."""

    def held_ahead(self, applied: object) -> bool:
        """Did the rewrite `apply` returned hold a segment back one segment ahead?"""

    def ran_weight_grads_first(self, applied: object) -> bool:
        """Did the rewrite `apply` returned order a weight gradient before the input
        gradient beside it (recompute.py, _readers_first)?"""


def search_budget(index: GraphIndex, regions, facts, batch_size: int | None, budget: int,
                  base_peak: int, runner: PlanRunner, search_model: bool = True
                  ) -> tuple[BudgetCandidate, BudgetSolution | None]:
    """The plan with the least recompute whose *estimated* peak fits the budget, or the
    lowest one. The budget model is a chain and errs both ways: each of its plans is
    applied and estimated, and the error learned corrects the next attempt's budget (up
    when the model was pessimistic, down when optimistic). Plans of the memory and speed
    policies are candidates too, and the memory policy's with its top segment kept
    (`keep_top_segment`); when no plan fits, so is the model's lowest. Last, the model's
    budget is bisected between the plans that fit and those that do not. Leaves the chosen
    plan applied (`BudgetCandidate.applied`). `search_model`: the memory policy's candidates
    include the model's lowest plans (see memory_candidates)."""
    from graphmem.passes.checkpoints import candidate_tensors, choose_checkpoints

    runs: list[BudgetCandidate] = []
    tried: dict[tuple[bool, ...], bool] = {}  # plan (units recomputed) -> fits the budget
    probes: list[tuple[int, bool]] = []  # (budget the model planned for, its plan fits)

    def candidate(policy: str, choice: CheckpointChoice,
                  sol: BudgetSolution | None = None) -> BudgetCandidate:
        run = _try(runner, policy, choice, sol)
        runs.append(run)
        return run

    def attempt(model_budget: int) -> BudgetSolution | None:
        """Plan for `model_budget` with the model, apply and estimate the plan (once per
        distinct plan); returns the model's solution."""
        choice, sol = choose_budget_checkpoints(
            index, regions, facts, candidate_tensors(index, regions, facts),
            batch_size, model_budget, base_peak)
        key = tuple(sol.recompute) if sol is not None else None
        if key in tried:
            probes.append((model_budget, tried[key]))
            return sol  # a plan already estimated
        run = candidate("budget", choice, sol)
        if key is not None:
            tried[key] = run.after.estimated_bytes <= budget
            probes.append((model_budget, tried[key]))
        return sol

    correction = 0
    for _attempt in range(4):
        known = len(runs)
        solution = attempt(budget - correction)
        if solution is None or len(runs) == known:
            break  # no spine to plan on, or corrected to a plan already estimated
        after = runs[-1].after
        error = after.peak_bytes - solution.model_peak
        fits = after.estimated_bytes <= budget
        if fits and error >= -MODEL_SLACK * budget:
            break  # the model was right here: a cheaper plan would not fit
        if not fits and not solution.feasible:
            break  # the model's lowest plan is over already
        correction = error
    if solution is not None and not any(fits for _, fits in probes):
        # the corrections can stop short of the model's lowest plan, which is what
        # `graphmem plan` offers as the bottom of its curve (planned for a budget of its
        # peak: below it the model returns another plan of that peak): a candidate too
        attempt(solution.min_peak)
    new_plans = len(runs) + BISECT_STEPS
    for _probe in range(BISECT_PROBES):
        # one correction can overshoot: the model's error differs from plan to plan. Between
        # the largest model budget whose plan fits and the smallest above it whose plan
        # does not, a cheaper plan that fits may lie (a probe may land on a plan already
        # estimated: it narrows the interval all the same)
        fit = [b for b, fits in probes if fits]
        over = [b for b, fits in probes if not fits and fit and b > max(fit)]
        if not over or min(over) - max(fit) <= MODEL_SLACK * budget or \
                len(runs) >= new_plans:
            break
        attempt((max(fit) + min(over)) // 2)
    # the memory policy's candidates (its heuristic's plans, and the model's lowest ones,
    # when it searches) and the speed policy's
    memory_runs = memory_candidates(index, regions, facts, batch_size, base_peak, runner,
                                    search_model)
    runs.extend(memory_runs)
    candidate("speed", choose_checkpoints("speed", index, regions, facts, batch_size))
    # the memory policy's own pick, as it makes it (a budget at the memory policy's peak
    # can be met at no more recompute), and the lowest plan with late copies, unless the
    # pick already tried that one
    pick = _memory_pick(index, regions, batch_size, memory_runs, runner)
    runs.extend(r for r in pick.runs if r not in runs)
    lowest = min(runs, key=lambda r: r.after.peak_bytes)
    if lowest is not pick.late_base and not lowest.choice.late_copies:
        late = _with_late_copies(lowest, runner)
        if late is not None:
            runs.append(late)
    fitting = [r for r in runs if r.after.estimated_bytes <= budget]
    best = min(fitting, key=lambda r: r.extra_flops) if fitting else \
        min(runs, key=lambda r: r.after.peak_bytes)
    best.applied = runner.apply(best.choice)
    model_runs = [r for r in runs if r.solution is not None]
    solution = best.solution or (model_runs[-1].solution if model_runs else None)
    if solution is not None:
        model_run = next((r for r in model_runs if r.after.estimated_bytes <= budget),
                         model_runs[-1] if model_runs else best)
        best.choice.policy = "budget"
        best.choice.note = _budget_note(solution, budget, best.after.peak_bytes, best.policy,
                                        model_run, best)
        solution.chosen, solution.extra_flops = best.policy, best.extra_flops
    return best, solution


def search_memory(index: GraphIndex, regions, facts, batch_size: int | None,
                  base_peak: int | None, runner: PlanRunner,
                  base_times: Callable[[], StepTimes | None] | None = None
                  ) -> BudgetCandidate:
    """The memory policy: the plan with the lowest estimated peak among memory_candidates
    that recompute at most MEMORY_MAX_RECOMPUTE of the forward FLOPs or are modelled within
    MEMORY_TARGET_STEP_TIME of the original's step time (all of them when none does: the
    cheapest; every plan when those peak above MEMORY_CAP_MAX_COST times the lowest plan's
    highest estimated step); among the plans within MEMORY_TOLERANCE of it,
    the one with the least recompute (so no plan tried beats it on both); and a plan with
    less recompute still where its recompute above MEMORY_FREE_RECOMPUTE is worth more than
    the peak it gives up (MEMORY_RECOMPUTE_WEIGHT). Plans whose modelled step time is above
    MEMORY_MAX_STEP_TIME times the original's (`base_times()`, called once the candidates
    are estimated) count as over the cap too. Leaves it applied."""
    runs = memory_candidates(index, regions, facts, batch_size, base_peak, runner, True)
    pick = _memory_pick(index, regions, batch_size, runs, runner,
                        base_times() if base_times is not None else None)
    best, runs = pick.best, pick.runs
    best.applied = runner.apply(best.choice)
    how = {"memory": "the bottleneck heuristic's plan",
           "memory_top": "the bottleneck heuristic's plan with its top segment kept",
           "budget": "the budget model's plan"}[best.policy]
    if not best.choice.lead:
        how += ", each segment recomputed just before its own gradient ops"
    elif best.choice.unled:
        n = len(best.choice.unled)
        how += (f", {n} segment{'s' if n > 1 else ''} recomputed just before "
                f"{'their' if n > 1 else 'its'} own gradient ops and the others one segment "
                "ahead")
    if best.choice.late_copies:
        how += ", cheap first layers recomputed a second time for their own gradient ops"
    traded = pick.traded
    if traded is None:
        note = (f"{how}: the lowest estimated peak ({format_bytes(best.after.peak_bytes)}) "
                f"of {len(runs)} plans tried, with the least recompute within "
                f"{MEMORY_TOLERANCE:.0%} of it")
    else:
        note = (f"{how}: estimated {format_bytes(best.after.peak_bytes)}, of {len(runs)} "
                f"plans tried; the plan estimated {format_bytes(traded.after.peak_bytes)} "
                f"left out: it recomputes {traded.extra_flops / pick.forward:.0%} of the "
                f"forward pass's FLOPs against {best.extra_flops / pick.forward:.0%}, and "
                f"recompute above {MEMORY_FREE_RECOMPUTE:.0%} of them costs more step time "
                "than that peak is worth")
    if pick.lifted:
        note += (f"; it recomputes more than {MEMORY_MAX_RECOMPUTE:.0%} of the forward "
                 "pass's FLOPs: every plan tried under that share peaks more than "
                 f"{MEMORY_CAP_MAX_COST - 1:.0%} higher")
    if pick.on_target:
        note += (f"; it recomputes more than {MEMORY_MAX_RECOMPUTE:.0%} of the forward "
                 f"pass's FLOPs, and is modelled within {MEMORY_TARGET_STEP_TIME}x the "
                 "original's step time at one and two inter-op threads")
    if pick.capped:
        note += (f"; plans recomputing more than {MEMORY_MAX_RECOMPUTE:.0%} of the forward "
                 "pass's FLOPs left out (a lower peak at a slower step: `graphmem plan` "
                 "shows it, --budget writes it)")
    if pick.slowed:
        note += (f"; plans whose modelled step time is above {MEMORY_MAX_STEP_TIME}x the "
                 "original's at one or two inter-op threads left out (a lower peak at a "
                 "slower step: --budget writes them)")
    best.choice = replace(best.choice, policy="memory", note=note)
    return best


@dataclass
class MemoryPick:
    """The memory policy's choice among its candidate plans."""

    best: BudgetCandidate
    runs: list[BudgetCandidate]  # the candidates, with the late-copies variant tried
    capped: bool  # the recompute cap left out a plan that peaks lower
    late_base: BudgetCandidate  # the plan whose late-copies variant was tried
    # the lower plan left out for `best`: its recompute above MEMORY_FREE_RECOMPUTE of the
    # forward FLOPs was worth less than the peak it saves (None when none was)
    traded: BudgetCandidate | None = None
    forward: int | None = None  # the forward pass's FLOPs, when known
    # the step-time cap left out a plan that peaks lower (MEMORY_MAX_STEP_TIME)
    slowed: bool = False
    # the FLOPs cap was lifted (every plan under it peaks more than MEMORY_CAP_MAX_COST
    # times the lowest) and the plan written recomputes more than it allows
    lifted: bool = False
    # the plan written recomputes more than the FLOPs cap allows, and is modelled within
    # MEMORY_TARGET_STEP_TIME of the original's step time
    on_target: bool = False


def _memory_pick(index: GraphIndex, regions, batch_size: int | None,
                 runs: list[BudgetCandidate], runner: PlanRunner,
                 base_times: StepTimes | None = None) -> MemoryPick:
    """The memory policy's choice among its candidate `runs` (see search_memory); its
    late-copies variant is applied and estimated here. `base_times`: the original's
    modelled step times (None: no step-time cap)."""
    from graphmem.analysis.cost import forward_flops

    forward = forward_flops(index, regions, batch_size)
    # a partial lead estimated above its plan without leads only where that plan is too
    # slow to be written: elsewhere the plan without leads is as fast as need be and lower
    runs = [r for r in runs
            if r.unled_below is None or _too_slow(r.unled_below, base_times)]
    cap = math.inf if forward is None else MEMORY_MAX_RECOMPUTE * forward

    def capped_out(r: BudgetCandidate) -> bool:  # over the FLOPs cap, and not on target
        return r.extra_flops > cap and not _on_target(r, base_times)

    within = [r for r in runs if not capped_out(r)] or \
        [min(runs, key=lambda r: r.extra_flops)]
    fast_runs = [r for r in runs if not _too_slow(r, base_times)]
    timed = bool(fast_runs)  # no plan is fast enough: the time cap is not met, not kept

    def fast(r: BudgetCandidate) -> bool:
        return not timed or not _too_slow(r, base_times)

    affordable = [r for r in within if fast(r)] or within
    if min(r.after.estimated_bytes for r in affordable) > \
            MEMORY_CAP_MAX_COST * min(r.after.estimated_bytes for r in runs):
        # the caps cost far more than a few percent: the FLOPs cap is lifted, the step-time
        # cap stays while a plan meets it (Keras' ResNet50V2, where TF runs oneDNN's
        # kernels: with both lifted, its plan modelled 1.49x at two threads measured
        # 1.38x; see MEMORY_MAX_STEP_TIME)
        affordable, cap = fast_runs or runs, math.inf
    base = _least_recompute_lowest(affordable)
    # late copies of the chosen plan and of the LATE_COPY_TRIES plans that could peak
    # lowest with them: late copies free recomputed copies alone, so a plan whose peak less
    # the copies live there is not below the lowest peak cannot become the lowest (Keras'
    # NASNetMobile and DenseNet169: their heuristic plans' late copies were tried for
    # minutes and peaked 1.6-6x the lowest). A plan's first layers may be what its late
    # copies cut (Keras' VGG16 at 224 px, once fc1's weight gradient runs late: the third
    # lowest plan peaks at block1's copies, 1451 MiB estimated, and its late copies take
    # that peak away, 1111 MiB estimated; Keras' VGG19 with pooling gradients first: the
    # late copies of the fourth lowest plan, which recomputes block 1, peak lowest of all,
    # 1072 MiB against 1339 MiB for the lowest plan without them)
    lowest = min(r.after.peak_bytes for r in affordable)
    hopeful = sorted((r for r in affordable if _without_copies_at_peak(r) < lowest),
                     key=lambda r: (_without_copies_at_peak(r), r.extra_flops))
    tried: list[BudgetCandidate] = []
    for plan in [base, *hopeful[:LATE_COPY_TRIES]]:
        if any(plan is t for t in tried):
            continue
        tried.append(plan)
        late = _with_late_copies(plan, runner)
        if late is None:
            continue
        runs = [*runs, late]
        if not capped_out(late) and fast(late):
            affordable = [*affordable, late]
    # the same rule over the plans with late copies too, so that a late variant is written
    # only where it is the lowest (and then, of the plans within the tolerance, the one
    # with the least recompute)
    best = _least_recompute_lowest(affordable)
    traded = None
    if forward:
        # a plan with less recompute, where the peak it gives up is worth less than the
        # recompute above MEMORY_FREE_RECOMPUTE it saves
        low = best

        def worth(r: BudgetCandidate) -> float:
            above = max(0.0, r.extra_flops / forward - MEMORY_FREE_RECOMPUTE)
            return r.after.peak_bytes / low.after.peak_bytes + MEMORY_RECOMPUTE_WEIGHT * above

        cheaper = min((r for r in runs if r.extra_flops < low.extra_flops and fast(r)),
                      key=worth, default=low)
        if worth(cheaper) < worth(low):
            best, traded = cheaper, low
    # which cap left out a plan that peaks lower than the one written: the FLOPs one or
    # the step-time one
    lower = [r for r in runs if r.after.peak_bytes < best.after.peak_bytes]
    capped = any(capped_out(r) for r in lower)
    slowed = any(not capped_out(r) and not fast(r) for r in lower)
    lifted = forward is not None and math.isinf(cap) and \
        best.extra_flops > MEMORY_MAX_RECOMPUTE * forward
    on_target = best.extra_flops > cap and _on_target(best, base_times)
    return MemoryPick(best, runs, capped, base, traded, forward if traded else None, slowed,
                      lifted, on_target)


def _too_slow(run: BudgetCandidate, base: StepTimes | None) -> bool:
    """Is a plan's modelled step time above MEMORY_MAX_STEP_TIME times the original's, at
    one or at two inter-op threads? Never without the original's times or the plan's (a
    step with v1 loops or too many ops is not walked on two threads)."""
    ratio = _slower_step_ratio(run, base)
    return ratio is not None and ratio > MEMORY_MAX_STEP_TIME


def _on_target(run: BudgetCandidate, base: StepTimes | None) -> bool:
    """Is a plan's modelled step time within MEMORY_TARGET_STEP_TIME times the original's
    at one and at two inter-op threads? False when either is not modelled."""
    ratio = _slower_step_ratio(run, base)
    return ratio is not None and ratio <= MEMORY_TARGET_STEP_TIME


def _slower_step_ratio(run: BudgetCandidate, base: StepTimes | None) -> float | None:
    """A plan's modelled step time over the original's at one or two inter-op threads,
    whichever is higher; None when either step is not modelled."""
    times = run.after.step_times
    return None if base is None or times is None else max(times.ratio(base))


def _least_recompute_lowest(runs: list[BudgetCandidate]) -> BudgetCandidate:
    """Of the plans within MEMORY_TOLERANCE of the lowest estimated peak, the one with the
    least recompute, then one whose segments lead (faster with several inter-op threads),
    then the lower peak."""
    lowest = min(r.after.peak_bytes for r in runs)
    return min((r for r in runs if r.after.peak_bytes <= lowest * (1 + MEMORY_TOLERANCE)),
               key=lambda r: (r.extra_flops, not r.choice.lead, r.after.peak_bytes))


def _without_copies_at_peak(run: BudgetCandidate) -> int:
    """The plan's estimated peak less the recomputed copies among the largest buffers live
    there: the most its late copies could lower it to."""
    return run.after.peak_bytes - sum(t.bytes for t in run.after.live_at_peak
                                      if is_copy(t.name.rsplit(":", 1)[0]))


def _try(runner: PlanRunner, policy: str, choice: CheckpointChoice,
         solution: BudgetSolution | None = None) -> BudgetCandidate:
    """One plan applied, estimated and undone."""
    applied = runner.apply(choice)
    after, flops = runner.measure(applied)
    runner.restore()
    return BudgetCandidate(policy, choice, applied, after, flops, solution)


def _partial_lead(runner: PlanRunner, led: BudgetCandidate,
                  unled: BudgetCandidate) -> BudgetCandidate | None:
    """`led` (a plan whose segments lead) with the lead taken from the segments whose
    copies are live at its estimated peak, applied, estimated and undone: the first round
    that brings its peak down to `unled`'s (the plan without any lead) while some segment
    still leads, when its modelled two-thread step is shorter than `unled`'s by
    PARTIAL_LEAD_MIN_GAIN; where no round gets that low, the lowest round that is that
    much faster, with `unled_below` set. None when the lead costs no peak (`unled` is not
    lower by more than MEMORY_TOLERANCE: `led` is kept as it is), when even `led` is not
    that much faster (nothing tried), and when no round is.

    A lead holds a segment's copies through the next segment's gradient ops; on a CNN
    whose first layers are large that raises the peak, where the deep segments' leads
    cost nothing (their copies are small), and the leads are what lets a second inter-op
    thread recompute beside the gradient ops (Keras' ResNet50 at 224 px, batch 32, where
    TF runs oneDNN's kernels: the same plan without leads measured 1.30x the original's
    step time at two threads, with the deep segments leading 1.14x, at the same peak).
    A round above `unled`'s peak is only worth it where `unled` is too slow to be written
    (_memory_pick): tf-slim ResNet-50 v1's partial lead, estimated 1.6% above its plan
    without leads, measured 5% above it; Keras' ResNet50V2's +80% plan, modelled 1.42x
    at two threads without leads, 1.33x with three segments not leading, measured 0.29 |
    0.31x the original's peak at 1.20 | 1.26x its step time (docs/findings.md). Up to
    PARTIAL_LEAD_TRIES rounds: the segments live at each round's peak stop leading."""
    if led.after.peak_bytes <= unled.after.peak_bytes * (1 + MEMORY_TOLERANCE) or \
            not _faster_at_two_threads(led, unled):  # no partial lead is faster than `led`
        return None
    waiting: set[int] = set()
    run, above = led, None
    for _ in range(PARTIAL_LEAD_TRIES):
        at_peak = {copy_segment(t.name) for t in run.after.live_at_peak} - {None} - waiting
        if not at_peak:
            break
        waiting |= at_peak
        run = _try(runner, led.policy, replace(led.choice, unled=tuple(sorted(waiting))),
                   led.solution)
        if not runner.held_ahead(run.applied):
            break
        faster = _faster_at_two_threads(run, unled)
        if run.after.peak_bytes <= unled.after.peak_bytes:
            return run if faster else above
        if faster and (above is None or run.after.peak_bytes < above.after.peak_bytes):
            run.unled_below, above = unled, run
    return above


def _faster_at_two_threads(run: BudgetCandidate, other: BudgetCandidate) -> bool:
    """Is `run`'s modelled two-thread step at least PARTIAL_LEAD_MIN_GAIN shorter than
    `other`'s? False when either is not modelled."""
    mine, theirs = run.after.step_times, other.after.step_times
    return mine is not None and theirs is not None and \
        mine.two_threads <= (1 - PARTIAL_LEAD_MIN_GAIN) * theirs.two_threads


def _with_late_copies(best: BudgetCandidate, runner: PlanRunner) -> BudgetCandidate | None:
    """`best` with late copies (recompute.py, _late_targets), applied, estimated and undone;
    None when the plan has no target to copy twice (no extra FLOPs). Tried with weight
    gradients run first (_readers_first) and, where that added a copy, without: the lower
    estimate is returned. The ordering is not always better: where the input gradient it
    delays holds other values back (tf-slim ResNet-50 v2 at 224 px, batch 32: estimated
    571 MiB without, 605 MiB with), TF's own order does better."""
    late = _try(runner, best.policy, replace(best.choice, late_copies=True), best.solution)
    if late.extra_flops == best.extra_flops:
        return None
    if runner.ran_weight_grads_first(late.applied):
        plain = _try(runner, best.policy,
                     replace(best.choice, late_copies=True, weight_grads_first=False),
                     best.solution)
        if plain.after.peak_bytes <= late.after.peak_bytes:
            late = plain
    late.unled_below = best.unled_below  # the same plan's variant: the same plan below it
    return late


def memory_candidates(index: GraphIndex, regions, facts, batch_size: int | None,
                      base_peak: int | None, runner: PlanRunner,
                      search_model: bool) -> list[BudgetCandidate]:
    """The memory policy's candidate plans, each applied, estimated and undone: the
    bottleneck heuristic's (about sqrt(N) bottlenecks spaced by bytes, and the same with its
    top segment kept) and, with `search_model`, the budget model's lowest plans (every unit
    recomputed with the best cuts kept, and the cheapest plans modelled MEMORY_PROBES above
    that), with and without the units' weight-gradient transients in the model. All are
    estimated: the heuristic spaces cuts by bytes alone and keeps adjacent tensors; the
    model is a chain and errs both ways. `base_peak`: the model's base (the peak with early
    updates alone), None for the heuristic's estimate."""
    from graphmem.passes.checkpoints import (
        candidate_tensors,
        choose_checkpoints,
        keep_top_segment,
    )

    runs: list[BudgetCandidate] = []
    candidates = candidate_tensors(index, regions, facts)

    def run(policy: str, choice: CheckpointChoice, solution=None) -> None:
        # each plan as the recompute pass lays it out by default (segments held back one
        # segment ahead) and, when that held any segment ahead, with every segment waiting
        # for its own readers: on CNNs whose first layers are large, a lead keeps a large
        # segment's copies alive through the next segment's gradient ops (tf-slim ResNets
        # and Inceptions at 224-299 px: estimated peaks 20-30% lower without)
        runs.append(_try(runner, policy, choice, solution))
        if runner.held_ahead(runs[-1].applied):
            led = runs[-1]
            runs.append(_try(runner, policy, replace(choice, lead=False), solution))
            partial = _partial_lead(runner, led, runs[-1])
            if partial is not None:
                runs.append(partial)

    heuristic = choose_checkpoints("memory", index, regions, facts, batch_size)
    run("memory", heuristic)
    top = replace(heuristic, tensors=keep_top_segment(index, regions, heuristic.tensors,
                                                      candidates))
    if top.tensors != heuristic.tensors:
        run("memory_top", top)
    if not search_model:
        return runs
    if base_peak is None:
        base_peak = runs[0].after.peak_bytes
    seen: set[tuple[bool, ...]] = set()
    for transients in (True, False):  # with each unit's weight-gradient transient or not
        choice, solution = choose_budget_checkpoints(index, regions, facts, candidates,
                                                     batch_size, 0, base_peak,
                                                     transients=transients)
        if solution is None:
            return runs
        floor = solution.min_peak
        for share in (1.0, *MEMORY_PROBES):
            choice, solution = choose_budget_checkpoints(
                index, regions, facts, candidates, batch_size, int(floor * share), base_peak,
                transients=transients)
            key = tuple(solution.recompute) + tuple(solution.keep_cut)
            if key not in seen and choice.tensors:
                seen.add(key)
                run("budget", choice, solution)
    return runs


def _budget_note(solution: BudgetSolution, budget: int, estimated: int, policy: str,
                 model_run: BudgetCandidate, best: BudgetCandidate) -> str:
    total = solution.total_flops or 1
    solution.feasible = estimated <= budget  # the estimate decides, not the model
    plan = {"memory_top": "the memory policy's plan with its top segment kept"}.get(
        policy, f"the {policy} policy's plan")
    if estimated > budget:
        return (f"the budget of {format_bytes(budget)} cannot be met: the lowest plan found "
                f"({solution.method if policy == 'budget' else plan}) "
                f"reaches {format_bytes(estimated)}, {format_bytes(estimated - budget)} over")
    if policy != "budget":
        model = ("did not fit" if model_run.after.estimated_bytes > budget else
                 f"+{model_run.extra_flops / total:.0%} forward FLOPs")
        return (f"{plan} (+{best.extra_flops / total:.0%} forward FLOPs) "
                f"fits the budget of {format_bytes(budget)} with the least recompute (the "
                f"budget model's plan: {model})")
    return (f"{solution.method}: {sum(solution.recompute)} of {len(solution.recompute)} "
            f"units recomputed (+{best.extra_flops / total:.0%} forward FLOPs) for a budget of "
            f"{format_bytes(budget)}")
