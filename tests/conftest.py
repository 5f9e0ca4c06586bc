import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphmem.cli import main

# Tests that build models import TensorFlow themselves; measurements read the BFC
# allocator's statistics, which exist only when this is set before TF is first imported
# (graphmem's own loader sets it too, but a test file run alone may import TF first).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
# TF picks its CPU kernels by the machine's CPU (oneDNN on with AVX512-VNNI, AMX...; Eigen's
# otherwise) and the estimator follows (analysis/kernel_scratch.py): Eigen's convolution
# gradients allocate tens of MB of scratch. Tests that compare estimates must not depend on
# the CI machine: they run with oneDNN, unless the environment says otherwise.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

DATA = Path(__file__).parent / "fixtures" / "data"


def manifest() -> dict[str, dict]:
    data = json.loads((DATA / "manifest.json").read_text())
    return {f["name"]: f for f in data["fixtures"]}


@pytest.fixture(scope="session")
def fixtures() -> dict[str, dict]:
    return manifest()


def fixture_path(name: str) -> Path:
    return DATA / manifest()[name]["path"]


def run_cli(*args: str):
    """Run the CLI in-process; returns click's Result (exit_code, stdout, stderr)."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def copy_fixture(tmp_path):
    def _copy(name: str) -> Path:
        src = fixture_path(name)
        dst = tmp_path / src.name
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy2(src, dst)
        return dst
    return _copy
