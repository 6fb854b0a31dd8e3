"""The method families' simulator parts: Dynasor, A1, SEED, HELIOS."""
