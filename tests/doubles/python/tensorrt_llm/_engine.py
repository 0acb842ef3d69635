"""TEST DOUBLE helper: the "engine" the trtllm-build double wrote (rank0.engine holds the checkpoint's weights), read
by the pipeline's independent reader. Shared by the ModelRunnerCpp and Executor doubles."""
import json
import os
import shutil
import tempfile
from pathlib import Path

from pipeline.workstation.reader import CheckpointModel


def load_engine_model(engine_dir):
    engine = json.loads((Path(engine_dir) / "config.json").read_text())
    tmp = Path(tempfile.mkdtemp(prefix="engine-view-"))
    try:
        (tmp / "config.json").write_text(json.dumps(engine["pretrained_config"]))
        os.symlink(Path(engine_dir).absolute() / "rank0.engine", tmp / "rank0.safetensors")
        model = CheckpointModel(tmp)     # reads the config and maps the weights: the view is not needed after
    finally:
        shutil.rmtree(tmp)
    return model, engine["build_config"]
