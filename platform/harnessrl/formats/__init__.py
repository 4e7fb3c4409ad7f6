"""Readers that turn a source format's records into episode and step rows (DESIGN §4)."""
