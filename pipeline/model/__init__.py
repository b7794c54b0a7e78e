"""The lab CNN (network), its per-layer summary, and the checkpoint file that carries it between stages.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
