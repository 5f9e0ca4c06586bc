"""The side-by-side benchmark's table: peaks in a unit that tells small graphs apart."""

from benchmarks.side_by_side import losses_verdict, table_unit


def test_small_graphs_peaks_are_printed_in_kib_and_large_ones_in_whole_mib():
    # the fixtures' LSTM: 0.6 against 1.2 MiB, which whole MiB printed as "1" and "1"
    div, unit, places = table_unit(1.2 * 2**20)
    assert (unit, places) == ("MiB", 2)
    assert f"{0.6 * 2**20 / div:.{places}f}" != f"{1.2 * 2**20 / div:.{places}f}"
    assert table_unit(600 * 2**10)[1] == "KiB"
    assert table_unit(2500 * 2**20) == (2**20, "MiB", 0)


def test_losses_verdict_tells_a_graph_that_differs_from_processes_that_differ_anyway():
    a, b = [1.0, 0.5], [1.0, 0.50000006]
    assert losses_verdict([a, a, a], [a, a]) == "same"
    assert losses_verdict([a, a, a], [a, b]) == "DIFFER"
    # the reference's own processes differ in their last bits: not the graph's doing
    assert losses_verdict([a, b, a], [b, b]).startswith("differ, as")
    assert losses_verdict([a, b], [a, a]) == "same"
