"""The lab pipeline as a library, in wings: one subpackage per stage or concern (see the README's map).

Empty on purpose, as every __init__.py here: importing one module imports nothing else.
"""
