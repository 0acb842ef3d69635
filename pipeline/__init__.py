"""jetson-trtllm-pipeline: recipe -> quantized checkpoint -> kit -> engine on a Jetson, reproducibly."""

__version__ = "0.1.0"
