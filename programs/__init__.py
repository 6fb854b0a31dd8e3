"""Reasoning programs as engine-free state machines, driven alike by the simulator and live runner.

A program answers one question by sending requests and reacting to their outcomes:
`start() -> [action]`, `on_done(spec, outcome) -> [action]`, where an action is a `RequestSpec`
to send or an `Abort` of one in flight, and `done` turns true when the program has answered.
`sim.workloads.program_driver` answers outcomes from a trace through the cluster model's timing,
`live.runner` from a real engine. Programs import only `policies` and `traces`.
"""
