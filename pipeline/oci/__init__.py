"""Kits and engine bundles through OCI registries and OCI image layouts (`push`, `pull`).

A kit directory maps onto one OCI artifact (CNCF ModelPack style): each of its files is one layer, stored as it is
(`application/vnd.cncf.model.weight.v1.raw` for the payload parts, `...weight.config.v1.raw` for MANIFEST.json,
SHA256SUMS and its signature), named by the `org.cncf.model.filepath` annotation. The layer digests are sha256 of
the files, so the kit's signed SHA256SUMS pins every layer: a registry or a stick cannot swap a blob, lie about a
digest or a size, or add a file without `pull` noticing before it keeps a byte. Parts that did not change between
two versions of a kit have the same digest, so registries store and send them once.

    refs.py       oci://HOST[:PORT]/REPO[:TAG][@sha256:...] and oci-layout:DIR[:TAG]
    media.py      media types and annotation keys (one place, both directions)
    artifact.py   a verified kit -> manifest + config; a fetched manifest -> typed, checked layers
    layout.py     an OCI image layout directory (a stick, an air-gapped mirror)
    registry.py   an OCI-distribution registry, through oras-py (auth, docker config, URLs)
    transfer.py   push and pull: resumable, bounded, verified before anything lands in DEST
    command.py    the `push` and `pull` CLI
"""
