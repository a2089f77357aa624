"""Executing a suite: a run into a run directory (session), the runner that times every point
(in passes, resumable through the pass log), process isolation and memory caps, and the largest
length that fits a memory budget."""
