"""Clean controls in real training loops: memory that moves without leaking (warm-ups,
plateaus, epoch-scoped accumulation, bounded caches, copy-on-write). A leak verdict on any of them
is a false alarm."""
