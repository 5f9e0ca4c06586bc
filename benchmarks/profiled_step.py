"""Training steps recorded under TensorFlow's profiler, for the benchmarks that read what
TF did in a step (`trace_peak`: the allocator's events; `thread_overlap`: when each
kernel ran; `inline_ops`: which kernels TF counted as expensive; `op_class_times`: how
long each kernel took), and the graph's own step ops they compare it with. One way to
run, record and read them, so that the four see the same steps."""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Iterator


def profiled_steps(path: str, batch: int, threads: int, first: int, count: int = 1,
                   host_tracer_level: int | None = None) -> tuple[list, list]:
    """Train MODEL at `path` for `first - 1` steps, then record `count` steps (the
    `first`-th on, 1 = the first step) each under the profiler. Returns each recorded
    step's `StepRecord` (peak, time, loss) and its XSpace. `host_tracer_level` 2 records
    every kernel TF counts as expensive; the default (None) is TF's own level, which also
    records the allocator's events."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from benchmarks.measure import open_runner

    options = None if host_tracer_level is None else \
        tf.profiler.experimental.ProfilerOptions(host_tracer_level=host_tracer_level)
    runner, feeds = open_runner(path, batch, threads)
    records, spaces = [], []
    try:
        for n in range(first - 1):
            runner.step(feeds(n))
        for k in range(count):
            with tempfile.TemporaryDirectory() as logdir:
                tf.profiler.experimental.start(logdir, options=options)
                records.append(runner.step(feeds(first - 1 + k)))
                tf.profiler.experimental.stop()
                (file,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                                    recursive=True)
                space = xplane_pb2.XSpace()
                with open(file, "rb") as f:
                    space.ParseFromString(f.read())
                spaces.append(space)
    finally:
        runner.close()
    return records, spaces


def events(space, line_prefix: str = "") -> Iterator[tuple[object, object, object, str]]:
    """(plane, line, event, event name) of every event of an XSpace on the lines whose
    name starts with `line_prefix`."""
    for plane in space.planes:
        names = plane.event_metadata
        for line in plane.lines:
            if not line.name.startswith(line_prefix):
                continue
            for e in line.events:
                yield plane, line, e, names[e.metadata_id].name


def kernels(space) -> list[tuple[int, int, str]]:
    """(start, end in ps, "op name:op type") of every kernel on TF's compute threads."""
    out = []
    for _, line, e, name in events(space, "tf_Compute"):
        # kernels are "op name:op type"; the executor's own events have no colon or a C++
        # scope ("ExecutorState::Process", "ThreadpoolListener::...")
        if name.count(":") != 1:
            continue
        start = line.timestamp_ns * 1000 + e.offset_ps
        out.append((start, start + e.duration_ps, name))
    return out


def step_ops(path: str, batch: int):
    """(graph index, ids of the step's ops) of MODEL at `path`, as graphmem sees the step
    at this batch size: what the traced kernels are compared with."""
    from graphmem.analysis.regions import analyze_regions
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace

    index = Workspace.open(load_model(path), batch_size=batch).index
    return index, analyze_regions(index, None, batch).step_nodes(index)
