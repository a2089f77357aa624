"""Analytic cost models: FLOPs, bytes moved and memory of every scenario (decode included).

``costmodel`` answers per point (attention, block, decode); ``decode`` is the decode model,
``cache`` the KV-cache size, ``components`` the block's parts both build on, and ``checksize``
how far the ``auto`` agreement check goes (it sets the check's memory).
"""
