"""Analytic cost models: FLOPs, bytes moved and memory of every scenario (decode included)."""
