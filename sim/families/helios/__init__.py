"""HELIOS: early-exit serving from exits traces, its config, what-ifs and report."""
