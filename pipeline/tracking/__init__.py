"""MLflow and TensorBoard: the Tracker a stage logs through, store access (URI, health, stale runs), lineage
between runs and every MLflow tag name.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
