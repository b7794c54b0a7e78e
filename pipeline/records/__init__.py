"""The profile record contract, below both its writer (pipeline.profiling) and its readers (pipeline.report,
pipeline.machines): the records and their files (`profile`), the quantities they hold (`quantities`), the interval
arithmetic on them (`statistics`), the roofs file (`roofs`) and the wording both sides print (`wording`). Torch-free."""
