"""TEST DOUBLE of the tensorrt_llm package (TensorRT cannot exist in CI): only what pipeline.device.trtllm_runner
uses."""
__version__ = "0.12.0"
