"""Torch-free foundations: names, verdicts, advice, job identity."""
