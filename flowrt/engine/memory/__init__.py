"""Memory planned once at load and lent per run: lifetimes, arenas, pools."""
