"""TEST DOUBLE of tensorrt_llm.logger: the level the runtime logs at (INFO shows the KV cache allocation)."""
import os


class Logger:
    def set_level(self, level: str) -> None:
        os.environ["TLLM_LOG_LEVEL"] = level.upper()

    @property
    def info_enabled(self) -> bool:
        return os.environ.get("TLLM_LOG_LEVEL", "WARNING").upper() in ("INFO", "VERBOSE", "DEBUG")


logger = Logger()
