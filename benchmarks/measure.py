"""Measure one graph's training step in a fresh process: `python -m benchmarks.measure MODEL`.

Prints one JSON line: the median step peak above resident memory (first step left out), the
median step time, every step's loss, peak and wall time, and a digest of the variables after the run
(equal losses and digests: trained bit for bit alike). Separate processes matter: the executor's order of independent ops,
and with it the peak, changes from one process to the next.

`--warmup N` runs N steps before the measured ones. TF's executor takes every kernel for
expensive at first (its cost estimate starts at 1e8 cycles and decays by a tenth per run),
so for about 90 steps it runs small ops as tasks, after that inline: the order, and with it
the peak, of a training run's first steps and of its steady state can differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.runtime.train_runner import RunSpec, make_feeds, make_runner
from graphmem.runtime.verify import GraphRun

ROOT = Path(__file__).resolve().parents[1]  # where `-m benchmarks.measure` is found


def open_runner(path: str, batch: int, threads: int, tag: str | None = None,
                grappler_memory: str | None = None):
    """The model at `path` ready to train, as `verify` trains it: (runner, step -> feeds)."""
    ws = Workspace.open(load_model(path, tag=tag))
    spec = RunSpec(batch_size=batch, inter_op_threads=threads,
                   grappler_memory_optimization=grappler_memory)
    runner = make_runner(ws, spec)
    runner.initialize()

    def feeds(step: int):
        return runner.feeds(step) if hasattr(runner, "feeds") else make_feeds(
            runner.index, runner.regions, spec, step)
    return runner, feeds


# where a feed's NumPy array starts, modulo 64 bytes: TF aliases an array aligned to 64
# bytes (outside its allocator) and copies any other into its allocator
FEED_OFFSETS = {"aligned": 0, "misaligned": 16}


def placed(value, offset: int):
    """A copy of NumPy array `value` starting `offset` bytes past a 64-byte boundary."""
    import numpy as np

    buf = np.empty(value.nbytes + 128, np.uint8)
    start = (offset - buf.ctypes.data) % 64
    out = buf[start:start + value.nbytes].view(value.dtype).reshape(value.shape)
    out[...] = value
    return out


def measure_here(path: str, batch: int, threads: int, steps: int, tag: str | None = None,
                 grappler_memory: str | None = None, warmup: int = 0,
                 feed_alignment: str = "as-made") -> dict:
    """`feed_alignment`: "aligned" or "misaligned" places every NumPy feed so (see
    FEED_OFFSETS); "as-made" feeds the arrays as the runner makes them."""
    runner, made = open_runner(path, batch, threads, tag, grappler_memory)
    offset = FEED_OFFSETS.get(feed_alignment)

    def feeds(step: int):
        values = made(step)
        if offset is None:
            return values
        if isinstance(values, dict):
            return {k: placed(v, offset) for k, v in values.items()}
        return [placed(v, offset) for v in values]

    records = [runner.step(feeds(step)) for step in range(warmup + steps)]
    digest = variables_digest(runner.variables())
    runner.close()
    run = GraphRun(path, records, warmup)  # the steps verify measures, measured its way
    # the highest step after the first (which holds one-time allocations): a training
    # run's peak, warm-up and steady state both when the run is long enough
    highest = max((r.peak_bytes for r in records[1:]), default=run.measured_peak_bytes)
    return {"peak": run.measured_peak_bytes, "seconds": run.median_step_seconds,
            "losses": [r.loss for r in records[warmup:]], "highest": highest,
            "steps": [r.peak_bytes for r in records],  # every step's, the first included
            # every step's wall seconds, the first included: when a run's step time
            # settles (TF's warm-up, the allocator's growth) as `steps` shows its peak's
            "step_seconds": [r.seconds for r in records],
            "digest": digest}


def variables_digest(values: dict) -> str:
    """A hash of every variable's bytes after the run: two runs trained bit for bit alike
    when their digests (and losses) are equal."""
    h = hashlib.sha256()
    for name in sorted(values):
        h.update(name.encode())
        h.update(values[name].tobytes())
    return h.hexdigest()[:16]


def measure(path: str, batch: int, threads: int = 1, steps: int = 6, processes: int = 3,
            tag: str | None = None, grappler_memory: str | None = None,
            warmup: int = 0, env: dict | None = None) -> dict:
    """Median over `processes` fresh processes of measure_here. `env`: their environment
    (default: this one's; a caller that built models here passes the one it started
    with, as model builders set TF variables, such as oneDNN off)."""
    runs = []
    for _ in range(processes):
        cmd = [sys.executable, "-m", "benchmarks.measure", path, "--batch", str(batch),
               "--threads", str(threads), "--steps", str(steps)]
        if tag:
            cmd += ["--tag", tag]
        if grappler_memory:
            cmd += ["--grappler-memory", grappler_memory]
        if warmup:
            cmd += ["--warmup", str(warmup)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT,
                             env=env)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"peak": int(statistics.median(r["peak"] for r in runs)),
            "seconds": statistics.median(r["seconds"] for r in runs),
            "peaks": [r["peak"] for r in runs],
            "highests": [r.get("highest", r["peak"]) for r in runs],
            "losses": [r["losses"] for r in runs],
            "digests": [r.get("digest") for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tag")
    ap.add_argument("--grappler-memory")
    ap.add_argument("--warmup", type=int, default=0, help="steps run before the measured ones")
    ap.add_argument("--feed-alignment", choices=["as-made", *FEED_OFFSETS], default="as-made",
                    help="place every NumPy feed 64-byte aligned (TF aliases it) or not "
                         "(TF copies it into its allocator)")
    a = ap.parse_args()
    print(json.dumps(measure_here(a.model, a.batch, a.threads, a.steps, a.tag,
                                  a.grappler_memory, a.warmup, a.feed_alignment)))


if __name__ == "__main__":
    main()
