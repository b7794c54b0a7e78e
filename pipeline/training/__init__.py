"""The train stage's work: the loop, the runtime it pins (device, precision, threads, seed), eager or CUDA-graph
execution, the step shared with the profile, and what the run logs.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
