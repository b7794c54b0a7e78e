"""The class server: PostgreSQL-backed MLflow with accounts (`python -m pipeline.server`)."""
