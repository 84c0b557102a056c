"""CPU backends: CpuRef (numpy reference) and CpuAcc (numba, windowed)."""
