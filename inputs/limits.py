"""Every cap an input is checked against, in one place: counts that size allocations (requests,
programs, replicas, seeds, paths) and bounds past which a number describes nothing physical.

Each is checked where its input is parsed, before anything it sizes is drawn or allocated.
"""

INT32_MAX = 2**31 - 1
"""a count a table column of int32 holds"""
SEED_MAX = 2**63 - 1
"""the largest seed numpy's generators take whole"""

MAX_REQUESTS = 10_000_000
"""requests one synthetic or trace workload may hold (checked before arrivals are drawn)"""
MAX_PROGRAMS = 2_000_000
"""programs one workload may hold (checked before any is planned): a million self-consistency
programs (16.9M requests) peaked at 7.5 GB simulated, so two million fit this project's
24 GB machines and ten million would not"""
MAX_REPLICAS = 100_000
"""replicas in one simulation (a group's count; the sum is checked against it too)"""
MAX_SEEDS = 10_000
"""seeds a sweep or noise draws a band may take (each one a whole simulation)"""

MAX_PATHS = 1024
"""paths (samples, search solutions, rounds) one program's policy may launch"""
MAX_TOKENS = 10_000_000
"""tokens of one reasoning budget, probe interval or expected length"""
MAX_TREE = 64
"""breadth, thoughts per state, depth or drafted tokens of one tree search"""

MIN_RATE_PER_S = 1e-5
"""arrival rates below this put arrivals so far out (1e-300: at 1e300 s) that a request's
latency vanishes in the clock's float precision: latencies of 0"""
MAX_SIGMA = 4.0
"""a lognormal length's sigma beyond this is no length distribution (its mass sits at 1 token)"""
MAX_CV = 100.0
"""a gamma arrival's coefficient of variation beyond this has a shape that underflows"""
MIN_CV = 1e-3
"""below this a gamma arrival's shape (1/cv^2) overflows; its gaps are constant anyway"""
MAX_ARRIVAL_S = 1e12
"""an arrival later than this (30,000 years) leaves latencies below the clock's float
precision (0.1 ms there); the slowest synthetic arrivals stay inside it"""
MAX_COEF_MS = 1e6
"""a step-time coefficient beyond this (ms per token, sequence or step) is no measurement"""
MAX_LOG_RESIDUAL = 10.0
"""log residuals beyond this are no residual of a fitted step time"""
