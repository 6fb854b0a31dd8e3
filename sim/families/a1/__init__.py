"""A1: the simulator's oracle, metrics, offline analysis and report."""
