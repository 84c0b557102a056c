"""CPU backends: CpuRef (numpy reference)."""
