"""params.yaml: its typed schema, the strict parser, the memory estimates that refuse what cannot fit, and the
validate stage's work. Torch-free.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
