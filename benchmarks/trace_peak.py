"""What is live at a training step's measured peak: `python -m benchmarks.trace_peak MODEL`.

Trains MODEL (any format `graphmem verify` runs: a TF1 graph in a session, a TF2 train
step called as its users call it) for `--step` steps and records the last under
TensorFlow's profiler. The CPU allocator logs every allocation and release there, with the
op, the shape, the bytes asked for and the chunk it got; replayed in time order, they give
the allocator's bytes in use at each moment, its highest point in the step, and which
buffers were live then. With `--estimate`, graphmem's estimated peak and the live set it
simulates are printed beside them: where the two differ is where the estimate is wrong.

Prints the peak above what was resident before the step, the op allocating at the peak,
the live buffers largest first (op, output or scratch, shape, chunk bytes), and how much
of the peak is chunk rounding (a chunk larger than asked for: TensorFlow's allocator does
not split a free chunk when less than twice the request and less than 128 MiB would
remain).

    python -m benchmarks.trace_peak MODEL --batch N [--threads 1] [--step 3] [--top 15]
                                    [--estimate] [--at OP]

`--at OP` prints what was live when the op named OP (a graph node name) allocated, at its
highest point, instead of at the step's peak: where the estimate's peak is at another op
than the measured one, what TF held there.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass

from benchmarks.profiled_step import events, profiled_steps
from graphmem.units import format_bytes


@dataclass
class Buffer:
    op: str
    region: str  # "output", "temp", ... as TensorFlow's allocator names it
    shape: str
    requested: int
    chunk: int


@dataclass
class PeakTrace:
    peak_in_use: int  # the allocator's bytes in use at the step's highest point
    resident: int  # in use before the step's first allocation
    op: str  # the op whose allocation made the peak
    live: list[Buffer]  # allocated during the step and live at the peak, largest first


def _events(space):
    """(time in ps, kind, stats) of every allocator event in an XSpace."""
    out = []
    for plane, line, e, kind in events(space):
        if kind not in ("MemoryAllocation", "MemoryDeallocation"):
            continue
        stat_names = plane.stat_metadata
        stats = {}
        for s in e.stats:
            key = stat_names[s.metadata_id].name
            which = s.WhichOneof("value")
            value = getattr(s, which) if which else None
            if which == "ref_value":
                value = stat_names[s.ref_value].name
            stats[key] = value
        out.append((line.timestamp_ns * 1000 + e.offset_ps, kind, stats))
    out.sort(key=lambda x: x[0])
    return out


def _is_op(tf_op: str, at: str) -> bool:
    """Is `tf_op` (as the profiler names it: inside a function, with the call's prefix) the
    op named `at` in the graph?"""
    return tf_op == at or tf_op.endswith("/" + at)


def peak_of(allocator_events: list, at: str | None = None) -> PeakTrace:
    """The highest point of the allocator's bytes in use over `allocator_events` ((time,
    kind, stats) in time order), and the buffers live then; with `at`, the highest point
    reached by an allocation of the op named `at` (what was live when it ran, to set beside
    the estimate's live set there)."""
    # TF may log more than one allocator (oneDNN's own, for a buffer or two): their
    # counters are their own; the step's tensors are the busiest allocator's
    counts = Counter(st.get("allocator_name") for _, _, st in allocator_events)
    main = counts.most_common(1)[0][0] if counts else None
    live: dict[int, Buffer] = {}
    best: tuple[int, str, list[Buffer]] | None = None
    resident = None
    for _, kind, st in allocator_events:
        if st.get("allocator_name") != main:
            continue
        in_use = int(st.get("bytes_allocated") or 0)
        addr = st.get("addr")
        if kind == "MemoryAllocation":
            buf = Buffer(str(st.get("tf_op") or "?"), str(st.get("region_type") or "?"),
                         str(st.get("shape") or "?"), int(st.get("requested_bytes") or 0),
                         int(st.get("allocation_bytes") or 0))
            if resident is None:
                resident = in_use - buf.chunk
            live[addr] = buf
            if at is not None and not _is_op(buf.op, at):
                continue
            if best is None or in_use > best[0]:
                best = (in_use, buf.op, list(live.values()))
        else:
            live.pop(addr, None)
    if best is None:
        raise SystemExit("no allocator events were recorded" if at is None else
                         f"no allocation of an op named {at!r} was recorded")
    return PeakTrace(best[0], resident or 0, best[1],
                     sorted(best[2], key=lambda b: -b.chunk))


def trace(path: str, batch: int, threads: int, step: int, at: str | None = None
          ) -> PeakTrace:
    (record,), (space,) = profiled_steps(path, batch, threads, step)
    print(f"measured step peak (allocator statistics): {format_bytes(record.peak_bytes)}")
    return peak_of(_events(space), at)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--step", type=int, default=3, help="the step traced (1 = the first)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--estimate", action="store_true",
                    help="print graphmem's estimated peak and live set beside it")
    ap.add_argument("--at", metavar="OP",
                    help="what was live when the op named OP allocated (its highest point) "
                         "instead of at the step's peak")
    a = ap.parse_args()
    t = trace(a.model, a.batch, a.threads, a.step, a.at)
    over = t.peak_in_use - t.resident
    rounding = sum(b.chunk - b.requested for b in t.live)
    what = "traced peak" if a.at is None else "traced bytes in use"
    print(f"{what} above resident: {format_bytes(over)}, at {t.op}; "
          f"{len(t.live)} buffers of the step live, {format_bytes(rounding)} of it chunk "
          "rounding")
    for b in t.live[:a.top]:
        print(f"  {format_bytes(b.chunk):>10s} (asked {format_bytes(b.requested):>10s})  {b.region:6s} "
              f"{b.shape:22s} {b.op}")
    if a.estimate:
        from graphmem.api import inspect

        doc = inspect(a.model, batch_size=a.batch).to_json()
        peak = doc["peak"]
        print(f"estimated peak: {format_bytes(doc['estimated_peak_bytes'])} at {peak['op']} "
              f"({peak['phase']})")
        for x in peak["live"][:a.top]:
            print(f"  {format_bytes(x['bytes']):>10s}  {x['shape']}  {x['name']}")


if __name__ == "__main__":
    sys.exit(main())
