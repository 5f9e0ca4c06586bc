"""Printing rich tables the same way in every report."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def print_table(console: Console, table: Table) -> None:
    """A table with its title on a line of its own: rich wraps a title to the table's
    width, which breaks a long title over several short lines under a narrow table."""
    if table.title:
        console.print(table.title)
        table.title = None
    console.print(table)
