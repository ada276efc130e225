"""A search (docs/design.md, "Search"): what both sides read of it. Its record and folder
(``record``), its study (``study``), the pruning rule behind one call (``pruner``) and
ASHA, its one rule (``asha``), and its trials as run folders (``trials``). How each
executor runs its slots, and the commands on it, are clusterjob.launch's
(``searchslots``, ``searcharray``, ``searchslot``, ``searchcmd``)."""
