"""Command-line argument types shared by the subcommands' parsers (argparse names the flag in its error)."""

from __future__ import annotations

import argparse


def int_at_least(minimum: int, expected: str):
    """An argparse type: an integer >= minimum (argparse names the flag in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


positive_int = int_at_least(1, "a positive integer")
non_negative_int = int_at_least(0, "a whole number")
