"""The engine: graphs and their optimizer, memory, and the scheduler."""
