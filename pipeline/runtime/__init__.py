"""The engine runtimes as sessions the server, the device's golden check and the benchmarks share (session.py):
TensorRT-LLM 0.12's executor (trtllm.py), Edge-LLM 0.11's RequestEngine (edgellm.py); engines.SESSIONS by backend."""
