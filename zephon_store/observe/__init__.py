"""What the loader saw and why it waited: causes, counters, the per-step account, the stall
forecast and the exporters (docs/observe.md). Nothing here imports torch or
prometheus_client at package import time."""
