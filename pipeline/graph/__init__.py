"""The workstation's graph: the stage framework, each stage's spec and action, the doit tasks, remote builders."""
