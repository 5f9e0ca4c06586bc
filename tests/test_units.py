import pytest

from graphmem.errors import UsageError
from graphmem.units import format_bytes, parse_size


@pytest.mark.parametrize("text,value", [("1.5GiB", 1610612736), ("300MB", 300_000_000),
                                        ("2048", 2048), ("4 KiB", 4096), ("1e3kb", 1_000_000)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "1.2.3MB", "-5MB"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(None) == "?"
