"""The trial schema (pydantic), the one YAML loader, user errors, placement bundles."""
