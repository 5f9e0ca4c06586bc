"""Tensor and input names as GraphDefs write them: `op`, `op:k`, `^op`."""

from __future__ import annotations

import re

# the recompute pass's copies: a copy of `a/b` is `a/b/graphmem_recompute_<segment>`
# (named here so the workspace maps copies to their originals without importing a pass).
# Named after the original op, a copy sorts beside it: Grappler's common subgraph
# elimination orders a commutative op's inputs by name, and MinimizeBroadcasts then keeps
# that order among operands of one shape, so a copy named under a scope of its own made TF
# multiply a gradient's operands in another order than the original's (rounding differs)
COPY_SCOPE = "graphmem_recompute"
_COPY_SUFFIX = re.compile(r"/" + COPY_SCOPE + r"_[A-Za-z0-9_]+$")
_FIRST_COPY = re.compile(r"/" + COPY_SCOPE + r"_s([0-9]+)(?::[0-9]+)?$")
# the Identities that hold a recompute group's first copies back (passes/recompute.py): an
# input `a/b:k` of group 7 is held by `a/b/hold_k/graphmem_hold_7`
HOLD_SCOPE = "graphmem_hold"
_HOLD_SUFFIX = re.compile(r"/hold_[0-9]+/" + HOLD_SCOPE + r"_[A-Za-z0-9_]+$")
# the Identities Grappler keeps between an op and the sum or product reading it
# (passes/reader_barriers.py): `a/b/graphmem_barrier`
BARRIER_SCOPE = "graphmem_barrier"
# every op a pass adds has a name component starting with this (graphmem_recompute/,
# graphmem_swap/, .../graphmem_in_place/, ...)
OWN_PREFIX = "graphmem_"

# Output indices at or past this are all read as this one (and refused by the index): the
# compiled reader (graphmem/_native.c, resolve_input) saturates at the same value, so both
# readers agree on every input string.
INDEX_LIMIT = 10**18


def parse_input(text: str) -> tuple[str, int, bool]:
    """Return (node name, output index, is_control) for one NodeDef input string.
    The index is ASCII digits after the last ':', as TensorFlow reads it (leading zeros
    allowed); str.isdigit alone would also take '²', '١' or '𝟘'. Anything else after the
    colon is part of the node's name."""
    if text.startswith("^"):
        return text[1:], -1, True
    name, sep, idx = text.rpartition(":")
    if sep and idx.isascii() and idx.isdigit():
        return name, output_index(idx), False
    return text, 0, False


def output_index(digits: str) -> int:
    """The value of an ASCII digit string, saturated at INDEX_LIMIT (without building a
    4,000-digit int, which Python refuses)."""
    digits = digits.lstrip("0")
    if not digits:
        return 0
    return int(digits) if len(digits) < 19 else INDEX_LIMIT


def tensor_name(node: str, index: int) -> str:
    return f"{node}:{index}"


def input_string(node: str, index: int) -> str:
    """The canonical input string; output 0 is written without a suffix, as TF does."""
    return node if index == 0 else f"{node}:{index}"


def parse_tensor(text: str) -> tuple[str, int]:
    name, idx, control = parse_input(text)
    if control:
        raise ValueError(f"{text!r} names a control input, not a tensor")
    return name, idx


def made_by_graphmem(name: str) -> bool:
    """Whether a pass of graphmem added the op (a copy, a swap, a piece of a sum)."""
    return name.startswith(OWN_PREFIX) or "/" + OWN_PREFIX in name


def copy_name(original: str, segment: str) -> str:
    """The name of the copy of op `original` that recomputes it for `segment` (`s3`,
    `s3_late1`, a tower's `tcpu0s3`)."""
    return f"{original}/{COPY_SCOPE}_{segment}"


def hold_name(op: str, output: int, group: str) -> str:
    """The name of the Identity of `op:output` that holds back the copies of `group`."""
    return f"{op}/hold_{output}/{HOLD_SCOPE}_{group}"


def barrier_name(op: str) -> str:
    """The name of the Identity through which op `op`'s one reader reads it."""
    return f"{op}/{BARRIER_SCOPE}"


def is_hold(name: str) -> bool:
    return _HOLD_SUFFIX.search(name) is not None


def copy_segment(name: str) -> int | None:
    """The segment number of a recompute copy's first copy (`.../graphmem_recompute_s3`,
    with or without an output index): None for any other op, a late copy or a tower's."""
    m = _FIRST_COPY.search(name)
    return int(m.group(1)) if m else None


def is_copy(name: str) -> bool:
    """Whether op `name` is a recompute copy."""
    return _COPY_SUFFIX.search(name) is not None


def original_name(name: str) -> str:
    """The op a recompute copy was made from (the name itself for any other op)."""
    m = _COPY_SUFFIX.search(name)
    return name[:m.start()] if m else name
