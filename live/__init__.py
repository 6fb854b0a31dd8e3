"""Live runs: program objects (`programs/`) driven on real engines, recorded in the trace schema.

Imports programs, policies, traces and tracers (engines, recorder); never `sim`.
"""
