"""Validation as a library: the simulator judged against live runs of the same workload.

Above the simulator, the tracers and the live runner, beneath the command line: `judge`
(simulated vs live tables, device and step-speed checks, verdicts), `replay` (a simulate config
served live on vLLM), `fidelity` (the whole loop on this machine: trace, calibrate, simulate,
replay a suite, judge; `fidelity_report` renders it), and each family's comparison (`a1`,
`seed`, `helios`).
"""
