"""The profiler window: the callback, capture on demand and on anomaly, the triggers, the window policy, rank
targeting, the trace budget, the compact export and the run manifest."""
