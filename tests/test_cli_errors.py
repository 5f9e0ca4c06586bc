"""Bad input: one line on stderr, exit code 2, no traceback, no output file."""

import subprocess
import sys

import pytest

from tests.conftest import DATA, fixture_path, run_cli


def _assert_clean_error(result, fragment):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("graphmem: error: ")
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_missing_path():
    _assert_clean_error(run_cli("inspect", "no/such/model.meta"), "no such file")


def test_corrupt_binary(tmp_path):
    bad = tmp_path / "broken.meta"
    bad.write_bytes(bytes(range(256)) * 8)
    _assert_clean_error(run_cli("inspect", bad), "not a valid MetaGraphDef")


def test_corrupt_text(tmp_path):
    bad = tmp_path / "broken.pbtxt"
    bad.write_text('node { name: "a" op: ')
    _assert_clean_error(run_cli("inspect", bad), "not a valid GraphDef")


def test_wrong_format_flag(tmp_path):
    _assert_clean_error(run_cli("inspect", fixture_path("mlp_text"), "--format", "graphdef"),
                        "not a valid GraphDef")
    _assert_clean_error(run_cli("inspect", DATA / "tf2_saved_model", "--format", "meta"),
                        "is a directory")


def test_unreadable_file(tmp_path):
    if sys.platform.startswith("linux") and __import__("os").geteuid() == 0:
        # root reads anything; a directory posing as a .pb is unreadable as a file
        target = tmp_path / "dir.pb"
        target.mkdir()
        _assert_clean_error(run_cli("inspect", target, "--format", "graphdef"), "directory")
    else:
        target = tmp_path / "locked.pb"
        target.write_bytes(b"x")
        target.chmod(0)
        _assert_clean_error(run_cli("inspect", target), "cannot read")


def test_wrong_tag_and_function():
    _assert_clean_error(run_cli("inspect", DATA / "tf1_saved_model", "--tag", "gpu"),
                        "tags: train; serve")
    _assert_clean_error(run_cli("inspect", DATA / "tf1_saved_model"), "--tag")
    _assert_clean_error(run_cli("inspect", DATA / "tf2_saved_model", "--function", "nope"),
                        "__inference_train_step")


def test_not_a_training_graph():
    _assert_clean_error(run_cli("inspect", fixture_path("inference")), "training graph")
    _assert_clean_error(run_cli("inspect", DATA / "tf1_saved_model", "--tag", "serve"),
                        "training graph")


def test_inference_only_saved_model(tmp_path):
    """A TF2 SavedModel with only a forward function (what Keras's model.save exports) is
    named as such, not reported as a graph without gradient scopes."""
    tf = pytest.importorskip("tensorflow")

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.ones([4, 2]))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def predict(self, x):
            return tf.nn.relu(tf.matmul(x, self.w))

    model = Model()
    path = tmp_path / "inference_only"
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.predict})
    _assert_clean_error(run_cli("inspect", path), "holds no train step")
    out = tmp_path / "out"
    _assert_clean_error(run_cli("rewrite", path, "-o", out), "holds no train step")
    assert not out.exists()


def test_rewrite_errors_leave_no_output(tmp_path):
    out = tmp_path / "out.meta"
    _assert_clean_error(run_cli("rewrite", fixture_path("inference"), "-o", out),
                        "training graph")
    assert not out.exists()
    _assert_clean_error(run_cli("rewrite", fixture_path("mlp"), "-o", out, "--batch-size", "8",
                                "--checkpoints", "no_such_tensor_anywhere"), "matched no")
    assert not out.exists()
    _assert_clean_error(run_cli("rewrite", fixture_path("resnet"), "-o", out, "--batch-size",
                                "8", "--policy", "collection"), "checkpoints")
    assert not out.exists()


@pytest.mark.parametrize("args", [["inspect"], ["rewrite", "x.meta"], ["inspect", "a", "--top", "x"]])
def test_usage_errors_exit_2(args):
    assert run_cli(*args).exit_code == 2


def test_real_process_prints_no_traceback(tmp_path):
    bad = tmp_path / "broken.meta"
    bad.write_bytes(b"\x08\x96\x01garbage")
    proc = subprocess.run([sys.executable, "-m", "graphmem.cli", "inspect", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("graphmem: error:")


def test_click_usage_errors_are_one_line():
    # click's own checks (option ranges, missing arguments) used to print a 3-line usage block
    _assert_clean_error(run_cli("inspect", fixture_path("mlp"), "--batch-size", "0"),
                        "--batch-size")
    _assert_clean_error(run_cli("rewrite", fixture_path("mlp")), "--output")
    _assert_clean_error(run_cli("verify", fixture_path("mlp")), "REWRITTEN")
    _assert_clean_error(run_cli("no-such-command"), "no-such-command")


def test_output_into_a_missing_directory_is_refused(tmp_path):
    # it used to create the directories and exit 0
    out = tmp_path / "missing" / "sub" / "out.meta"
    _assert_clean_error(run_cli("rewrite", fixture_path("mlp"), "-o", out), "does not exist")
    assert not (tmp_path / "missing").exists()
    _assert_clean_error(run_cli("rewrite", DATA / "tf2_saved_model", "-o", out.parent),
                        "does not exist")
    _assert_clean_error(run_cli("inspect", fixture_path("mlp"), "--plot", out.with_suffix(
        ".svg")), "does not exist")
    assert not (tmp_path / "missing").exists()
