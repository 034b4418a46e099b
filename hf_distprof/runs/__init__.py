"""Whole runs as data: read a run folder, compare two runs, and the maths of a scaling study.

``load`` reads the files the callbacks wrote; ``stats`` decides when a difference is beyond a run's own
noise; ``compare`` and ``scaling`` are pure functions over loaded runs; ``compare_report`` and
``scaling_report`` write what the ``hf-distprof compare`` / ``scaling`` commands show. No transformers import.
"""
