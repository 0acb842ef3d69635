"""The device half (JetPack 6's Python 3.10, no torch): probe, gate, engine build, runners, report, driver."""
