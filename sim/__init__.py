"""The simulator: calibrated step-time models (`step_time`), the engine they price (`engine`), its
compiled mirrors (`kernels`), workloads (`workloads`), the method families (`families`) and the
entry points at this level (docs/architecture.md, "The simulator's packages")."""
