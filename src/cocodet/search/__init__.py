"""Sweeps that search: the figure a run returns, and the study a sweep keeps (design §15)."""
