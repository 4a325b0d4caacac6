"""Scripts run as worker processes by the multi-worker tests (and their shared code)."""
