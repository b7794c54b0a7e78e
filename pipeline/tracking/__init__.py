"""MLflow and TensorBoard: the Tracker a stage logs through, store access (URI, health, stale runs), lineage
between runs and every MLflow tag name.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it). MLflow is
imported inside the functions that use it, here and in every wing: `import mlflow` costs seconds, which every
stage start and every test process would pay before its first line of work (docs/measurements.md).
"""
