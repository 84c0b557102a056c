"""Loading: what turns an optimized graph into what the scheduler runs. It sits above the
graph and the scheduler, so that the scheduler never reads a graph."""
