"""What a new user meets first: the batch size, exit 2 without output, the help, progress,
the plan chart, output at 80 columns."""

from __future__ import annotations

import json
import re

import pytest

from graphmem.cli import main
from tests.conftest import DATA, fixture_path, run_cli

COMMANDS = ("inspect", "rewrite", "plan", "verify")
MODEL_OPTIONS = ("--format", "--tag-set", "--function", "--batch-size", "--backward-scope")


# ---- the batch size: found, or asked for; never a result from unknown sizes ----------------

def _one_error_line(res, fragment):
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphmem: error: "), res.stderr
    assert fragment in lines[0], lines[0]


def test_rewrite_without_batch_size_asks_for_it_and_writes_nothing(tmp_path):
    out = tmp_path / "out.meta"
    res = run_cli("rewrite", fixture_path("mlp"), "-o", out)
    _one_error_line(res, "--batch-size")
    assert "x:0 is [?, 64]" in res.stderr
    assert not out.exists() and res.stdout == ""
    assert "x)" not in res.stdout  # no ratio


def test_plan_and_verify_without_batch_size_ask_for_it(tmp_path):
    _one_error_line(run_cli("plan", fixture_path("mlp")), "--batch-size")
    _one_error_line(run_cli("plan", fixture_path("mlp"), "--json"), "--batch-size")
    # verify used to train at a batch of 8 without saying so
    res = run_cli("verify", fixture_path("mlp"), fixture_path("mlp"))
    _one_error_line(res, "--batch-size")


def test_inspect_without_batch_size_counts_but_shows_no_sizes(tmp_path):
    res = run_cli("inspect", fixture_path("mlp"))
    assert res.exit_code == 0, res.stderr
    assert "estimated step peak" not in res.stdout
    assert "sizes unknown" in res.stdout and "--batch-size" in res.stdout
    title = next(line for line in res.stdout.splitlines() if "saved activations:" in line)
    assert title.strip() == "saved activations: 29 tensors"  # no byte total from "?" sizes
    # what needs sizes asks for the batch size
    _one_error_line(run_cli("inspect", fixture_path("mlp"), "--max-peak", "1GiB"),
                    "--batch-size")
    _one_error_line(run_cli("inspect", fixture_path("mlp"), "--plot", tmp_path / "m.svg"),
                    "--batch-size")
    assert list(tmp_path.iterdir()) == []


def _static_mlp(path, batch: int):
    """A TF1 training graph whose placeholders have a static batch dimension."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, 32], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [batch], name="y")
        h = x
        for k in range(6):
            w = tf.compat.v1.get_variable(f"w{k}", [32, 32])
            h = tf.nn.relu(tf.matmul(h, w), name=f"layer_{k}")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=h))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        tf.compat.v1.add_to_collection("train_op", train)
        tf.compat.v1.add_to_collection("losses", loss)
        tf.compat.v1.train.export_meta_graph(str(path), graph=graph)
    return path


@pytest.mark.tf
def test_a_graph_with_static_shapes_needs_no_batch_size(tmp_path):
    src = _static_mlp(tmp_path / "static.meta", batch=16)
    res = run_cli("inspect", src, "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["batch_from"] == "not needed" and doc["sizes_unknown"] is None
    assert doc["estimated_peak_bytes"] > 0
    res = run_cli("rewrite", src, "-o", tmp_path / "out.meta", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["checkpoint_details"] and all(c["bytes"] for c in doc["checkpoint_details"])
    res = run_cli("verify", src, tmp_path / "out.meta", "--steps", "2")
    assert res.exit_code == 0, res.stderr
    assert "at batch" not in res.stdout  # no batch size was needed or made up


def test_batch_size_from_a_feed_and_from_a_signature():
    import numpy as np

    from graphmem.analysis.batch import resolve_batch_size
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace

    ws = Workspace.open(load_model(fixture_path("mlp"), None, None, None))
    found = resolve_batch_size(ws, None, {"x": np.zeros((12, 64), np.float32)})
    assert (found.size, found.source) == (12, "--feed")
    assert resolve_batch_size(ws, 5).size == 5
    missing = resolve_batch_size(ws, None)
    assert missing.needed and missing.source == "unknown"
    # a signature that fixes the leading dimension
    sig = ws.model.meta_graph.signature_def["train"]
    info = sig.inputs["x"]
    info.name = "x:0"
    info.tensor_shape.dim.add().size = 24
    info.tensor_shape.dim.add().size = 64
    found = resolve_batch_size(ws, None)
    assert (found.size, found.source) == (24, "signature")


# ---- exit 2 leaves nothing behind -----------------------------------------------------------

@pytest.mark.parametrize("extra", [
    ["--plot", "p.jpg"],  # the case: it used to write the model, then fail
    ["--max-peak", "lots"],
    ["--swap", "--swap-in-ahead", "3:1"],
    ["--budget", "1GiB", "--policy", "speed"],
    ["--policy", "budget"],
    [],  # no batch size
])
def test_every_rewrite_usage_error_writes_nothing(tmp_path, extra):
    out = tmp_path / "x.meta"
    args = [a if a != "p.jpg" else str(tmp_path / "p.jpg") for a in extra]
    batch = ["--batch-size", "8"] if extra else []
    res = run_cli("rewrite", fixture_path("mlp"), "-o", out, *batch, *args)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("graphmem: error: ")
    assert list(tmp_path.iterdir()) == []


def test_plot_usage_errors_in_inspect_and_plan_write_nothing(tmp_path):
    for cmd in ("inspect", "plan"):
        res = run_cli(cmd, fixture_path("mlp"), "--batch-size", "8", "--plot",
                      tmp_path / "p.gif")
        assert res.exit_code == 2 and ".svg or .png" in res.stderr
    assert list(tmp_path.iterdir()) == []


# ---- the help: groups, and the same model options everywhere ------------------------------

def _help(*args):
    res = run_cli(*args, "--help")
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_the_same_model_options(command):
    params = {opt for p in main.commands[command].params for opt in p.opts}
    assert set(MODEL_OPTIONS) <= params
    assert "--tag" in params  # the short name stays
    text = _help(command)
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels[0] == "Model" and "Output" in panels
    model = text[text.index("╭─ Model"):]
    model = model[:model.index("╰")]
    for opt in MODEL_OPTIONS:
        assert opt in model, (command, opt)


def test_rewrite_help_groups_its_options():
    text = _help("rewrite")
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels == ["Model", "Policy", "Swap (host offload)", "Estimate and CI", "Output"]
    swap = text[text.index("╭─ Swap"):]
    swap = swap[:swap.index("╰")]
    assert swap.count("--swap") >= 9 and "--policy" not in swap
    assert "--host-device" in swap


def test_help_fits_80_columns():
    for command in COMMANDS:
        for line in _help(command).splitlines():
            assert len(line) <= 80, line


# ---- progress: on a terminal only, never with --json --------------------------------------

def test_progress_only_on_a_terminal_and_not_with_json(monkeypatch):
    import graphmem.cli as cli

    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    assert cli._progress(as_json=True)._live is None
    shown = cli._progress(as_json=False)
    assert shown._live is not None
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    assert cli._progress(as_json=False)._live is None


def test_rewrite_reports_its_stages(tmp_path, monkeypatch):
    import graphmem.cli as cli

    stages = []

    class Recorder(cli.Progress):
        def stage(self, text):
            stages.append(text)

    monkeypatch.setattr(cli, "_progress", lambda as_json: Recorder(False))
    res = run_cli("rewrite", fixture_path("mlp"), "--batch-size", "8", "-o",
                  tmp_path / "o.meta", "--plot", tmp_path / "o.svg")
    assert res.exit_code == 0, res.stderr
    assert stages == ["reading the model", "rewriting", "writing the output",
                      "drawing the plot"]
    assert f"plot written to {tmp_path / 'o.svg'}" in " ".join(res.stdout.split())


# ---- plan's chart: peak against extra compute, the plans where they are -------------------

def test_plan_chart_puts_each_plan_at_its_extra_compute(tmp_path):
    from graphmem.plan import tradeoff
    from graphmem.report.plot import tradeoff_chart

    result = tradeoff(fixture_path("mlp"), 64, steps=4)
    chart = tradeoff_chart(result)
    assert [(p.extra_flops_share, p.peak_bytes) for p in chart.curve] == sorted(
        (p.extra_flops_share, p.peak_bytes) for p in result.points)
    by_label = {p.label: p for p in chart.policies}
    for p in result.policies:
        assert (by_label[f"{p.label} policy"].extra_flops_share,
                by_label[f"{p.label} policy"].peak_bytes) == (p.extra_flops_share, p.peak_bytes)
    # the memory policy recomputes: it is not drawn at x = 0
    assert by_label["memory policy"].extra_flops_share > 0
    assert chart.original_peak_bytes == result.original_peak_bytes
    assert chart.floor_bytes == result.floor["bytes"] <= result.smallest_peak_bytes

    out = tmp_path / "plan.svg"
    res = run_cli("plan", fixture_path("mlp"), "--batch-size", "64", "--points", "4",
                  "--plot", out)
    assert res.exit_code == 0, res.stderr
    svg = out.read_text()
    assert "progress through the training step" not in svg
    assert "extra compute" in svg
    assert svg.count('class="plan"') == len(chart.curve)
    assert svg.count('class="policy"') == 2 and svg.count('class="level"') == 2


# ---- output at 80 columns -------------------------------------------------------------------

def test_rewrite_report_fits_80_columns_and_names_triggers_in_full(tmp_path):
    res = run_cli("rewrite", fixture_path("resnet"), "--batch-size", "8", "-o",
                  tmp_path / "o.meta")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in res.stdout  # nothing cut
    assert "TF's warm-up steps" not in res.stdout


def test_verify_report_losses_and_variables(tmp_path):
    from graphmem.report.verify_report import _loss_digits, render_verify
    from graphmem.runtime.train_runner import StepRecord
    from graphmem.runtime.verify import GraphRun, VerifyResult

    assert _loss_digits([2.5, 0.0123]) == 8  # 7 significant digits of the smallest
    steps = [StepRecord(2.302585, 1000, 0.01), StepRecord(0.25, 1000, 0.01)]
    r = VerifyResult(GraphRun("a", steps), GraphRun("b", steps), 0.0, 0.0, "beta1_power", 3,
                     1e-5, 1e-6, 1)
    from rich.console import Console

    console = Console(width=80, record=True, highlight=False)
    render_verify(r, console, 16, "--batch-size")
    text = console.export_text()
    assert "beta1_power" not in text  # nothing differs: no variable named
    assert "at batch 16 (from --batch-size)" in text
    assert "2.3025850" in text and "0.2500000" in text  # same decimals in every row
    assert all(len(line) <= 80 for line in text.splitlines())


# ---- the README's commands --------------------------------------------------------------------

def _readme_block(heading: str) -> list[str]:
    """The lines of the bash blocks of a README section, in order."""
    text = (DATA.parents[2] / "README.md").read_text()
    section = text[text.index(heading) + len(heading):]
    section = section[:section.find("\n## ")] if "\n## " in section else section
    lines = []
    for block in section.split("```bash")[1:]:
        lines += [line for line in block[:block.index("```")].splitlines() if line.strip()]
    return lines


def test_readme_quick_start_is_two_commands_that_write_under_out():
    first, second = _readme_block("## Quick start")[:2]
    assert "pip install -e '.[cpu]'" in first
    steps = [s.strip() for s in first.split("&&")]
    outputs = [a for s in steps if s.startswith("graphmem rewrite")
               for a in [s.split(" -o ")[1].split()[0]]]
    assert outputs and all(o.startswith("out/") for o in outputs)
    assert second == "python3 -m pip install -e '.[test]' && python3 -m pytest"
    gitignore = (DATA.parents[2] / ".gitignore").read_text().split()
    assert "/out/" in gitignore


@pytest.mark.tf
def test_readme_quick_start_runs(tmp_path, monkeypatch):
    import shlex
    import shutil

    root = DATA.parents[2]
    monkeypatch.chdir(tmp_path)
    shutil.copytree(root / "tests" / "fixtures" / "data", tmp_path / "tests/fixtures/data")
    first = _readme_block("## Quick start")[0]
    ran = 0
    for step in (s.strip() for s in first.split("&&")):
        args = shlex.split(step)
        if args[:2] == ["mkdir", "-p"]:
            for d in args[2:]:
                (tmp_path / d).mkdir(parents=True, exist_ok=True)
        elif args[0] == "graphmem":
            res = run_cli(*args[1:])
            assert res.exit_code == 0, (step, res.stderr)
            ran += 1
    assert ran == 2
    assert "same training" in res.stdout
