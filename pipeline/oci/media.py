"""Media types and annotation keys of a kit as an OCI artifact: the writer (push) and the reader (pull) share them.

ModelPack (CNCF model-spec) names the artifact, config and layer types; the OCI image spec the manifest, the index
and the `org.opencontainers.image.*` keys; `org.jetson-pipeline.*` are ours (what a fleet tool or a registry UI
shows without downloading the kit: recipe, target, SM, JetPack, backend, versions, kit digest, signer).
"""

from __future__ import annotations

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"       # OCI 1.1's empty descriptor: a config with nothing to say
EMPTY_CONFIG = b"{}"
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT_RAW = "application/vnd.cncf.model.weight.v1.raw"              # a payload part, as it is on disk
WEIGHT_CONFIG_RAW = "application/vnd.cncf.model.weight.config.v1.raw"  # MANIFEST.json, SHA256SUMS, its signature

FILEPATH = "org.cncf.model.filepath"        # a layer's file name in the kit directory
TITLE = "org.opencontainers.image.title"    # the kit's name
CREATED = "org.opencontainers.image.created"
REF_NAME = "org.opencontainers.image.ref.name"      # a tag, in an image layout's index.json

PREFIX = "org.jetson-pipeline."
KIND = PREFIX + "kind"                      # kit | bundle
RECIPE = PREFIX + "recipe"
TARGET = PREFIX + "target"
SM = PREFIX + "sm"
JETPACK = PREFIX + "jetpack"
TENSORRT = PREFIX + "tensorrt"
BACKEND = PREFIX + "backend"
BACKEND_VERSION = PREFIX + "backend-version"
BOARD = PREFIX + "board"                    # a bundle's: the board model that built it
KIT_SHA256 = PREFIX + "manifest-sha256"     # sha256 of the kit's MANIFEST.json (signed through SHA256SUMS)
SIGNER = PREFIX + "signer"                  # the minisign key id that signed SHA256SUMS

MAX_MANIFEST = 4 * 2**20        # a kit of a thousand 4 GiB parts has a manifest of ~300 KB
