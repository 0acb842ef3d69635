"""The workstation half (x86, torch): fetch, calibrate, export, independent reader, goldens and accuracy."""
