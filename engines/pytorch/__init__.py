"""The project's PyTorch engine (Llama, Qwen2): slot KV cache, exits, loaded depth, layer skipping, speculative verification, timed layers."""
