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
"""

from __future__ import annotations

from bisect import bisect_left, insort

MIN_ALLOCATION = 256
NUM_BINS = 21
MAX_INTERNAL_FRAGMENTATION = 128 << 20
INITIAL_REGION = 2 << 20
_REGION_GAP = 1 << 12  # regions are separate allocations: never adjacent


def rounded_bytes(n: int) -> int:
    return max(MIN_ALLOCATION, -(-n // MIN_ALLOCATION) * MIN_ALLOCATION)


def _bin(size: int) -> int:
    """Sizes are multiples of 256 here: bin b holds [256 * 2**b, 256 * 2**(b + 1))."""
    b = (size >> 8).bit_length() - 1
    return b if b < NUM_BINS else NUM_BINS - 1


class BFCAllocator:
    """One device's allocator. `allocate` returns a handle (the chunk's address) that
    `free` takes back; `in_use` and `peak` count chunk sizes, as TF's statistics do."""

    def __init__(self) -> None:
        self.region_bytes = INITIAL_REGION
        self._next_base = 0
        self._size: dict[int, int] = {}  # chunk address -> size (every chunk)
        self._used: set[int] = set()
        self._before: dict[int, int] = {}  # chunk address -> the chunk just below it
        self._bins: list[list[tuple[int, int]]] = [[] for _ in range(NUM_BINS)]
        self._nonempty = 0  # bit b set: bin b holds a free chunk
        self.in_use = 0
        self.peak = 0
        self.regions = 0

    def allocate(self, nbytes: int) -> int:
        need = rounded_bytes(nbytes)
        addr = self._take(need)
        if addr is None:
            self._extend(need)
            addr = self._take(need)
        self._used.add(addr)
        self.in_use += self._size[addr]
        if self.in_use > self.peak:
            self.peak = self.in_use
        return addr

    def free(self, addr: int) -> None:
        self._used.remove(addr)
        size = self._size[addr]
        self.in_use -= size
        above = addr + size
        if above in self._size and above not in self._used:
            self._unbin(above)
            self._merge(addr, above)
        below = self._before.get(addr)
        if below is not None and below not in self._used:
            self._unbin(below)
            self._merge(below, addr)
            addr = below
        self._rebin(addr)

    def chunk_size(self, addr: int) -> int:
        return self._size[addr]

    # ---- internals ------------------------------------------------------------------
    def _take(self, need: int) -> int | None:
        """The smallest free chunk of at least `need` bytes (lowest address among equal
        sizes), split when much larger."""
        b = _bin(need)
        nonempty = self._nonempty >> b
        while nonempty:
            if nonempty & 1:
                chunks = self._bins[b]
                k = bisect_left(chunks, (need, -1))
                if k < len(chunks):
                    size, addr = chunks.pop(k)
                    if not chunks:
                        self._nonempty &= ~(1 << b)
                    if size >= 2 * need or size - need >= MAX_INTERNAL_FRAGMENTATION:
                        self._split(addr, need)
                    return addr
            nonempty >>= 1
            b += 1
        return None

    def _split(self, addr: int, need: int) -> None:
        rest = addr + need
        rest_size = self._size[addr] - need
        self._size[addr] = need
        self._size[rest] = rest_size
        self._before[rest] = addr
        if rest + rest_size in self._size:
            self._before[rest + rest_size] = rest
        self._rebin(rest)

    def _merge(self, low: int, high: int) -> None:
        """Chunk `high` (just above `low`) becomes part of `low`."""
        top = high + self._size[high]
        self._size[low] += self._size.pop(high)
        del self._before[high]
        if top in self._size:
            self._before[top] = low

    def _extend(self, need: int) -> None:
        grew = False
        while need > self.region_bytes:
            self.region_bytes *= 2
            grew = True
        addr = self._next_base
        self._next_base += self.region_bytes + _REGION_GAP
        self._size[addr] = self.region_bytes
        self._rebin(addr)
        self.regions += 1
        if not grew:
            self.region_bytes *= 2

    def _rebin(self, addr: int) -> None:
        size = self._size[addr]
        b = _bin(size)
        insort(self._bins[b], (size, addr))
        self._nonempty |= 1 << b

    def _unbin(self, addr: int) -> None:
        size = self._size[addr]
        b = _bin(size)
        chunks = self._bins[b]
        del chunks[bisect_left(chunks, (size, addr))]
        if not chunks:
            self._nonempty &= ~(1 << b)
