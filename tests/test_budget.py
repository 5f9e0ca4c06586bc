"""The budget policy: optimal on chains worked out by hand, honest when a budget cannot be met."""

import json

import pytest

from graphmem.passes import budget as budget_mod
from graphmem.passes.budget import Units, model_peak, parse_budget, solve_budget
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify
from tests.conftest import fixture_path, run_cli

# three units of 100 bytes; the middle one is expensive to recompute; cuts cost 5 bytes
CHAIN = Units(cuts=[0, 1], act=[100, 100, 100], flops=[1, 10, 1], cut_bytes=[5, 5])


def test_cheapest_plan_under_the_budget():
    # keeping the middle unit and recomputing the cheap ends: kept 100 + cut 5 + segment 100
    sol = solve_budget(CHAIN, base=0, budget=250)
    assert sol.method == "milp" and sol.feasible
    assert sol.recompute == [True, False, True]
    assert sol.model_peak == 205 and sol.extra_flops == 2
    assert model_peak(CHAIN, 0, sol.recompute, sol.keep_cut) == 205


def test_generous_budget_recomputes_nothing():
    sol = solve_budget(CHAIN, base=0, budget=300)
    assert sol.recompute == [False, False, False] and sol.extra_flops == 0


def test_infeasible_budget_reports_the_smallest_peak():
    # everything recomputed, both cuts kept: 5 + 5 + the largest segment 100
    sol = solve_budget(CHAIN, base=0, budget=50)
    assert not sol.feasible
    assert sol.min_peak == 110 and sol.model_peak == 110


def test_greedy_fallback_without_scipy(monkeypatch):
    monkeypatch.setattr(budget_mod, "_solve", lambda *a, **k: None)
    sol = solve_budget(CHAIN, base=0, budget=250)
    assert sol.method.startswith("greedy") and sol.feasible and sol.model_peak <= 250


@pytest.mark.parametrize("text,expected", [("0.5", 500), ("1", 1000), ("2KiB", 2048),
                                           ("300", 300)])
def test_parse_budget(text, expected):
    assert parse_budget(text, 1000) == expected


@pytest.mark.parametrize("args", [["--budget", "lots"], ["--budget", "0"], ["--budget", "-0.5"],
                                  ["--policy", "budget"], ["--budget", "1GiB", "--policy", "speed"],
                                  ["--budget", "1.5"]])
def test_malformed_budgets_exit_2(args, tmp_path):
    out = tmp_path / "o.meta"
    res = run_cli("rewrite", fixture_path("mlp"), "-o", out, *args)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("graphmem: error:") and not out.exists()


def test_budget_on_resnet_fits_and_trains_identically(tmp_path):
    src, out = fixture_path("resnet"), tmp_path / "r.meta"
    result = rewrite_file(src, out, RewriteOptions("budget", [], 64, budget="0.8"))
    assert result.budget.feasible
    assert result.after.peak_bytes <= result.budget_bytes
    assert result.budget.extra_flops < result.budget.total_flops  # not everything recomputed
    r = verify(str(src), str(out), RunSpec(batch_size=16, grappler=False), 3, 0.0, 0.0)
    assert r.same_training


def test_unreachable_budget_exits_1_and_says_by_how_much(tmp_path):
    out = tmp_path / "r.meta"
    res = run_cli("rewrite", fixture_path("resnet"), "-o", out, "--batch-size", "64",
                  "--budget", "0.2", "--json")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["budget"]["feasible"] is False
    assert "cannot be met" in doc["policy_note"] and "over" in doc["policy_note"]
    assert doc["after"]["estimated_peak_bytes"] > doc["budget"]["budget_bytes"]
    assert out.exists()  # the lowest plan found is still written


def test_plan_tradeoff_curve(tmp_path):
    res = run_cli("plan", fixture_path("resnet"), "--batch-size", "32", "--points", "5",
                  "--json", "--plot", tmp_path / "curve.svg")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)  # nothing but the document on stdout
    points = sorted(doc["points"], key=lambda p: p["extra_flops_share"])
    assert len(points) >= 3
    # more recompute never costs memory: peaks fall as extra compute rises
    assert all(a["peak_bytes"] >= b["peak_bytes"] for a, b in zip(points, points[1:], strict=False))
    assert points[0]["extra_flops_share"] == 0
    assert points[0]["peak_bytes"] == doc["original_peak_bytes"]
    labels = {p["label"] for p in doc["policies"]}
    assert labels == {"memory", "speed"}
    assert (tmp_path / "curve.svg").read_text().startswith("<svg")
