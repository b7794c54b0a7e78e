"""The profile stage's work: one batch size × device × mode timed (timing, statistics) and traced
(run, trace_analysis), the device's peak, the torch-free profile record the report reads, and the
markdown tables and files the stage writes.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
