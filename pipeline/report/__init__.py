"""The report stage's work: the lab report from the workspace's records, its comparison and step analysis,
figures, and its HTML, TensorBoard and MLflow renderings. Torch-free.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
