"""Backends and the workers that run their workloads."""
