"""tomllib on Python >= 3.11, tomli on JetPack 6's Python 3.10."""

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on the device's Python 3.10
    import tomli as tomllib

TOMLDecodeError = tomllib.TOMLDecodeError


def load_toml(path):
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def load_toml_text(text: str):
    return tomllib.loads(text)
