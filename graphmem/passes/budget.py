"""Budget policy: the cheapest recompute plan whose estimated peak fits a memory budget.

The forward spine is condensed to a chain of units between candidate cuts (bottlenecks, or
the cheapest cut of each stretch where there are none). Each unit is either kept (its saved
activations stay, no extra compute) or recomputed (its forward ops run again in the backward
pass); a run of recomputed units is split into segments by cuts whose crossing tensors are
kept. The step's peak is modelled as

    base + kept activations + kept cut tensors + the largest recomputed segment,

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
from dataclasses import dataclass

from graphmem.analysis.cost import op_flops
from graphmem.analysis.spine import Spine
from graphmem.graph.index import GraphIndex, Tensor

MAX_UNITS = 400
# Up to this many units the MILP solves in well under a second; beyond it HiGHS often runs
# into its time limit (a uniform 40-unit chain takes ~20 s), so a dynamic program is used.
MILP_UNITS = 24
DP_BUCKETS = 1024  # memory resolution of the dynamic program (of the budget's headroom)
DP_GRID = 12  # segment bounds tried per refinement level


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
    chosen: str = "budget"  # the plan written: the model's, or the memory or speed policy's


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
    min_sol = _best(units, base, None, time_limit)
    min_peak = model_peak(units, base, *min_sol[:2]) if min_sol else base + sum(units.act)
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
    plans = [p for p in plans if p is not None]
    if not plans:
        return None

    def key(plan):
        peak = model_peak(units, base, plan[0], plan[1])
        extra = sum(f for f, r in zip(units.flops, plan[0], strict=True) if r)
        return (peak, extra) if budget is None else (extra, peak)

    return min(plans, key=key)  # min keeps the first (the MILP's) on ties


def _solve(units: Units, base: int, budget: int | None, time_limit: float):
    """The MILP: minimise recompute FLOPs under the budget, or (budget None) minimise the
    modelled peak. Returns (recompute, keep_cut, "milp") or None. Exact; for small chains."""
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


def _solve_dp(units: Units, base: int, budget: int | None, time_limit: float = 20.0):
    """The same problem as `_solve` by dynamic programming, for long chains.

    A plan is a path over the unit boundaries 0..m: a kept unit k is an arc k -> k+1 that
    costs its activations; a recomputed segment k..j is an arc k -> j+1 that costs its
    FLOPs, and the bytes of cut k-1 when k > 0. For a bound S on the largest segment, the
    cheapest plan whose kept bytes fit `budget - base - S` is a shortest path over
    (boundary, kept bytes in buckets of 1/DP_BUCKETS of the headroom); S is searched on a
    grid of the chain's segment sums, refined around the best. Bytes are rounded to the
    nearest bucket, so each plan is checked with `model_peak` and made again under a lower
    cap when rounding made it optimistic. Minimising the peak (budget None) needs no buckets: for
    each S it is a shortest path over bytes. Returns (recompute, keep_cut, "dp") or None."""
    import time

    import numpy as np

    m = len(units.act)
    a = np.asarray(units.act, dtype=np.float64)
    f = np.asarray(units.flops, dtype=np.float64)
    b = np.asarray(units.cut_bytes, dtype=np.float64)
    cum_a = np.r_[0.0, np.cumsum(a)]
    cum_f = np.r_[0.0, np.cumsum(f)]
    sums = cum_a[None, :] - cum_a[:, None]  # sums[k, j + 1]: bytes of units k..j
    seg_sums = np.unique(sums[sums > 0])
    deadline = time.monotonic() + time_limit

    def decode(parent, c_of) -> tuple[list[bool], list[bool]]:
        recompute, keep_cut = [False] * m, [False] * max(m - 1, 0)
        j, c = m, c_of
        while j > 0:
            p = int(parent[j][c])
            if p < 0:  # unit j - 1 kept
                c -= qa[j - 1]
                j -= 1
                continue
            for k in range(p, j):
                recompute[k] = True
            if p > 0:
                keep_cut[p - 1] = True
                c -= qb[p - 1]
            j = p
        return recompute, keep_cut

    def min_bytes(bound: float):
        """Least kept bytes with segments <= bound (exact), ties to fewer FLOPs."""
        dist = np.full(m + 1, np.inf)
        cost = np.full(m + 1, np.inf)
        parent = np.full(m + 1, -2, dtype=np.int64)
        dist[0] = cost[0] = 0.0
        for k in range(m):
            if dist[k] == np.inf:
                continue
            if (dist[k] + a[k], cost[k]) < (dist[k + 1], cost[k + 1]):
                dist[k + 1], cost[k + 1], parent[k + 1] = dist[k] + a[k], cost[k], -1
            hi = int(np.searchsorted(cum_a, cum_a[k] + bound, side="right")) - 1
            if hi <= k:
                continue
            ends = np.arange(k + 1, hi + 1)
            d = dist[k] + (b[k - 1] if k > 0 else 0.0)
            cc = cost[k] + cum_f[ends] - cum_f[k]
            better = (d < dist[ends]) | ((d == dist[ends]) & (cc < cost[ends]))
            dist[ends[better]] = d
            cost[ends[better]] = cc[better]
            parent[ends[better]] = k
        return parent

    def cheapest(bound: float, cap: int):
        """Fewest FLOPs with segments <= bound and kept bytes <= cap buckets."""
        if cap < 0:
            return None
        cost = np.full((m + 1, cap + 1), np.inf)
        parent = np.full((m + 1, cap + 1), -2, dtype=np.int32)
        cost[0, 0] = 0.0
        for k in range(m):
            row = cost[k]
            if not np.isfinite(row).any():
                continue
            s = qa[k]
            if s <= cap:
                target = cost[k + 1, s:]
                better = row[:cap + 1 - s] < target
                target[better] = row[:cap + 1 - s][better]
                parent[k + 1, s:][better] = -1
            hi = int(np.searchsorted(cum_a, cum_a[k] + bound, side="right")) - 1
            s = qb[k - 1] if k > 0 else 0
            if hi <= k or s > cap:
                continue
            block = row[None, :cap + 1 - s] + (cum_f[k + 1:hi + 1] - cum_f[k])[:, None]
            target = cost[k + 1:hi + 1, s:]
            better = block < target
            target[better] = block[better]
            parent[k + 1:hi + 1, s:][better] = k
        final = cost[m]
        if not np.isfinite(final).any():
            return None
        return decode(parent, int(np.argmin(final)))  # ties: the fewest kept bytes

    def search(evaluate, limit: float) -> tuple | None:
        """Best plan over segment bounds: 0, then a grid of the segment sums up to `limit`,
        refined around the best (every sum when there are few)."""
        best = None

        def consider(bound: float) -> None:
            nonlocal best
            plan = evaluate(bound)
            if plan is not None:
                key = score(plan)
                if key is not None and (best is None or key < best[0]):
                    best = (key, plan, bound)

        consider(0.0)
        lo, hi = 0, int(np.searchsorted(seg_sums, limit, side="right")) - 1
        tried = set()
        for _level in range(4):
            if hi < lo or time.monotonic() > deadline:
                break
            if hi - lo <= 3 * DP_GRID:  # few enough: every one
                picks = range(lo, hi + 1)
            else:
                picks = sorted({lo + (hi - lo) * t // DP_GRID for t in range(DP_GRID + 1)})
            for i in picks:
                if i not in tried:
                    tried.add(i)
                    consider(float(seg_sums[i]))
            if hi - lo <= 3 * DP_GRID or best is None:
                break
            at = int(np.searchsorted(seg_sums, best[2]))
            span = -(-(hi - lo) // DP_GRID)  # the grid's spacing, rounded up
            lo, hi = max(at - span, lo), min(at + span, hi)
        return best

    if budget is None:
        qa = [0] * m
        qb = [0] * max(m - 1, 0)

        def score(plan):
            r, x = plan
            return (model_peak(units, base, r, x),
                    sum(v for v, on in zip(units.flops, r, strict=True) if on))

        def evaluate(bound):
            return decode(min_bytes(bound)[:, None], 0)

        found = search(evaluate, float(seg_sums[-1]) if len(seg_sums) else 0.0)
        return None if found is None else (*found[1], "dp")

    headroom = float(budget - base)
    if headroom <= 0:
        return None
    if cum_a[-1] <= headroom:  # everything kept fits: no recompute at all
        return [False] * m, [False] * max(m - 1, 0), "dp"
    q = headroom / DP_BUCKETS
    qa = [int(round(v / q)) for v in units.act]
    qb = [int(round(v / q)) for v in units.cut_bytes]

    def score(plan):
        r, x = plan
        return (sum(v for v, on in zip(units.flops, r, strict=True) if on),
                model_peak(units, base, r, x))

    def evaluate(bound):
        """The cheapest plan for this bound; when rounding made it go over the budget,
        the kept bytes' cap is lowered by the excess and the plan made again."""
        cap = int(math.floor((headroom - bound) / q + 1e-9))
        for _ in range(4):
            plan = cheapest(bound, cap)
            if plan is None:
                return None
            over = model_peak(units, base, *plan) - budget
            if over <= 0:
                return plan
            cap -= max(1, math.ceil(over / q))
        return None

    found = search(evaluate, headroom)
    return None if found is None else (*found[1], "dp")

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
