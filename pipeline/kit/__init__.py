"""Kits and engine bundles (both halves, standard library + an Ed25519 backend): pack, verify, unpack, transfer."""
