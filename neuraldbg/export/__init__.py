"""Exporters: Mermaid graphs, text reports and JSON traces. Pure functions, except ``trace.write``."""
