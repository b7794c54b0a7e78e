"""Plain test helpers by what they serve: repo (where the project is), projects (copies that run `dvc`),
data, records (profile records and runs), servers. Fixtures live in tests/conftest.py."""
