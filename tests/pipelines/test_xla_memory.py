"""A run's per-device memory: the largest "Total bytes used" over the memory-usage reports XLA dumped."""

from meshlab.workers.run_xla import xla_memory


def test_the_largest_program_s_total_is_the_peak(tmp_path):
    (tmp_path / "module_0001.SyncTensorsGraph.memory-usage-report.txt").write_text("Total bytes used: 1000\n")
    (tmp_path / "module_0002.SyncTensorsGraph.memory-usage-report.txt").write_text(
        "Some header\nTotal bytes used: 2500 (2.44KiB)\nallocation 0: size 2500\n")
    (tmp_path / "module_0003.SyncTensorsGraph.memory-usage-report.txt").write_text("no total in this one\n")
    (tmp_path / "module_0004.SyncTensorsGraph.after_optimizations.txt").write_text("Total bytes used: 9999\n")
    found = xla_memory(tmp_path)
    assert (found["peak_bytes_per_device"], found["programs"]) == (2500, 2)  # the HLO text is not a report


def test_no_dump_or_no_report_is_none(tmp_path):
    assert xla_memory(tmp_path / "missing") is None
    assert xla_memory(tmp_path) is None
