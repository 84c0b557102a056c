"""The dataflow of workloads and the trio executor that runs it."""
