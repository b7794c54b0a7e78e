"""`python -m pipeline.machines`: profile runs of many machines read from a tracking store (runs), grouped and
compared (compare), written as a report (report). Not a DVC stage: see the README.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
