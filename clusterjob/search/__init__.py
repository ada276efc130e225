"""A search (docs/design.md, "Search"), the whole feature in this package. What both sides
read of it: its record and folder (``record``), its study (``study``), the pruning rule
behind one call (``pruner``) and ASHA, its one rule (``asha``), and its trials as run
folders (``trials``). What drives it, a client of the executors above clusterjob.launch:
its slots as runs each executor starts (``slots``, their folders ``slotruns``), a slot's
task on this machine (``localslot``) and on Slurm (``slotdriver``), and the commands on it
(``commands``: submit, status, cancel, resume)."""
