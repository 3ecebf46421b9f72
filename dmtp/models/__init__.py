"""Models: the frozen target adapter and its caches, the native MTP head, the DFlash drafter (layers, DFlash2 backbone,
injection variants), the screened T1 head, and tiny same-format checkpoints for tests. Imports only `dmtp.io`."""
