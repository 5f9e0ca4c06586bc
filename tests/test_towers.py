"""Data-parallel (multi-tower) training graphs: rewritten per tower, trained identically.

TF1 tower graphs (one tower per logical CPU device, gradients averaged on the parameter
device, batch norm) are rewritten with the memory policy and early updates, then trained
side by side with the original from the same variable values: bit for bit with Grappler
off. Each device's estimated peak must drop, copies stay on their original's device, each
copy waits for backward ops of its own tower only, and updates wait for the averaged
gradient.
"""

import pytest

from benchmarks.towers_bench import tf1_towers_graph
from graphmem.analysis.towers import collectives
from graphmem.formats import load_model
from graphmem.graph.devices import normalize_device
from graphmem.graph.names import is_copy, original_name
from graphmem.graph.workspace import Workspace
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec, cpu_device_count
from graphmem.runtime.verify import verify
from tests.conftest import run_cli

pytestmark = pytest.mark.tf

PER_TOWER = 16


def _rewrite(src, tmp_path, towers):
    out = tmp_path / "out.meta"
    options = RewriteOptions("memory", [], PER_TOWER * towers, early_updates=True)
    return out, rewrite_file(src, out, options)


@pytest.fixture(scope="module", params=[(2, False), (4, True)], ids=["2-towers", "4-towers-bn"])
def towers_graph(request, tmp_path_factory):
    towers, bn = request.param
    path = tmp_path_factory.mktemp("towers") / "towers.meta"
    tf1_towers_graph(path, towers=towers, layers=6, width=64, features=32, batch_norm=bn)
    return towers, path


def test_tower_graph_trains_identically(towers_graph, tmp_path):
    towers, src = towers_graph
    out, result = _rewrite(src, tmp_path, towers)
    assert result.plan.copied_ops > 0 and not result.reverted
    batch = PER_TOWER * towers
    exact = verify(str(src), str(out), RunSpec(batch_size=batch, grappler=False), 3, 0.0, 0.0)
    assert exact.same_training, exact.mismatches
    assert exact.max_loss_diff == 0 and exact.max_variable_diff == 0
    assert exact.variables_compared > 0
    default = verify(str(src), str(out), RunSpec(batch_size=batch), 3, 1e-5, 1e-5)
    assert default.same_training, default.mismatches
    # each device's estimated peak drops
    before, after = result.before.peak_by_device, result.after.peak_by_device
    assert len(before) == towers
    for device, peak in before.items():
        assert after[device] < peak, (device, after[device], peak)


def test_copies_and_triggers_stay_in_their_tower(towers_graph, tmp_path):
    towers, src = towers_graph
    out, result = _rewrite(src, tmp_path, towers)
    index = Workspace.open(load_model(out)).index
    segments = result.plan.segments
    assert {s.tower for s in segments} == {f"/device:CPU:{k}" for k in range(towers)}
    for s in segments:
        for t in s.triggers:
            assert normalize_device(index.devices[index.id_of[t]]) == s.tower, (s, t)
    copies = [i for i, n in enumerate(index.names) if is_copy(n)]
    assert copies
    for i in copies:
        original = index.id_of[original_name(index.names[i])]
        assert index.devices[i] == index.devices[original]


def test_early_updates_wait_for_the_averaged_gradient(towers_graph, tmp_path):
    towers, src = towers_graph
    _, result = _rewrite(src, tmp_path, towers)
    early = result.early
    # every weight's update (7 matmuls, 6 biases; batch norm: 2 more per layer) gets edges;
    # the global step's increment (it waits for every update) and the first layer's
    # (nothing comes after its gradient) are left alone
    assert early.updates >= 13 - 1
    assert early.skipped.get("waits for several gradients", 0) <= 1


def test_runner_makes_a_device_per_device_string():
    assert cpu_device_count(["/device:CPU:0", "/cpu:3", ""]) == 4
    assert cpu_device_count(["/job:localhost/replica:0/task:0/device:CPU:1"]) == 2
    assert cpu_device_count(["/device:GPU:1", "/cpu:0"]) == 1
    assert cpu_device_count([""]) == 1


def test_tower_graph_has_no_collectives(towers_graph):
    # the TF1 recipe averages with add_n: nothing for the collective-order check
    _, src = towers_graph
    assert collectives(Workspace.open(load_model(src)).index) == []


def test_max_peak_gates_the_highest_device(towers_graph, tmp_path):
    towers, src = towers_graph
    _, result = _rewrite(src, tmp_path, towers)
    by_device = result.after.peak_by_device
    highest = max(by_device.values())
    assert highest < result.after.peak_bytes  # the devices' peaks are not all at once
    batch = str(PER_TOWER * towers)
    ok = run_cli("rewrite", str(src), "-o", str(tmp_path / "a.meta"), "--batch-size", batch,
                 "--max-peak", str(highest))
    assert ok.exit_code == 0, ok.output
    over = run_cli("rewrite", str(src), "-o", str(tmp_path / "b.meta"), "--batch-size", batch,
                   "--max-peak", str(highest - 1))
    assert over.exit_code == 1
    assert "the highest device" in over.output
