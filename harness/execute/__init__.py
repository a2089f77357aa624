"""Executing a suite: the runner that times every point (in passes, resumable), process
isolation and memory caps, and the largest length that fits a memory budget."""
