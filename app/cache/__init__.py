"""The vector cache: keys, the in-process LRU, the Redis tier and the read-through flow over both."""
