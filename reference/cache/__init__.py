"""KV pages: the allocator and the prefix caches (naive, radix)."""
