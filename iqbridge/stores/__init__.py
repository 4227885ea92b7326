"""Side-index stores: where message states and the journal live."""
