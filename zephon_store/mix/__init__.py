"""Mixtures read as one source: :class:`~zephon_store.mix.mixed.MixedDataset` (the sources'
row groups concatenated) and its order, :class:`~zephon_store.mix.mixed.MixedOrder`.
Above ``read`` (it reads datasets), below ``load`` (whose plan reads a mixture by its
schedule)."""
