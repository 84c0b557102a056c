"""Graph passes the optimizer runs before assigning layers to backends.

Each pass takes the graph (and what it needs) and returns one line per change it made, for
the optimizer's report.
"""
