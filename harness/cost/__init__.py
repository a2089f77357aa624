"""The shared cost formulas (:mod:`harness.cost.components`) that every scenario's cost model
adds up; each scenario's own model (FLOPs, bytes, predicted memory of its points) is in its
folder under :mod:`harness.scenarios`.
"""
