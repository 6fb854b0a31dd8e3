"""The simulated engine: a replica's scheduling, KV blocks, prefix cache, request state, the cluster harness."""
