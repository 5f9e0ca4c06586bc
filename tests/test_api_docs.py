"""docs/python-api.md's examples run as written: every ```python block, in order, in one
fresh process (its own TensorFlow settings), in an empty directory."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python-api.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_examples_of_every_entry_point():
    code = "\n".join(_blocks())
    for call in ("graphmem.inspect(", "graphmem.rewrite(", "graphmem.plan(",
                 "graphmem.verify(", "graphmem.function(", "rewrite_train_step("):
        assert call in code, call


def test_python_api_examples_run(tmp_path):
    script = tmp_path / "examples.py"
    script.write_text("\n\n".join(_blocks()))
    env_path = f"{ROOT}"
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600,
                         env={**__import__("os").environ, "PYTHONPATH": env_path})
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "same training: True max variable difference: 0.0" in text
    assert "refused: the rewritten function was traced for" in text
    assert "graphmem: error: invalid value for --policy" in text and "(exit code 2)" in text
    assert "losses [" in text
    assert (tmp_path / "mlp_small.meta").exists() and not (tmp_path / "out.meta").exists()
