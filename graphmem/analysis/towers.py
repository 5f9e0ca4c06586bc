"""Data-parallel towers (replicas) and the order of their collective ops.

A data-parallel training graph runs one tower per device: each its own forward and
backward pass, the gradients averaged across devices (`add_n` on a parameter device in TF1
tower code; all-reduce or collective ops under `tf.distribute`). Passes that add control
edges must keep each tower's schedule its own: an edge from one tower's op into another's
ties the two together. Here a tower is the set of ops on one device, which is how users
build them and how TF runs them; an op's tower is `tower_of(index, i)`.

Collective ops must be issued in the same order by every replica, or training hangs. Edges
only add order, so two collectives ordered in the original stay so; what a rewrite could
change is a pair the original leaves unordered, now ordered one way.
`collective_order_changes` proves on the rewritten graph that no pair changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.errors import InputError
from graphmem.graph.devices import normalize_device
from graphmem.graph.index import VARIABLE_OPS, GraphIndex

# ops that exchange data between replicas: never copied, never reordered
COLLECTIVE_OPS = frozenset({
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "CollectiveGather",
    "CollectiveGatherV2", "CollectiveBcastSend", "CollectiveBcastRecv",
    "CollectiveBcastSendV2", "CollectiveBcastRecvV2", "CollectiveAllToAllV2",
    "CollectiveAllToAllV3", "CollectiveReduceScatterV2", "CollectivePermute",
    "NcclAllReduce", "NcclReduce", "NcclBroadcast", "_NcclAllReduceSend",
    "_NcclAllReduceRecv", "AllReduce", "XlaAllReduce",
})

# walks of the order check carry one bit per collective in a machine word at a time
_CHUNK = 64


def is_collective(op: str) -> bool:
    return op in COLLECTIVE_OPS


def tower_of(index: GraphIndex, i: int) -> str:
    """The tower (device) of op i, as a comparable string ('' when unplaced)."""
    return normalize_device(index.devices[i])


@dataclass
class Towers:
    devices: list[str]  # the devices that run forward compute, sorted

    @property
    def several(self) -> bool:
        return len(self.devices) > 1


def find_towers(index: GraphIndex, ops: set[int]) -> Towers:
    """The towers among `ops` (forward activation ops): the devices that read one variable
    each with ops of their own (TF1 tower code shares the variables), or that run
    collective ops (`tf.distribute` mirrors a variable per device and all-reduces the
    gradients). Other placements are not towers: an input pipeline pinned to the CPU of a
    GPU model reads no variable, and a model split across devices reads each variable on
    one. Linear in the ops' inputs."""
    readers: dict[int, set[str]] = {}  # variable -> devices of the ops reading it
    for i in ops:
        device = tower_of(index, i)
        if not device:
            continue
        for s, _ in index.data_inputs[i]:
            variable = _variable_read(index, s)
            if variable is not None:
                readers.setdefault(variable, set()).add(device)
    devices = set()
    for found in readers.values():
        if len(found) > 1:
            devices |= found
    by_collective = {tower_of(index, i) for i in collectives(index)} - {""}
    if len(by_collective) > 1:
        devices |= by_collective
    return Towers(sorted(devices))


def _variable_read(index: GraphIndex, s: int) -> int | None:
    """The variable behind op s when s reads one (a ReadVariableOp of a handle, a ref
    variable or its `read` Identity)."""
    op = index.ops[s]
    if op in VARIABLE_OPS:
        return s
    if op in ("ReadVariableOp", "Identity") and index.data_inputs[s]:
        v = index.data_inputs[s][0][0]
        if index.ops[v] in VARIABLE_OPS or index.ops[v] == "_Arg" and op == "ReadVariableOp":
            return v
    return None


def collectives(index: GraphIndex) -> list[int]:
    return [i for i, op in enumerate(index.ops) if op in COLLECTIVE_OPS]


def collective_order(index: GraphIndex, ids: list[int]) -> list[int]:
    """For each collective of `ids` (in that order), a bitmask of the collectives of `ids`
    that it depends on (data or control, transitively). One topological walk per 64
    collectives; each walk holds one word per op, never a set per op."""
    slot = {c: k for k, c in enumerate(ids)}
    out = [0] * len(ids)
    preds = index.ordering_preds
    for start in range(0, len(ids), _CHUNK):
        chunk = {c: slot[c] - start for c in ids[start:start + _CHUNK]}
        mask = [0] * len(index)
        for i in index.topo:
            m = 0
            for p in preds(i):
                m |= mask[p]
            if i in slot:
                out[slot[i]] |= m << start
            bit = chunk.get(i)
            if bit is not None:
                m |= 1 << bit
            mask[i] = m
    return out


@dataclass
class OrderChange:
    first: str
    second: str


def collective_order_changes(before: GraphIndex, after: GraphIndex,
                             limit: int = 5) -> list[OrderChange]:
    """Pairs of collective ops the original leaves unordered that the rewritten graph
    orders (the rewritten graph keeps the original's node ids: passes only append). Copies
    of collectives count as a change too: a replica would issue one twice."""
    ids = collectives(before)
    copies = [i for i in collectives(after) if i >= len(before)]
    changes = [OrderChange(after.names[i], after.names[i]) for i in copies[:limit]]
    if len(ids) < 2 or changes:
        return changes
    old, new = collective_order(before, ids), collective_order(after, ids)
    for k, (a, b) in enumerate(zip(old, new, strict=True)):
        extra = b & ~a
        while extra and len(changes) < limit:
            low = extra & -extra
            changes.append(OrderChange(before.names[ids[low.bit_length() - 1]],
                                       before.names[ids[k]]))
            extra ^= low
    return changes


def check_collective_order(before: GraphIndex, after: GraphIndex) -> None:
    """Refuse a rewrite that copies a collective op or orders two collectives the original
    leaves unordered: replicas must issue collectives in one order."""
    changes = collective_order_changes(before, after)
    if not changes:
        return
    c = changes[0]
    what = (f"copies the collective op {c.first}" if c.first == c.second else
            f"would make {c.second} wait for {c.first}, two collective ops the original "
            "leaves unordered")
    raise InputError(f"the rewrite {what} (replicas must issue collectives in one order); "
                     "no rewrite written: try --no-early-updates, or name checkpoints "
                     "with --checkpoints")


def busiest_tower(peak_by_device: dict[str, int]) -> tuple[str, int] | None:
    """The device with the highest peak among several devices of one kind (data-parallel
    towers, `/device:CPU:0`, `/device:CPU:1`, ...), each with memory of its own: what runs
    out of memory first. None for a step on one device, or on one of each kind (a swap's
    GPU and its host, whose memory is not the one being saved)."""
    kinds: dict[str, list[str]] = {}
    for device in peak_by_device:
        if device:
            kinds.setdefault(device.rpartition(":")[0], []).append(device)
    towers = [d for devices in kinds.values() if len(devices) > 1 for d in devices]
    if not towers:
        return None
    device = max(towers, key=peak_by_device.__getitem__)
    return device, peak_by_device[device]


def gated_peak(peak_bytes: int, peak_by_device: dict[str, int]) -> tuple[int, str]:
    """The peak a `--max-peak` gate compares: across towers the busiest one's
    (`busiest_tower`); else the step's. Returns (bytes, what to call it)."""
    busiest = busiest_tower(peak_by_device)
    if busiest is not None:
        return busiest[1], f"estimated step peak on {busiest[0]} (the highest device)"
    return peak_bytes, "estimated step peak"
