"""Engines beneath the tracers and the live runner: vLLM in-process and over HTTP, the PyTorch engine, the per-iteration recorder, the speed probe, the local server, the steady heap."""
