"""Measurement primitives: devices and their memory counters, timing and calibration, the
environment record, NVML, contention and the reference kernel, timing-pass statistics."""
