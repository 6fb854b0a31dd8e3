"""Workloads: plain request streams and reasoning-program workloads, and the program driver."""
