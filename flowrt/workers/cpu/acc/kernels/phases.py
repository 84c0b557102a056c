"""Moved to ``flowrt.workers.cpu.acc.phases`` (a primitive shared by the conv algorithms and
the pools, not a registered kernel). This name stays until ``pooling.py`` and
``stacked_pooling.py`` import it from there; then it goes."""

from flowrt.workers.cpu.acc.phases import as_words, cell_offset, copy_run, fill_phase_planes, split_pairs

__all__ = ["as_words", "cell_offset", "copy_run", "fill_phase_planes", "split_pairs"]
