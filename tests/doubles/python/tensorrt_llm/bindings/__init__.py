"""TEST DOUBLE of tensorrt_llm.bindings: only the executor module (executor.py)."""
