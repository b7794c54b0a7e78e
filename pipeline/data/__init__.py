"""MNIST: download and verification (mnist), the IDX format, its MLflow datasets and TensorBoard samples
(artifacts), and the normalized device tensors every torch stage trains or profiles on (tensors).

Empty on purpose: importing a module of this wing imports nothing else (the torch-free stages rely on it).
"""
