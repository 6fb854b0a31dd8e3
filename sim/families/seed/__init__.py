"""SEED (ToT with speculative drafts): the simulator's oracle, metrics and mode report."""
