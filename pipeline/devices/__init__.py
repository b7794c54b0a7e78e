"""The device kinds a stage can run on: each defined once, in its own module here (`cpu.py`, `cuda.py`, `mps.py`),
as a `KIND` (a pipeline.devices.kind.DeviceKind), and found by pipeline.devices.registry. Every other part of the
pipeline asks the kind, never a device's name: a new kind is a new module in this folder (docs/extending.md)."""
