"""Trace analysis: trace I/O -> parsed events -> pure analyzers -> report. Never imports transformers."""
