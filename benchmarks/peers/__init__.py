"""Zephon side by side with its peers (LitData, MosaicML Streaming, HF datasets, raw
pyarrow): ``python -m benchmarks.peers.run`` (docs/benchmarks_peers.md)."""
