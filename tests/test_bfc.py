"""The BFC allocator model on request sequences worked out by hand from bfc_allocator.cc."""

from graphmem.analysis.bfc import INITIAL_REGION, BFCAllocator, rounded_bytes

KIB, MIB = 1024, 1 << 20


def test_requests_round_up_to_256_bytes_and_split_the_first_region():
    a = BFCAllocator()
    h = a.allocate(1000)
    assert rounded_bytes(1000) == 1024 and a.chunk_size(h) == 1024
    assert a.in_use == 1024 and a.regions == 1  # a 2 MiB region, split


def test_a_free_chunk_under_twice_the_request_is_handed_out_whole():
    a = BFCAllocator()
    a.allocate(MIB)  # the 2 MiB region splits: 1 MiB taken, 1 MiB free
    h = a.allocate(600 * KIB)  # 1 MiB < 2 x 600 KiB: the whole free MiB
    assert a.chunk_size(h) == MIB
    assert a.in_use == 2 * MIB and a.regions == 1


def test_freed_neighbours_merge_and_best_fit_takes_the_merged_chunk():
    a = BFCAllocator()
    first, second, third = (a.allocate(KIB) for _ in range(3))
    a.free(first)
    a.free(second)  # merges with the free chunk below it: 2 KiB at the region's start
    h = a.allocate(1536)  # the 2 KiB chunk fits and is under twice 1.5 KiB: taken whole
    assert h == first and a.chunk_size(h) == 2 * KIB
    assert a.in_use == 3 * KIB
    a.free(third)  # merges with the rest of the region above it
    a.free(h)  # and everything is one free region again
    assert a.allocate(INITIAL_REGION) == first and a.regions == 1


def test_regions_grow_by_doubling():
    a = BFCAllocator()
    big = a.allocate(3 * MIB)  # 3 MiB > 2 MiB: the region size doubles to 4 MiB
    assert a.chunk_size(big) == 4 * MIB  # and is not split (4 < 2 x 3 MiB)
    small = a.allocate(MIB)  # nothing free: another 4 MiB region (it grew already),
    assert a.chunk_size(small) == MIB and a.regions == 2  # split
    assert a.region_bytes == 8 * MIB  # the next region doubles


def test_peak_counts_chunks_and_stays_after_frees():
    a = BFCAllocator()
    a.allocate(MIB)
    h = a.allocate(600 * KIB)
    a.free(h)
    assert a.in_use == MIB and a.peak == 2 * MIB
    # the freed MiB merged back with nothing (its neighbour below is in use) and is reused
    h = a.allocate(700 * KIB)
    assert a.chunk_size(h) == MIB and a.regions == 1


def test_the_estimate_counts_the_chunks_a_chain_gets():
    # x (8 KiB) -> a1 -> a2 -> a3 (16 KiB each). By requests, 32 KiB at a time. In the
    # allocator, a1's chunk and x's merge when both are free (24 KiB); a3 asks for 16 KiB,
    # the best fit is that 24 KiB chunk, under twice the request: a3 gets all of it
    from graphmem.analysis.memory import estimate_memory
    from tests.graphbuilder import G

    g = G()
    g.op("x", "Placeholder", shape=(2048,))
    g.op("a1", "Op", "x", shape=(4096,))
    g.op("a2", "Op", "a1", shape=(4096,))
    g.op("a3", "Op", "a2", shape=(4096,))
    ix = g.index()
    assert estimate_memory(ix, allocator=False).peak_bytes == 32 * KIB
    est = estimate_memory(ix)
    assert est.peak_bytes == 16 * KIB + 24 * KIB and est.peak_op == "a3"


def test_a_variable_that_takes_a_buffer_frees_its_old_chunk():
    """Keras' slot updates: `AssignVariableOp` moves its value's buffer into the variable.
    The variable's old chunk is freed then and the value's chunk stays allocated after the
    step (its own free is left alone): the next step starts from another state."""
    from graphmem.analysis.bfc import ADOPT, _run_step

    a = BFCAllocator()
    owned = [(a, a.allocate(MIB))]  # the variable, first in the first region
    old = owned[0][1]
    events = [("m", "cpu", MIB, 0), ("m", 0, ADOPT), ("m", None)]
    _run_step(events, {"cpu": a}, owned, None, False)
    assert owned[0][1] != old  # the variable now lives in m's chunk
    assert a.in_use == a.chunk_size(owned[0][1]) == MIB  # and its old chunk is free
    _run_step([e for e in events if len(e) != 3], {"cpu": a}, owned, None, False)
    assert a.in_use == MIB  # without the move, the value is freed as any other


def test_an_assign_that_reads_its_value_last_moves_it_into_the_variable(monkeypatch):
    import graphmem.analysis.memory as memory
    from graphmem.analysis.bfc import ADOPT
    from tests.graphbuilder import G

    seen = _replayed_events(monkeypatch)

    def slot_update(extra_reader: bool) -> None:
        g = G()
        v = g.op("m", "VarHandleOp", shape=(), dtype=20)
        v.attr["dtype"].type = 1
        v.attr["shape"].shape.dim.add(size=65536)
        g.op("read", "ReadVariableOp", "m", shape=(65536,))
        g.op("g", "Placeholder", shape=(65536,))
        g.op("new", "Mul", "read", "g", shape=(65536,))
        g.op("assign", "AssignVariableOp", "m", "new", n_out=0)
        if extra_reader:
            g.op("later", "Relu", "new", "^assign", shape=(65536,))
        memory.estimate_memory(g.index(), schedule="topological")

    slot_update(False)
    slot_update(True)  # the value is still to be read: TF copies it instead
    adopted = [[e for e in events if len(e) == 3] for events in seen]
    assert len(adopted[0]) == 1 and adopted[0][0][1:] == (0, ADOPT)
    assert adopted[1] == []


def test_an_update_that_copies_its_variable_moves_it_to_the_copy(monkeypatch):
    """Copy-on-write: `AssignAddVariableOp` on a weight the step still holds a read of
    writes a new buffer, which the variable keeps; its old chunk is freed with the read's
    last reader. The replay hands the copy to the variable at that point (an adopt event
    before the copy's free) when the sizes match, and leaves updates in place alone."""
    import graphmem.analysis.memory as memory
    from graphmem.analysis.bfc import ADOPT
    from tests.graphbuilder import G

    seen = _replayed_events(monkeypatch)

    def weight_update(read_still_needed: bool) -> None:
        g = G()
        v = g.op("w", "VarHandleOp", shape=(), dtype=20)
        v.attr["dtype"].type = 1
        v.attr["shape"].shape.dim.add(size=65536)
        g.op("read", "ReadVariableOp", "w", shape=(65536,))
        g.op("x", "Placeholder", shape=(65536,))
        g.op("y", "Mul", "read", "x", shape=(65536,))
        g.op("delta", "Neg", "y", shape=(65536,))
        if read_still_needed:  # the read is consumed after the update
            g.op("update", "AssignAddVariableOp", "w", "delta", n_out=0)
            g.op("late", "Relu", "read", "^update", shape=(65536,))
        else:
            g.op("update", "AssignAddVariableOp", "w", "delta", n_out=0)
        memory.estimate_memory(g.index(), schedule="topological")

    weight_update(True)
    weight_update(False)
    moves = [[e for e in events if len(e) == 3] for events in seen]
    assert len(moves[0]) == 1 and moves[0][0][1:] == (0, ADOPT)
    copy = moves[0][0][0]
    events = seen[0]
    # the copy is allocated by the update, and handed over just before its own free
    assert any(len(e) == 4 and e[0] == copy for e in events)
    at = events.index(moves[0][0])
    assert events[at + 1] == (copy, None)
    assert moves[1] == []  # written in place: nothing moves


def _replayed_events(monkeypatch) -> list[list[tuple]]:
    """The allocator events of every step the simulation replays from now on."""
    import graphmem.analysis.memory as memory

    seen: list[list[tuple]] = []
    real = memory.replay_step
    monkeypatch.setattr(memory, "replay_step",
                        lambda events, *rest: seen.append(list(events)) or real(events, *rest))
    return seen
