"""docs/python-api.md's examples run as written: every ```python block, in order, in one
fresh process (its own TensorFlow settings), in an empty directory. The README's Python API
example likewise, from a directory that has the repository's fixtures where it says."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python-api.md"
README = ROOT / "README.md"


def _blocks(text: str | None = None) -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text() if text is None else text,
                      flags=re.S)


def _readme_section() -> str:
    text = README.read_text()
    start = text.index("\n## Python API\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _run(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True,
                          text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def test_the_doc_has_examples_of_every_entry_point():
    code = "\n".join(_blocks())
    for call in ("graphmem.inspect(", "graphmem.rewrite(", "graphmem.plan(",
                 "graphmem.verify(", "graphmem.function(", "rewrite_train_step("):
        assert call in code, call


def test_python_api_examples_run(tmp_path):
    script = tmp_path / "examples.py"
    script.write_text("\n\n".join(_blocks()))
    out = _run(script, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "same training: True max variable difference: 0.0" in text
    assert "refused: the rewritten function was traced for" in text
    assert "graphmem: error: invalid value for --policy" in text and "(exit code 2)" in text
    assert "losses [" in text
    assert (tmp_path / "mlp_small.meta").exists() and not (tmp_path / "out.meta").exists()


def test_readme_api_example_runs_and_points_at_the_doc(tmp_path):
    section = _readme_section()
    assert "(docs/python-api.md)" in section
    blocks = _blocks(section)
    assert len(blocks) == 1 and "graphmem.rewrite(" in blocks[0]
    work = tmp_path / "work"
    (work / "tests" / "fixtures").mkdir(parents=True)
    (work / "tests" / "fixtures" / "data").symlink_to(ROOT / "tests" / "fixtures" / "data")
    script = tmp_path / "readme_example.py"
    script.write_text(blocks[0])
    out = _run(script, work)
    assert out.returncode == 0, out.stderr[-3000:]
    found = re.search(r"(\d+) checkpoints: estimated peak ([\d.]+) -> ([\d.]+) MiB",
                      out.stdout)
    assert found, out.stdout
    assert int(found[1]) > 0 and float(found[3]) < float(found[2])
    assert "same training: True 0.0" in out.stdout
    assert (work / "mlp_small.meta").stat().st_size > 0
