"""Torch-free foundations under every other part of the package (it imports nothing above it): output file names,
the verdicts and their statistics, run comparison, the profiler's slowdown, memory growth, advice, job identity,
argument types, text tables, clock offsets, library versions, atomic files and deferred signals."""
