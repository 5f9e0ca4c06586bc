"""Tensor and input names as GraphDefs write them: `op`, `op:k`, `^op`."""

from __future__ import annotations

# the scope of the recompute pass's copies: a copy of `a/b` is `graphmem_recompute/<k>/a/b`
# (named here so the workspace maps copies to their originals without importing a pass)
COPY_SCOPE = "graphmem_recompute"


def parse_input(text: str) -> tuple[str, int, bool]:
    """Return (node name, output index, is_control) for one NodeDef input string."""
    if text.startswith("^"):
        return text[1:], -1, True
    name, sep, idx = text.rpartition(":")
    if sep and idx.isdigit():
        return name, int(idx), False
    return text, 0, False


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


def original_name(name: str) -> str:
    """The op a recompute copy was made from (the name itself for any other op)."""
    if name.startswith(COPY_SCOPE + "/"):
        return name.split("/", 2)[2]
    return name
