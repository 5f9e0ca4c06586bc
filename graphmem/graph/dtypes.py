"""Byte sizes of TensorFlow dtypes (types.proto enum values); ref types are base + 100."""

from __future__ import annotations

_SIZES = {
    1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 7: 0, 8: 8, 9: 8, 10: 1, 11: 1, 12: 1, 13: 4,
    14: 2, 15: 2, 16: 2, 17: 2, 18: 16, 19: 2, 20: 0, 21: 0, 22: 4, 23: 8,
    24: 1, 25: 1, 26: 1, 27: 1, 28: 1, 29: 1, 30: 1, 31: 1, 32: 1, 33: 1,
}
_NAMES = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    8: "complex64", 9: "int64", 10: "bool", 14: "bfloat16", 17: "uint16", 18: "complex128",
    19: "float16", 20: "resource", 21: "variant", 22: "uint32", 23: "uint64",
}
FLOAT = 1
INT32 = 3
STRING = 7
INT64 = 9
BOOL = 10
RESOURCE = 20
HALF = 19  # float16
BFLOAT16 = 14
FLOATS = frozenset({1, 2, 14, 19})  # float32, float64, bfloat16, float16
VARIANT = 21


def base(dtype: int) -> int:
    return dtype - 100 if dtype > 100 else dtype


def is_ref(dtype: int) -> bool:
    return dtype > 100


def itemsize(dtype: int) -> int | None:
    """Bytes per element; None when the size is not a property of the dtype (strings)."""
    size = _SIZES.get(base(dtype))
    if size == 0 and base(dtype) == STRING:
        return None
    return size


def name(dtype: int) -> str:
    return _NAMES.get(base(dtype), f"dtype{base(dtype)}") + ("_ref" if is_ref(dtype) else "")
