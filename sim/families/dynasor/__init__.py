"""Dynasor: counterfactual early stopping on probes and search traces, online sweeps."""
