"""Layer package: see docs/architecture.md."""
