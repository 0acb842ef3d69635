"""TEST DOUBLE of the tensorrt_edgellm wheel's runtime facade on a device (TensorRT cannot exist in CI): only
`tensorrt_edgellm.runtime.load()`, which pipeline.runtime.edgellm calls. On PYTHONPATH only for the device's
processes (tests/conftest.py device_command), never beside the real wheel the workstation's exporter uses."""
__version__ = "0.11.0"
