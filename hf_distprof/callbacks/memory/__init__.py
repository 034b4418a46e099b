"""Memory: the logger, the deeper views, snapshot tools, allocator statistics."""
