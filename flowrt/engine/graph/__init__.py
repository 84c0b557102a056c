"""Networks, layer kinds, shape inference, subgraph views and the optimizer."""
