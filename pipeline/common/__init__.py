"""Shared by every wing and stage: errors, output paths, atomic outputs and disk checks, the stage runner,
credentials, processes, CSV tables and what machine this is. Imports nothing else of the pipeline.

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
