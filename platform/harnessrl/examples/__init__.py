"""Example corpora: small, reproducible agent logs in harnessrl's native JSONL format.

`harnessrl.examples.twx` generates TextWorldExpress episodes; the committed sample lives in
`data/` so tests and demos run without the game engine (or Java) installed.
"""
