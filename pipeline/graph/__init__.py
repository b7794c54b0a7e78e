"""The export_graph stage's work: torch.export and ONNX programs, the graph picture, and what the run logs.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
