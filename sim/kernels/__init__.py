"""Compiled fast paths (numba), each equal to the SimPy engine it mirrors."""
