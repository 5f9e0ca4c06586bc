"""benchmarks/trace_peak.py: the highest point of a step's allocator events, overall and at
one op (what was live when that op allocated)."""

import pytest

from benchmarks.trace_peak import peak_of


def _alloc(t, addr, op, requested, chunk, in_use):
    return (t, "MemoryAllocation", {"allocator_name": "cpu", "addr": addr, "tf_op": op,
                                    "region_type": "output", "shape": "[4]",
                                    "requested_bytes": requested, "allocation_bytes": chunk,
                                    "bytes_allocated": in_use})


def _free(t, addr, in_use):
    return (t, "MemoryDeallocation", {"allocator_name": "cpu", "addr": addr,
                                      "bytes_allocated": in_use})


EVENTS = [
    _alloc(1, 10, "call/a", 100, 100, 1100),  # 1000 resident before the step
    _alloc(2, 11, "call/grad/b", 200, 256, 1356),
    _free(3, 10, 1256),
    _alloc(4, 12, "call/grad/c", 50, 64, 1320),
    _alloc(5, 13, "call/x/grad/b", 300, 300, 1620),  # another op whose name ends like b's
    _free(6, 13, 1320),
]


def test_the_step_peak_and_its_live_buffers():
    t = peak_of(EVENTS)
    assert (t.peak_in_use, t.resident, t.op) == (1620, 1000, "call/x/grad/b")
    assert [b.op for b in t.live] == ["call/x/grad/b", "call/grad/b", "call/grad/c"]


def test_at_an_op_what_was_live_when_it_allocated():
    t = peak_of(EVENTS, at="grad/c")
    assert (t.peak_in_use, t.op) == (1320, "call/grad/c")
    assert sorted(b.op for b in t.live) == ["call/grad/b", "call/grad/c"]
    # a graph name matches the profiler's whole name or its tail after a "/", not a part
    assert peak_of(EVENTS, at="call/grad/b").op == "call/grad/b"
    assert peak_of(EVENTS, at="x/grad/b").op == "call/x/grad/b"


def test_an_op_never_allocating_is_an_error():
    for at in ("rad/c", "d"):
        with pytest.raises(SystemExit, match="no allocation of an op named"):
            peak_of(EVENTS, at=at)
