"""TensorFlow's BFC allocator, simulated: what a measured peak counts is chunks.

TF's allocator statistics (`get_memory_info`, the numbers `graphmem verify` reads) add up
the sizes of the chunks handed out, and a chunk can be larger than its request: a free chunk
is split only when it is at least twice the rounded request (or the rest would waste 128 MiB),
so a request often gets a whole chunk up to twice its size. Which chunk it gets depends on
what the step freed before, in which order: rewritten steps, which free and reuse buffers of
many sizes, were measured up to 11% above their requests, and a 19.5 MB convolution scratch
buffer was traced in a 23-32 MB chunk. This module follows `bfc_allocator.cc` (TF 2.21):

- requests are rounded up to 256 bytes; 21 bins of free chunks by size class (powers of
  two from 256 bytes), each ordered by (size, address); a request takes the first chunk
  large enough, searching its own bin and then the larger ones (best fit);
- the chunk is split when it is at least twice the request (or 128 MiB larger); on free a
  chunk merges with its free neighbours in the same region;
- when nothing fits, a new region is taken from the system: 2 MiB at first (TF's CPU
  allocator grows, `allow_growth`), doubled until the request fits, and doubled again for
  the next region when it was large enough already. Regions are never merged.

Cost: a dictionary update and a binary search per event, per bin searched (at most 21).
A step's replay (`replay_step`) runs in C when graphmem's extension is built (native.py);
the Python classes here are its reference.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

from graphmem.native import native

MIN_ALLOCATION = 256
NUM_BINS = 21
MAX_INTERNAL_FRAGMENTATION = 128 << 20
INITIAL_REGION = 2 << 20
_REGION_GAP = 1 << 12  # regions are separate allocations: never adjacent
MAX_REGION = 1 << 52  # no bigger region: sizes stay inside the C replay's 64 bits


@dataclass
class StepPeaks:
    """What TF's allocator statistics count over a measured step (chunk bytes above what
    was in use when it began)."""

    peak: int = 0  # of all devices but the host
    peak_pos: int = 0  # the position of the op whose allocation reached it
    peak_dev: dict[str, int] = field(default_factory=dict)
    host_peak: int = 0
    timeline: list[int] = field(default_factory=list)  # bytes in use at each marked op
    # the highest `peak` over the steps replayed (more than one when variables move
    # between chunks, see replay_step); `peak` is the first measured step's
    highest: int = 0


ADOPT = "adopt"  # the third field of an event (buffer, variable's place, ADOPT)
# A five-field event (buffer, device, bytes, position, k) is a copy the first step makes of
# variable `persistent[k]`: the variable takes the new chunk and its old one stays in use.
# TF1 sessions do this once: a variable initialized from a constant shares the constant's
# buffer, so its first in-place update writes a copy (memory.py), left among the chunks
# the first step freed. Later steps skip the event.
# steps replayed after the first when variables take over buffers (Keras' slots): their
# chunks move every step, and so does the rounding; the highest step counts. The layout
# wanders for dozens of steps before it settles, if it does (Keras' VGG16 step of the model
# sweep: replayed peaks of 70-83 MiB over 12 steps, 98 MiB at step 46; measured steps of
# 61-104 MiB over 110), so a training run's first 110 steps, TF's warm-up and the start of
# its steady state, are replayed, fewer where that would replay more than MOVING_EVENTS
# events (never fewer than MIN_MOVING_STEPS)
# an allocation whose buffer key's second field is UNRANKED counts in `highest` alone, not
# in the `peak` that ranks plans (oneDNN's workspaces, memory.py: plans are still ranked
# as they were measured before those were modelled)
UNRANKED = -(1 << 30)
MOVING_STEPS = 110
MIN_MOVING_STEPS = 12
MOVING_EVENTS = 20_000_000


def replay_step(events: list[tuple], persistent: list[tuple[str, int]], host: str | None,
                keep_timeline: bool) -> StepPeaks:
    """One allocator per device, holding the persistent buffers first, then the step twice,
    as measured: the first step grows the allocators' regions and leaves them free; the
    second is the one measured, from what was in use when it began. Events, in order:
    (buffer, device, bytes, position) allocates, (buffer, None) frees, (position,) marks an
    op running (for the timeline), (buffer, k, ADOPT) hands the buffer to the variable
    `persistent[k]`, whose chunk is freed (the buffer's own free is then left alone).
    With such events the allocator's state differs from step to step: `peak` is replayed
    with the variables kept in place (the same every time: it ranks plans), `highest` is
    the highest of that and of the steps after the first (`moving_steps`) with the variables
    moving (what a training run may reach). So with first-step copies (five fields, above):
    `peak` without them, `highest` also over the steps after a first step that makes them.
    `host`'s allocator is left out of `peak`."""
    try:
        return _replay_step(events, persistent, host, keep_timeline)
    except OverflowError:  # absurd sizes: a huge batch size or `_output_shapes` dim
        from graphmem.errors import InputError

        raise InputError("cannot estimate memory: the step needs more than 4 PiB on one "
                         "device (check --batch-size and the graph's shapes)") from None


def _replay_step(events: list[tuple], persistent: list[tuple[str, int]], host: str | None,
                 keep_timeline: bool) -> StepPeaks:
    moving = any(len(ev) == 3 for ev in events)
    copies = any(len(ev) == 5 for ev in events)
    unranked = any(len(ev) == 4 and _unranked(ev[0]) for ev in events)
    if moving or copies or unranked:  # the steps the variables stay put in: the same
        # every time, they rank plans
        peaks = _replay_step([ev for ev in events if _ranked(ev)], persistent, host,
                             keep_timeline)
        # without moves, every step after the first starts from the same state: one is
        # enough
        steps = moving_steps(len(events)) if moving else 1
        peaks.highest = max(peaks.peak, _highest_moving_step(events, persistent, host, steps))
        return peaks
    if native is not None:
        peak, peak_pos, peak_dev, host_peak, timeline = native.replay_step(
            events, persistent, host, keep_timeline)
        return StepPeaks(peak, peak_pos, peak_dev, host_peak, timeline or [], peak)
    allocators, owned, hosted = _allocators(events, persistent, host)
    _run_step(events, allocators, owned, hosted, False)
    peaks = _run_step(events, allocators, owned, hosted, keep_timeline)
    peaks.host_peak = peaks.peak_dev.get(host, 0) if host is not None else 0
    return peaks


def _ranked(ev: tuple) -> bool:
    """Whether an event counts in the peak that ranks plans."""
    n = len(ev)
    return n == 1 or (n in (2, 4) and not _unranked(ev[0]))


def _unranked(buffer) -> bool:
    return type(buffer) is tuple and len(buffer) > 1 and buffer[1] == UNRANKED


def _highest_moving_step(events: list[tuple], persistent: list[tuple[str, int]],
                         host: str | None, steps: int) -> int:
    """The highest peak of `steps` steps after the first, variables taking over buffers as
    the events say (the first step also making its copies)."""
    if native is not None:
        return native.replay_moving(events, persistent, host, steps)
    allocators, owned, hosted = _allocators(events, persistent, host)
    _run_step(events, allocators, owned, hosted, False, first=True)
    return max(_run_step(events, allocators, owned, hosted, False).peak
               for _ in range(steps))


def moving_steps(events: int) -> int:
    """How many steps after the first a step of `events` allocator events is replayed
    with its variables moving."""
    return max(MIN_MOVING_STEPS, min(MOVING_STEPS, MOVING_EVENTS // max(events, 1)))


def _allocators(events: list[tuple], persistent: list[tuple[str, int]], host: str | None
                ) -> tuple[dict[str, BFCAllocator], list, BFCAllocator | None]:
    """One allocator per device holding the persistent buffers (each variable's chunk in
    `owned`), and the host's."""
    allocators: dict[str, BFCAllocator] = {}
    owned: list[tuple[BFCAllocator, int]] = []
    for dev, b in persistent:
        a = allocators.setdefault(dev, BFCAllocator())
        owned.append((a, a.allocate(b)))
    for ev in events:
        if len(ev) >= 4 and ev[1] not in allocators:
            allocators[ev[1]] = BFCAllocator()
    return allocators, owned, allocators.get(host) if host is not None else None


def _run_step(events: list[tuple], allocators: dict[str, BFCAllocator],
              owned: list[tuple[BFCAllocator, int]], hosted: BFCAllocator | None,
              keep_timeline: bool, first: bool = False) -> StepPeaks:
    """One step through the allocators, from their state; its peaks above what was in use
    when it began. What the step leaves allocated is freed at its end. The `first` step
    makes the variables' copies (five-field events); the others skip them."""
    handles: dict = {}
    base = {d: a.in_use for d, a in allocators.items()}
    for a in allocators.values():
        a.peak = a.in_use
    step = start = sum(a.in_use for a in allocators.values() if a is not hosted)
    peak = peak_pos = 0
    timeline: list[int] = []
    for ev in events:
        n = len(ev)
        if n == 4:
            a = allocators[ev[1]]
            before = a.in_use
            handles[ev[0]] = (a, a.allocate(ev[2]))
            if a is not hosted:
                step += a.in_use - before
                if step - start > peak:
                    peak, peak_pos = step - start, ev[3]
        elif n == 1:
            if keep_timeline:
                timeline.append(step - start)
        elif n == 5:
            if first and owned:
                a = allocators[ev[1]]
                before = a.in_use
                owned[ev[4]] = (a, a.allocate(ev[2]))  # the old chunk stays in use
                if a is not hosted:
                    step += a.in_use - before
        else:
            found = handles.pop(ev[0], None)
            if found is None:
                continue
            if n == 3:  # the variable takes the buffer; its old chunk is the one freed
                owned[ev[1]], found = found, owned[ev[1]]
            a = found[0]
            before = a.in_use
            a.free(found[1])
            if a is not hosted:
                step += a.in_use - before
    for a, h in handles.values():
        a.free(h)
    return StepPeaks(peak, peak_pos,
                     {d: a.peak - base[d] for d, a in allocators.items() if a.peak > base[d]},
                     0, timeline, peak)


def rounded_bytes(n: int) -> int:
    return max(MIN_ALLOCATION, -(-n // MIN_ALLOCATION) * MIN_ALLOCATION)


def _bin(size: int) -> int:
    """Sizes are multiples of 256 here: bin b holds [256 * 2**b, 256 * 2**(b + 1))."""
    b = (size >> 8).bit_length() - 1
    return b if b < NUM_BINS else NUM_BINS - 1


class BFCAllocator:
    """One device's allocator. `allocate` returns a handle (the chunk's address) that
    `free` takes back; `in_use` and `peak` count chunk sizes, as TF's statistics do.

    Written for speed (the estimator replays every allocation of a step twice): a bin
    holds each free chunk as one integer, `size << 64 | address`, which sorts as
    the pair (size, address) does but compares and searches faster, and the hot paths are
    inlined into `allocate` and `free`."""

    def __init__(self) -> None:
        self.region_bytes = INITIAL_REGION
        self._next_base = 0
        self._size: dict[int, int] = {}  # chunk address -> size (every chunk)
        self._free: dict[int, int] = {}  # chunk address -> size (the free chunks)
        self._before: dict[int, int] = {}  # chunk address -> the chunk just below it
        # per bin, its free chunks as `size << 64 | address`, sorted
        self._bins: list[list[int]] = [[] for _ in range(NUM_BINS)]
        self._nonempty = 0  # bit b set: bin b holds a free chunk
        self.in_use = 0
        self.peak = 0
        self.regions = 0

    def allocate(self, nbytes: int) -> int:
        """The smallest free chunk of at least the rounded request (lowest address among
        equal sizes), split when much larger (the rest is binned as a free chunk); when
        none fits, a new region, and the search again."""
        need = (nbytes + MIN_ALLOCATION - 1) & -MIN_ALLOCATION  # rounded_bytes, inline
        if need < MIN_ALLOCATION:
            need = MIN_ALLOCATION
        first = (need >> 8).bit_length() - 1  # _bin, inline
        if first >= NUM_BINS:
            first = NUM_BINS - 1
        least = need << _ADDRESS_BITS  # sorts before any chunk of `need` bytes or more
        bins = self._bins
        while True:
            b = first
            nonempty = self._nonempty >> b
            while nonempty:
                skip = (nonempty & -nonempty).bit_length() - 1  # to the next bin holding chunks
                nonempty >>= skip
                b += skip
                chunks = bins[b]
                k = bisect_left(chunks, least)
                if k < len(chunks):
                    key = chunks.pop(k)
                    if not chunks:
                        self._nonempty &= ~(1 << b)
                    size, addr = key >> _ADDRESS_BITS, key & _ADDRESS_MASK
                    del self._free[addr]
                    if size >= 2 * need or size - need >= MAX_INTERNAL_FRAGMENTATION:
                        rest, rest_size = addr + need, size - need
                        sizes = self._size
                        sizes[addr] = need
                        sizes[rest] = self._free[rest] = rest_size
                        self._before[rest] = addr
                        if rest + rest_size in sizes:
                            self._before[rest + rest_size] = rest
                        r = (rest_size >> 8).bit_length() - 1  # bin the rest (_bin_chunk)
                        if r >= NUM_BINS:
                            r = NUM_BINS - 1
                        insort(bins[r], rest_size << _ADDRESS_BITS | rest)
                        self._nonempty |= 1 << r
                        size = need
                    in_use = self.in_use = self.in_use + size
                    if in_use > self.peak:
                        self.peak = in_use
                    return addr
                nonempty >>= 1
                b += 1
            self._extend(need)

    def free(self, addr: int) -> None:
        sizes, free, before = self._size, self._free, self._before
        if addr in free:
            raise KeyError(addr)  # freed twice
        size = sizes[addr]
        self.in_use -= size
        above = addr + size
        above_size = free.get(above)
        if above_size is not None:  # merge the free chunk above
            self._unbin(above, above_size)
            del sizes[above], before[above], free[above]
            size += above_size
            if addr + size in sizes:
                before[addr + size] = addr
        below = before.get(addr)
        if below is not None:
            below_size = free.get(below)
            if below_size is not None:  # merge into the free chunk below
                self._unbin(below, below_size)
                del sizes[addr], before[addr]
                addr, size = below, below_size + size
                if addr + size in sizes:
                    before[addr + size] = addr
        sizes[addr] = free[addr] = size
        b = (size >> 8).bit_length() - 1  # bin the chunk (_bin_chunk, inline)
        if b >= NUM_BINS:
            b = NUM_BINS - 1
        insort(self._bins[b], size << _ADDRESS_BITS | addr)
        self._nonempty |= 1 << b

    def chunk_size(self, addr: int) -> int:
        return self._size[addr]

    # ---- internals ------------------------------------------------------------------
    def _extend(self, need: int) -> None:
        grew = False
        while need > self.region_bytes and self.region_bytes <= MAX_REGION:
            self.region_bytes *= 2
            grew = True
        if self.region_bytes > MAX_REGION:  # as _native.c's bfc_extend
            raise OverflowError("the step needs more than 4 PiB on one device")
        addr = self._next_base
        self._next_base += self.region_bytes + _REGION_GAP
        self._size[addr] = self._free[addr] = self.region_bytes
        self._bin_chunk(addr, self.region_bytes)
        self.regions += 1
        if not grew:
            self.region_bytes *= 2

    def _bin_chunk(self, addr: int, size: int) -> None:
        b = (size >> 8).bit_length() - 1  # _bin, inline
        if b >= NUM_BINS:
            b = NUM_BINS - 1
        insort(self._bins[b], size << _ADDRESS_BITS | addr)
        self._nonempty |= 1 << b

    def _unbin(self, addr: int, size: int) -> None:
        b = (size >> 8).bit_length() - 1  # _bin, inline
        if b >= NUM_BINS:
            b = NUM_BINS - 1
        chunks = self._bins[b]
        del chunks[bisect_left(chunks, size << _ADDRESS_BITS | addr)]
        if not chunks:
            self._nonempty &= ~(1 << b)


_ADDRESS_BITS = 64  # addresses stay far below 2**64: regions add up to the step's bytes
_ADDRESS_MASK = (1 << _ADDRESS_BITS) - 1
