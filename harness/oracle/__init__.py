"""Correctness: the float64 reference with the same mask, and the agreement rule with its
one tolerance table."""
