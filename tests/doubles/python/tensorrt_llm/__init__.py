"""TEST DOUBLE of the tensorrt_llm package (TensorRT cannot exist in CI): only what pipeline.device.session_runner
uses."""
__version__ = "0.12.0"
